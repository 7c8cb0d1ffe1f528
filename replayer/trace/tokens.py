"""Token-id synthesis for ``blocks`` payloads, and the text token approximation.

A ``blocks`` request names its prompt by content-block hash ids (Mooncake,
kv-cache-tester). The token ids of a block are a pure function of
``(salt, block_id, block_size, token range)``, so two requests that share a
hash id share identical tokens and a server's prefix cache hits exactly where
the recorded one did. Tokens past the last block (kv-cache-tester's ``in % 64``
tail, Azure's whole prompt) are unique to the request: they are drawn from the
request id. A partial last block (Mooncake) is the prefix of its full block.

Hash ids may be scoped by a namespace (kv-cache-tester ids are local to one
trace): the block key is ``"{id}"`` for global ids and ``"{ns}:{id}"`` within
namespace ``ns``. The construction is documented so that a bundle's
stdlib-only ``repro.py`` can regenerate the same ids: the block's bytes are
``shake_128(f"{salt}:{key}:{block_size}")`` read as little-endian uint32, each
mapped to ``lo + v % (hi - lo)``; tail tokens use ``f"{salt}:tail:{request_id}"``.

The default range [10000, 32000) fits every common vocabulary (32K and up),
avoids the low ids where special tokens live, and makes every id exactly five
digits long, which lets the writer size a body without generating it.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
import operator
import struct
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

DEFAULT_TOKEN_RANGE: tuple[int, int] = (10_000, 32_000)
DEFAULT_SALT = "replayer"


def _draw(seed: str, n: int, lo: int, hi: int) -> list[int]:
    """The documented derivation, one id at a time (the reference the fast
    path is tested against, and what a stdlib ``repro.py`` does)."""
    span = hi - lo
    raw = hashlib.shake_128(seed.encode()).digest(4 * n)
    return [lo + v % span for v in struct.unpack(f"<{n}I", raw)]


@dataclass(frozen=True, slots=True)
class TokenSpace:
    """Where synthesized token ids come from; part of a trace's metadata and
    overridable at replay time (``--token-range``) to fit a model's vocabulary."""

    lo: int = DEFAULT_TOKEN_RANGE[0]
    """Smallest token id drawn (inclusive)."""
    hi: int = DEFAULT_TOKEN_RANGE[1]
    """Largest token id drawn (exclusive)."""
    salt: str = DEFAULT_SALT
    """Mixed into every seed; two traces with different salts share no blocks."""

    def __post_init__(self) -> None:
        if not 0 <= self.lo < self.hi:
            raise ValueError(f"token range [{self.lo}, {self.hi}) is empty or negative")

    def seed(self, block_id: int, block_size: int, ns: str | None = None) -> bytes:
        key = f"{ns}:{block_id}" if ns else str(block_id)
        return f"{self.salt}:{key}:{block_size}".encode()

    def block(self, block_id: int, block_size: int, ns: str | None = None) -> list[int]:
        return self._ids(self.seed(block_id, block_size, ns), block_size).tolist()  # type: ignore[no-any-return]

    def tail(self, request_id: str, n: int) -> list[int]:
        if n <= 0:
            return []
        return self._ids(f"{self.salt}:tail:{request_id}".encode(), n).tolist()  # type: ignore[no-any-return]

    def _ids(self, seed: bytes, n: int) -> npt.NDArray[np.uint64]:
        return _offsets(hashlib.shake_128(seed).digest(4 * n), self.hi - self.lo).astype(
            np.uint64
        ) + np.uint64(self.lo)

    @property
    def fixed_width(self) -> int | None:
        """Digits of every id when the range has one width, else None."""
        w = len(str(self.lo))
        return w if len(str(self.hi - 1)) == w else None


def _offsets(raw: bytes, span: int) -> npt.NDArray[np.intp]:
    """``v % span`` of each little-endian uint32 of ``raw`` (an id less
    ``lo``), as the index type the digit table is gathered with."""
    v = np.frombuffer(raw, dtype="<u4")
    if span < 1 << 32:
        return (v % np.uint32(span)).astype(np.intp)
    return v.astype(np.intp)


class _Digits:
    """Token ids to their JSON text at C speed: one row of ASCII digits per id
    of the range (with its comma), gathered by index. A range too wide for a
    table (over 1M ids) computes digits arithmetically instead."""

    TABLE_MAX = 1 << 20

    def __init__(self, space: TokenSpace) -> None:
        self.space = space
        self.width = len(str(space.hi - 1))
        self.fixed = space.fixed_width is not None
        span = space.hi - space.lo
        self._table: npt.NDArray[np.uint8] | None = None
        self._lens: npt.NDArray[np.int64] | None = None
        if span <= self.TABLE_MAX:
            vals = np.arange(space.lo, space.hi, dtype=np.uint64)
            self._table = self._rows(vals)
            self._lens = self._widths(vals)

    def _rows(self, vals: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint8]:
        w = self.width
        rows = np.empty((len(vals), w + 1), dtype=np.uint8)
        rows[:, w] = ord(",")
        x = vals.copy()
        for j in range(w - 1, -1, -1):
            rows[:, j] = x % np.uint64(10) + np.uint64(48)
            x //= np.uint64(10)
        return rows

    def _widths(self, vals: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        nd = np.ones(len(vals), dtype=np.int64)
        p = 10
        for _ in range(self.width - 1):
            nd += vals >= np.uint64(p)
            p *= 10
        return nd + 1  # with its comma

    def text(self, off: npt.NDArray[np.intp]) -> tuple[bytes, npt.NDArray[np.int64] | None]:
        """The ids ``lo + off`` as ``"a,b,...,z,"`` (a comma after every id) and,
        when widths vary, each id's byte length with its comma."""
        if self._table is not None and self._lens is not None:
            rows = self._table.take(off, axis=0)
            lens = None if self.fixed else self._lens.take(off)
        else:
            ids = off.astype(np.uint64) + np.uint64(self.space.lo)
            rows = self._rows(ids)
            lens = None if self.fixed else self._widths(ids)
        if lens is None:
            return rows.tobytes(), None
        keep = np.arange(self.width + 1) >= (self.width + 1 - lens)[:, None]
        return rows[keep].tobytes(), lens


@dataclass(slots=True)
class _Prompt:
    """A recently built prompt: its whole blocks' ids (int64 bytes, for a
    memcmp common-prefix search), the bytes it was built into (a whole
    request body, the array at ``base``), and where each whole block's text
    ends, counted from the array's ``[`` (int64: a Python list of them cost
    five times the bytes, ~50 MB over a full prompt cache)."""

    ids: bytes
    text: bytes
    ends: npt.NDArray[np.int64]
    base: int = 0

    @property
    def size(self) -> int:
        return len(self.text) + len(self.ids) + self.ends.nbytes


PromptKey = tuple[str | None, int, int]
"""What a prompt is filed under: (namespace, block size, first block id)."""


class _PromptCache:
    """The prompts kept for reuse, found by key, bounded by their bytes.

    A replay knows its schedule, so a planned key (:meth:`expect`) leaves in
    the order an optimal cache would choose: the key whose next planned
    build is farthest goes first (its oldest prompt first), and a key with
    no planned build left goes at once. When more sessions are live than
    the bound holds, an LRU drops each session's prompt shortly before its
    next turn (they come round in a cycle); this keeps a fixed part of them
    (the kv-cache-tester corpus at a 384 MB bound, four prompts a key: 1.13M
    blocks drawn again instead of an LRU's 1.42M). Prompts of keys nobody
    planned (a trace read in order) leave first, oldest first."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap = cap_bytes
        self.size = 0
        self._filed: OrderedDict[int, tuple[PromptKey, _Prompt]] = OrderedDict()
        self._by_key: dict[PromptKey, list[int]] = {}  # newest first
        self._pending: dict[PromptKey, list[int]] = {}  # planned positions, descending
        self._heap: list[tuple[int, int, PromptKey]] = []  # (-next position, tie, key)
        self._unplanned: OrderedDict[int, None] = OrderedDict()
        self._width: dict[PromptKey, int] = {}  # prompts kept per planned key
        self._serial = 0

    def __len__(self) -> int:
        return len(self._filed)

    def candidates(self, key: PromptKey) -> list[tuple[int, _Prompt]]:
        return [(s, self._filed[s][1]) for s in self._by_key.get(key, ())]

    def put(self, key: PromptKey, prompt: _Prompt, *, used: int | None, replace: bool) -> None:
        """File ``prompt``; ``used`` is the candidate it was built from,
        dropped when ``replace`` (the new prompt extends all of it)."""
        if replace and used is not None and used in self._filed:
            self._remove(used)
        if prompt.size > self.cap:
            return
        self._serial += 1
        serial = self._serial
        self._filed[serial] = (key, prompt)
        self.size += prompt.size
        keyed = self._by_key.setdefault(key, [])
        keyed.insert(0, serial)
        if key in self._pending:
            self._push(key)
        else:
            self._unplanned[serial] = None
        if len(keyed) > self._width.get(key, PROMPTS_PER_KEY):
            self._remove(keyed[-1])
        for _ in range(len(self._filed)):
            if self.size <= self.cap:
                break
            self._evict()

    def _evict(self) -> None:
        while self._unplanned:
            serial, _ = self._unplanned.popitem(last=False)
            if serial in self._filed and self._filed[serial][0] not in self._pending:
                self._remove(serial)
                return
        heap = self._heap
        while heap:
            neg, _, key = heap[0]
            pending = self._pending.get(key)
            if key not in self._by_key or not pending or pending[-1] != -neg:
                heapq.heappop(heap)  # stale: the key moved on, or left
                continue
            self._remove(self._by_key[key][-1])
            return
        self._remove(next(iter(self._filed)))  # planned keys no longer cached: cannot happen

    def _push(self, key: PromptKey) -> None:
        self._serial += 1
        heapq.heappush(self._heap, (-self._pending[key][-1], self._serial, key))
        if len(self._heap) > 4 * len(self._by_key) + 1024:  # drop the stale entries
            live = [k for k in self._by_key if k in self._pending]
            self._heap = [(-self._pending[k][-1], self._serial + i, k) for i, k in enumerate(live)]
            self._serial += len(live)  # ties stay unique: keys never compare (None vs str)
            heapq.heapify(self._heap)

    def _remove(self, serial: int) -> None:
        key, prompt = self._filed.pop(serial)
        self._unplanned.pop(serial, None)
        self.size -= prompt.size
        keyed = self._by_key[key]
        keyed.remove(serial)
        if not keyed:
            del self._by_key[key]

    def drop(self, key: PromptKey) -> None:
        for serial in list(self._by_key.get(key, ())):
            self._remove(serial)

    def expect(
        self,
        planned: Iterable[tuple[PromptKey, int]],
        n: int = 1,
        sessions: Mapping[PromptKey, int] | None = None,
    ) -> None:
        """Builds planned at positions of a schedule; ``n = -1`` takes back
        those that will not happen (a replay that stopped early).
        ``sessions``: how many sessions build under each key; a key only one
        session builds under keeps one prompt, its latest (a compaction's
        cut-short fork off an older one would never be extended again)."""
        by_key: dict[PromptKey, list[int]] = {}
        for key, pos in planned:
            by_key.setdefault(key, []).append(pos)
        for key, got in by_key.items():
            have = self._pending.get(key, [])
            if n > 0:
                have = sorted(have + got, reverse=True)
                if sessions is not None:
                    width = min(PROMPTS_PER_KEY, max(1, sessions.get(key, PROMPTS_PER_KEY)))
                    self._width[key] = max(width, self._width.get(key, 0))
            else:
                for pos in got:
                    self._take(have, pos)
            if have:
                self._pending[key] = have
                if key in self._by_key:
                    self._push(key)
            else:
                self._pending.pop(key, None)
                self._width.pop(key, None)

    def built(self, key: PromptKey, pos: int) -> None:
        """The build planned at ``pos`` happened: after a key's last, its
        prompts go (nothing planned will extend them)."""
        have = self._pending.get(key)
        if have is None:
            return
        self._take(have, pos)
        if have:
            if key in self._by_key:
                self._push(key)
        else:
            del self._pending[key]
            self._width.pop(key, None)
            self.drop(key)

    @staticmethod
    def _take(have: list[int], pos: int) -> None:
        """Remove one ``pos`` from a descending list (the last, as a replay builds in order)."""
        if have and have[-1] == pos:
            have.pop()
            return
        i = bisect.bisect_left(have, -pos, key=operator.neg)
        if i < len(have) and have[i] == pos:
            del have[i]


PROMPTS_PER_KEY = 4
"""Prompts kept per key: a session and the sub-agents that share its start
each find their own last turn."""


class BlockPrompts:
    """Builds token-id prompts (as lists or as JSON text) at memory speed.

    Agent sessions re-send their whole context each turn, so a prompt is
    assembled from the text of the longest kept prompt it extends (a memcmp
    common-prefix search among those with the same first block) and of the
    blocks it adds, drawn in one vectorized batch. The prompts kept are
    bounded by ``cache_bytes`` (their text, ids and block ends); a replay
    tells which it will build again, and when (:meth:`expect`). The bytes
    are exactly the documented derivation's (tests/trace/test_golden_bodies.py)."""

    def __init__(self, space: TokenSpace | None = None, cache_bytes: int = 512 << 20) -> None:
        self.space = space or TokenSpace()
        self.cache_bytes = cache_bytes
        self._digits = _Digits(self.space)
        self._prompts = _PromptCache(cache_bytes)
        self.stats = {"reused_blocks": 0, "drawn_blocks": 0}
        """Where each full block's text came from (for the bench and --verbose)."""

    def expect(
        self,
        planned: Iterable[tuple[PromptKey, int]],
        n: int = 1,
        sessions: Mapping[PromptKey, int] | None = None,
    ) -> None:
        """Builds planned under keys (see :meth:`Trace.prompt_keys`) at
        positions of a schedule, and how many sessions build under each key:
        the cache keeps what is built again soonest. ``n = -1`` takes back
        those that will not happen."""
        self._prompts.expect(planned, n, sessions)

    def built(self, key: PromptKey, pos: int) -> None:
        """The build planned under ``key`` at ``pos`` happened."""
        self._prompts.built(key, pos)

    def tokens(
        self,
        block_ids: Sequence[int],
        block_size: int,
        input_tokens: int,
        request_id: str,
        ns: str | None = None,
    ) -> list[int]:
        full, part = divmod(input_tokens, block_size)
        out: list[int] = []
        for b in block_ids[:full]:
            out.extend(self.space.block(b, block_size, ns))
        if len(block_ids) > full and part:
            out.extend(self.space.block(block_ids[full], block_size, ns)[:part])
        return out + self.space.tail(request_id, input_tokens - len(out))

    def _offsets(self, raw: bytes) -> npt.NDArray[np.intp]:
        return _offsets(raw, self.space.hi - self.space.lo)

    def json(
        self,
        block_ids: Sequence[int],
        block_size: int,
        input_tokens: int,
        request_id: str,
        ns: str | None = None,
    ) -> str:
        """The prompt as a JSON array text, equal to ``orjson.dumps(tokens(...))``."""
        return self.json_bytes(block_ids, block_size, input_tokens, request_id, ns).decode()

    def json_bytes(
        self,
        block_ids: Sequence[int],
        block_size: int,
        input_tokens: int,
        request_id: str,
        ns: str | None = None,
        *,
        prefix: bytes = b"",
        suffix: bytes = b"",
    ) -> bytes:
        """:meth:`json` as bytes, between ``prefix`` and ``suffix`` (the rest
        of a request body): assembled in one copy from the prompt it extends,
        the blocks it adds, its partial last block and its tail. The result
        is kept as the text later turns extend: a body built ahead and the
        cache share one copy."""
        full, part = divmod(input_tokens, block_size)
        nfull = min(len(block_ids), full)
        pieces: list[bytes | memoryview] = [prefix, b"["]
        ends: npt.NDArray[np.int64] = np.empty(0, np.int64)
        whole = block_ids[:nfull]
        ids, key, best, used, k = b"", None, None, None, 0
        if nfull:
            ids = array("q", whole).tobytes()
            key = (ns, block_size, whole[0])
            for serial, c in self._prompts.candidates(key):
                m = _common_blocks(ids, c.ids)
                if m > k:
                    k, best, used = m, c, serial
            self.stats["reused_blocks"] += k
            self.stats["drawn_blocks"] += nfull - k
            pos = 1
            parts: list[npt.NDArray[np.int64]] = []
            if best is not None:
                pos = int(best.ends[k - 1])
                pieces.append(memoryview(best.text)[best.base + 1 : best.base + pos])
                parts.append(best.ends[:k])
            if k < nfull:
                new, new_ends = self._draw_blocks(whole[k:], block_size, ns)
                if k:
                    pieces.append(b",")
                    pos += 1
                pieces.append(new)
                parts.append(new_ends + pos)
            ends = np.concatenate(parts)  # a copy: no view keeps an old prompt's array
        rest: list[bytes | memoryview] = []
        if len(block_ids) > full and part:
            raw = hashlib.shake_128(self.space.seed(block_ids[full], block_size, ns)).digest(
                4 * block_size
            )
            rest.append(self._digits.text(self._offsets(raw[: 4 * part]))[0])
        n = nfull * block_size + (part if rest else 0)
        if input_tokens > n:
            seed = f"{self.space.salt}:tail:{request_id}".encode()
            raw = hashlib.shake_128(seed).digest(4 * (input_tokens - n))
            rest.append(self._digits.text(self._offsets(raw))[0])
        if rest:
            rest[-1] = memoryview(rest[-1])[:-1]  # no comma after the last id
            if nfull:
                pieces.append(b",")
            pieces += rest
        pieces += (b"]", suffix)
        out = b"".join(pieces)
        if key is not None:
            # A prompt that extends all of the one it was built from replaces
            # it; one that stops short of it (or forks off it) is kept beside it.
            replace = best is not None and 8 * k == len(best.ids)
            self._prompts.put(key, _Prompt(ids, out, ends, len(prefix)), used=used, replace=replace)
        return out

    def _draw_blocks(
        self, block_ids: Sequence[int], block_size: int, ns: str | None
    ) -> tuple[bytes, npt.NDArray[np.int64]]:
        """The text of whole blocks drawn in one vectorized batch, and where
        each block's text ends (exclusive of the comma after it)."""
        space = self.space
        pre = (f"{space.salt}:{ns}:" if ns else f"{space.salt}:").encode()
        suf = b":%d" % block_size
        nbytes = 4 * block_size
        shake = hashlib.shake_128
        raw = b"".join([shake(b"%b%d%b" % (pre, b, suf)).digest(nbytes) for b in block_ids])
        text, lens = self._digits.text(self._offsets(raw))
        if lens is None:
            step = len(text) // len(block_ids)
            ends = np.arange(step - 1, len(text), step, dtype=np.int64)
        else:
            ends = np.cumsum(lens, dtype=np.int64)[block_size - 1 :: block_size] - 1
        return text[:-1], ends

    def json_len(self, input_tokens: int) -> int | None:
        """Length of :meth:`json` without building it, when ids have one width."""
        w = self.space.fixed_width
        if w is None:
            return None
        return 2 + w * input_tokens + max(input_tokens - 1, 0)


def _common_blocks(a: bytes, b: bytes) -> int:
    """How many leading int64 block ids two id strings share (memcmp bisection)."""
    n = min(len(a), len(b)) // 8
    if a[: 8 * n] == b[: 8 * n]:
        return n
    lo, hi = 0, n  # a[:8*lo] equal, a[:8*hi] not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[: 8 * mid] == b[: 8 * mid]:
            lo = mid
        else:
            hi = mid
    return lo


def approx_text_tokens(text: str) -> int:
    """The documented text approximation: one token per four UTF-8 bytes."""
    return math.ceil(len(text.encode()) / 4)


def approx_message_tokens(message: Mapping[str, object]) -> int:
    """Tokens of one chat message: its text parts, tool-call names and
    arguments at four bytes a token, plus four for the role and framing."""
    n = 4
    content = message.get("content")
    if isinstance(content, str):
        n += approx_text_tokens(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                n += approx_text_tokens(part["text"])
    for call in message.get("tool_calls") or []:  # type: ignore[attr-defined]
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            n += approx_text_tokens(str(fn.get("name", ""))) + approx_text_tokens(
                str(fn.get("arguments", ""))
            )
    return n


_OPAQUE = frozenset(
    {"type", "role", "id", "call_id", "tool_use_id", "signature", "encrypted_content", "status"}
)
"""Keys of Messages blocks and Responses items whose values are framing or
opaque state, not prompt text."""


def approx_item_tokens(item: object) -> int:
    """Tokens of one Messages message or Responses input item: every string
    it holds (text, thinking, tool input and arguments, tool results), at
    four bytes a token, plus four for the role and framing."""
    n = 4
    stack: list[object] = [item]
    for _ in range(100_000):  # bounded: items are trees of modest size
        if not stack:
            break
        v = stack.pop()
        if isinstance(v, str):
            n += approx_text_tokens(v)
        elif isinstance(v, dict):
            stack.extend(x for k, x in v.items() if k not in _OPAQUE and k != "cache_control")
        elif isinstance(v, list):
            stack.extend(v)
    return n
