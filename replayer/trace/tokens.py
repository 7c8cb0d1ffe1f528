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

import hashlib
import math
import struct
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_TOKEN_RANGE: tuple[int, int] = (10_000, 32_000)
DEFAULT_SALT = "replayer"


def _draw(seed: str, n: int, lo: int, hi: int) -> list[int]:
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

    def block(self, block_id: int, block_size: int, ns: str | None = None) -> list[int]:
        key = f"{ns}:{block_id}" if ns else str(block_id)
        return _draw(f"{self.salt}:{key}:{block_size}", block_size, self.lo, self.hi)

    def tail(self, request_id: str, n: int) -> list[int]:
        return _draw(f"{self.salt}:tail:{request_id}", n, self.lo, self.hi) if n > 0 else []

    @property
    def fixed_width(self) -> int | None:
        """Digits of every id when the range has one width, else None."""
        w = len(str(self.lo))
        return w if len(str(self.hi - 1)) == w else None


class BlockPrompts:
    """Builds token-id prompts (as lists or as JSON text) with an LRU of block
    JSON fragments: agent sessions re-send the same blocks on every turn, so
    each block is drawn once and its ``"12345,23456,..."`` text is reused."""

    def __init__(self, space: TokenSpace | None = None, cache_blocks: int = 65_536) -> None:
        self.space = space or TokenSpace()
        self._cache: OrderedDict[tuple[str | None, int, int], str] = OrderedDict()
        self._cap = cache_blocks

    def _block_json(self, block_id: int, block_size: int, ns: str | None) -> str:
        key = (ns, block_id, block_size)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        text = ",".join(map(str, self.space.block(block_id, block_size, ns)))
        self._cache[key] = text
        if len(self._cache) > self._cap:
            self._cache.popitem(last=False)
        return text

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

    def json(
        self,
        block_ids: Sequence[int],
        block_size: int,
        input_tokens: int,
        request_id: str,
        ns: str | None = None,
    ) -> str:
        """The prompt as a JSON array text, equal to ``orjson.dumps(tokens(...))``."""
        full, part = divmod(input_tokens, block_size)
        pieces = [self._block_json(b, block_size, ns) for b in block_ids[:full]]
        n = min(len(block_ids), full) * block_size
        if len(block_ids) > full and part:
            last = self.space.block(block_ids[full], block_size, ns)[:part]
            pieces.append(",".join(map(str, last)))
            n += part
        if input_tokens > n:
            pieces.append(",".join(map(str, self.space.tail(request_id, input_tokens - n))))
        return "[" + ",".join(pieces) + "]"

    def json_len(self, input_tokens: int) -> int | None:
        """Length of :meth:`json` without building it, when ids have one width."""
        w = self.space.fixed_width
        if w is None:
            return None
        return 2 + w * input_tokens + max(input_tokens - 1, 0)


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
