"""Content operations shared by the writer (delta encoding) and the reader
(reconstruction): normalizing payloads, finding common prefixes, and turning
content into JSON text without re-serializing what is already serialized."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from replayer.errors import TraceError

Content = list[str] | str | list[int]
"""chat: message JSON texts; text: the prompt; blocks: block hash ids."""


def message_text(message: Any) -> str:
    """One chat message as compact JSON (key order kept)."""
    if isinstance(message, str):
        return message
    try:
        return orjson.dumps(message).decode()
    except TypeError as exc:
        raise TraceError(f"chat message is not JSON-serializable: {exc}") from None


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the longest common prefix of two sequences.

    Agent sessions almost always extend the previous turn, so try the whole
    of ``a`` first; otherwise bisect on slice equality (C-speed compares)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def chat_json(messages: Sequence[str]) -> str:
    return "[" + ",".join(messages) + "]"


def utf8_len(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode())
