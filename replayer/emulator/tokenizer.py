"""The emulator's tokenizer stand-in: exact counts, stable token identities.

**Counts.** A trace's ``input_tokens`` column must predict the emulator's
``prompt_tokens``, so counting is exactly the project's documented
approximation (:mod:`replayer.trace.tokens`): a chat prompt has
``sum(approx_message_tokens(m))`` tokens, a text prompt
``approx_text_tokens(text)``, a token-id prompt ``len(ids)``. Tools, the
generation prompt and unknown fields add nothing.

**Identities.** Prefix caching needs two prompts that share text to share
tokens, so every token is a 64-bit id with a fixed meaning:

* a *text piece* is 4 UTF-8 bytes of text (the last piece of a string is
  zero-padded), and its id is those bytes read as a little-endian ``u32``;
* each chat message is framed by four special ids (>= 2**32, so they never
  collide with text): ``<|im_start|>``, a role id, ``<|im_middle|>`` before
  the content pieces, then tool-call name and argument pieces, then
  ``<|im_end|>``. That is the ``+4`` of ``approx_message_tokens``;
* token-id prompts are used as given.

A prompt is held as its token stream: ``n`` ids as ``8 * n`` little-endian
bytes. Building it is a handful of C-level slice copies, so a 300K-token
prompt costs milliseconds. Full blocks hash in one vectorized pass, the
same chained shape as vLLM's block hashes (block ``i``'s hash names the
whole prompt up to it) and stable across processes: each id is mixed
(splitmix64's finalizer), a block's fingerprint is a position-weighted sum
of its mixed ids, and ``h_i = h_{i-1} * R + f_i`` (mod 2**64), in two lanes
with their own constants: 128 bits per block, a 300K-token prompt in about
a millisecond.

This module must not know about requests, HTTP or the KV cache.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence
from functools import cache

import numpy as np
import numpy.typing as npt

TEXT_PIECE_BYTES = 4
ID_BYTES = 8
SPECIAL_BASE = 1 << 32
IM_START = SPECIAL_BASE + 1
IM_MIDDLE = SPECIAL_BASE + 2
IM_END = SPECIAL_BASE + 3
_ROLE_BASE = SPECIAL_BASE + 1000
_SPECIAL_TEXT = {IM_START: "<|im_start|>", IM_MIDDLE: "<|im_middle|>", IM_END: "<|im_end|>"}


def _ids(*values: int) -> bytes:
    return array("Q", values).tobytes()


def role_id(role: str) -> int:
    return _ROLE_BASE + zlib.crc32(role.encode()) % 1_000_000


def text_stream(text: str) -> bytes:
    """Token stream of one string: ``ceil(utf8_bytes / 4)`` piece ids."""
    raw = text.encode(errors="surrogatepass")  # JSON may carry lone surrogates
    n = -(-len(raw) // TEXT_PIECE_BYTES)
    if n == 0:
        return b""
    padded = raw.ljust(n * TEXT_PIECE_BYTES, b"\0")
    out = bytearray(n * ID_BYTES)
    # Interleave 4 text bytes with 4 zero bytes per id, at C speed.
    for k in range(TEXT_PIECE_BYTES):
        out[k::ID_BYTES] = padded[k::TEXT_PIECE_BYTES]
    return bytes(out)


def message_stream(message: Mapping[str, object]) -> bytes:
    """Token stream of one chat message; its length is exactly
    ``approx_message_tokens(message)`` ids."""
    parts = [_ids(IM_START, role_id(str(message.get("role", ""))), IM_MIDDLE)]
    content = message.get("content")
    if isinstance(content, str):
        parts.append(text_stream(content))
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(text_stream(part["text"]))
    calls = message.get("tool_calls") or []
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                parts.append(text_stream(str(fn.get("name", ""))))
                parts.append(text_stream(str(fn.get("arguments", ""))))
    parts.append(_ids(IM_END))
    return b"".join(parts)


def chat_stream(messages: Iterable[Mapping[str, object]]) -> bytes:
    return b"".join(message_stream(m) for m in messages)


def ids_stream(ids: Sequence[int]) -> bytes:
    """Token stream of a token-id prompt (ids must be in ``0 .. 2**64 - 1``)."""
    return array("Q", ids).tobytes()


def count(stream: bytes) -> int:
    return len(stream) // ID_BYTES


def token_ids(stream: bytes) -> list[int]:
    out = array("Q")
    out.frombytes(stream)
    return out.tolist()


_U64 = npt.NDArray[np.uint64]
_LANES = ((0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93), (0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9))
"""Per lane: the seed of its position weights and its odd chain multiplier R."""


def _mix(x: _U64) -> _U64:
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@cache
def _weights(block_size: int, lane: int) -> _U64:
    seed = np.arange(1, block_size + 1, dtype=np.uint64) * np.uint64(_LANES[lane][0])
    return _mix(seed) | np.uint64(1)


_POWERS: dict[int, tuple[_U64, _U64]] = {}


def _powers(lane: int, n: int) -> tuple[_U64, _U64]:
    """``R**k`` and ``R**-k`` (mod 2**64) for k < n, grown by doubling."""
    have = _POWERS.get(lane)
    if have is None or len(have[0]) < n:
        size = max(n, 2 * len(have[0]) if have else 1024)
        r = _LANES[lane][1]
        up = np.full(size, r, dtype=np.uint64)
        up[0] = 1
        down = np.full(size, pow(r, -1, 1 << 64), dtype=np.uint64)
        down[0] = 1
        have = (np.cumprod(up, dtype=np.uint64), np.cumprod(down, dtype=np.uint64))
        _POWERS[lane] = have
    return have[0][:n], have[1][:n]


def block_hashes(stream: bytes, block_size: int) -> list[bytes]:
    """Chained digests of every *full* block of the stream, in order."""
    full = len(stream) // (block_size * ID_BYTES)
    if full == 0:
        return []
    ids = np.frombuffer(stream, dtype="<u8", count=full * block_size).reshape(full, block_size)
    mixed = _mix(ids)
    lanes = []
    for lane in (0, 1):
        f = _mix(np.einsum("ij,j->i", mixed, _weights(block_size, lane)))  # wraps mod 2**64
        up, down = _powers(lane, full)
        lanes.append(np.cumsum(f * down, dtype=np.uint64) * up)
    return np.column_stack(lanes).view("V16").ravel().tolist()


_GOLDEN = 0x9E3779B97F4A7C15


def in_vocab(ids: Sequence[int], vocab_size: int) -> list[int]:
    """Ids as ``/tokenize`` shows them to clients of a model with ``vocab_size``
    ids: ids below it unchanged, others folded into it by a fixed 64-bit mix
    (deterministic; the emulator's own ids - 4-byte pieces, specials >= 2**32 -
    keep their identity inside the emulator). Folded ids no longer
    detokenize to the text."""
    if vocab_size > 1 << 63:
        return list(ids)
    mask = (1 << 64) - 1
    return [t if t < vocab_size else ((t * _GOLDEN) & mask) % vocab_size for t in ids]


def detokenize(ids: Iterable[int]) -> str:
    """Inverse of the text encoding: pieces back to bytes, specials by name."""
    buf = bytearray()
    out: list[str] = []
    for tid in ids:
        if tid < SPECIAL_BASE:
            buf += tid.to_bytes(TEXT_PIECE_BYTES, "little").rstrip(b"\0")
            continue
        if buf:
            out.append(buf.decode(errors="replace"))
            buf.clear()
        out.append(_SPECIAL_TEXT.get(tid, f"<|special_{tid - SPECIAL_BASE}|>"))
    if buf:
        out.append(buf.decode(errors="replace"))
    return "".join(out)
