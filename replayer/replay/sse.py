"""Server-sent events, and the per-request accounting of a streamed reply.

The decoder follows the WHATWG event-stream rules that matter for OpenAI
APIs (``data:`` lines joined by newlines, an event per blank line, comments
and other fields ignored, CR/LF/CRLF). It is hand-written, not a library:
httpx-sse binds to httpx, and the replay hot path runs on aiohttp, chosen by
measurement (bench/RESULTS.md); the rules fit in forty lines.

:class:`StreamStats` turns events into what a replay records: first-token
time, token-chunk count and inter-chunk gaps, usage, finish reason, an error
event, ``[DONE]``, and a hash of the output text. Every event is parsed with
orjson (about a microsecond each): cheaper and more robust than scanning
bytes, and needed anyway to hash the text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson


class SSEDecoder:
    """Incremental event-stream decoder: feed bytes, get ``data`` payloads."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        while True:
            cut = buf.find(b"\n")
            if b"\r" in buf:  # rare: CR or CRLF line ends
                r = buf.find(b"\r")
                if r != -1 and (cut == -1 or r < cut):
                    if r + 1 == len(buf):
                        break  # maybe half of a CRLF: wait for more
                    cut = r
            if cut == -1:
                break
            line = buf[:cut]
            buf = buf[cut + (2 if buf[cut : cut + 2] == b"\r\n" else 1) :]
            if not line:
                if self._data:
                    yield b"\n".join(self._data)
                    self._data = []
            elif line[0] != 0x3A:  # ":" starts a comment (keep-alive)
                name, _, value = line.partition(b":")
                if name == b"data":
                    self._data.append(value[1:] if value[:1] == b" " else value)
        self._buf = buf

    def close(self) -> bytes | None:
        """A final event the stream ended without terminating (a cut stream)."""
        data, self._data = self._data, []
        return b"\n".join(data) if data else None

    @property
    def pending(self) -> bool:
        return bool(self._buf or self._data)


@dataclass
class StreamStats:
    """What one streamed (or whole) response amounted to."""

    chunks: int = 0
    """Events that carried output (text, reasoning or tool-call deltas)."""
    first_token: float | None = None
    last_token: float | None = None
    gap_sum: float = 0.0
    gap_max: float = 0.0
    done: bool = False
    """``data: [DONE]`` was seen."""
    error: dict[str, Any] | None = None
    """The error object of an in-stream error event."""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    text: list[str] | None = None
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    _hash: Any = field(default_factory=hashlib.sha256)

    def keep_text(self) -> None:
        self.text = []

    def event(self, data: bytes, now: float) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return  # not ours to judge; the stream's end decides
        if not isinstance(obj, dict):
            return
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            self.error = err if isinstance(err, dict) else {"message": str(err)}
            return
        self._usage(obj.get("usage"))
        got = False
        for choice in obj.get("choices") or ():
            got |= self._choice(choice)
        if got:
            if self.first_token is None:
                self.first_token = now
            else:
                gap = now - (self.last_token or now)
                self.gap_sum += gap
                self.gap_max = max(self.gap_max, gap)
            self.last_token = now
            self.chunks += 1

    def whole(self, obj: Any) -> None:
        """Account a non-streamed response body."""
        if not isinstance(obj, dict):
            return
        self._usage(obj.get("usage"))
        for choice in obj.get("choices") or ():
            msg = choice.get("message")
            if isinstance(msg, dict):
                choice = {**choice, "delta": msg}
            self._choice(choice)

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
        self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            self.cached_tokens = details["cached_tokens"]

    def _choice(self, choice: Any) -> bool:
        if not isinstance(choice, dict):
            return False
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        got = False
        delta = choice.get("delta")
        pieces: list[str] = []
        if isinstance(delta, dict):
            for key in ("reasoning", "reasoning_content", "content"):
                v = delta.get(key)
                if isinstance(v, str) and v:
                    pieces.append(v)
            for call in delta.get("tool_calls") or ():
                got = True
                self._tool_call(call)
        t = choice.get("text")
        if isinstance(t, str) and t:
            pieces.append(t)
        for p in pieces:
            self._hash.update(p.encode())
            if self.text is not None:
                self.text.append(p)
        return got or bool(pieces)

    def _tool_call(self, call: Any) -> None:
        if not isinstance(call, dict):
            return
        slot = self.tool_calls.setdefault(
            int(call.get("index", len(self.tool_calls))),
            {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if call.get("id"):
            slot["id"] = call["id"]
        fn = call.get("function")
        if isinstance(fn, dict):
            if fn.get("name"):
                slot["function"]["name"] += fn["name"]
            if fn.get("arguments"):
                slot["function"]["arguments"] += fn["arguments"]
                self._hash.update(fn["arguments"].encode())

    @property
    def output_hash(self) -> str:
        return str(self._hash.hexdigest()[:16])

    def assistant_message(self) -> dict[str, Any]:
        """The reply as a chat message (live mode threads it into later turns)."""
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self.text or []) or None}
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return msg
