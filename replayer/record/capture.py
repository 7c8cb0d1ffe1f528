"""Assembling a recorded exchange's response from the bytes the upstream sent.

The proxy forwards every read as it arrives and hands the same bytes to a
:class:`Capture`, which reassembles what an OpenAI client would see: the
text (chat ``content`` or completions ``text``), reasoning, tool calls
(streamed as indexed fragments, accumulated the way the ``openai`` SDK does:
strings concatenated, ``index``/``type`` kept), finish reason, usage
(including ``prompt_tokens_details.cached_tokens``) and errors, either an
HTTP error body or an in-stream error event (VLLM.md §2.2, §3).

SSE is parsed incrementally (an event may be split across reads and a read
may hold many events); a JSON body is kept (up to a bound) and parsed at the
end. gzip/deflate bodies are decoded for assembly only. The forwarded bytes
are never touched, and nothing here raises on malformed input: the proxy
must keep forwarding whatever the upstream sends, so garbage is counted,
not fatal.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

JSON_LIMIT = 64 << 20
"""Bytes of a non-streamed body kept for assembly; larger ones are forwarded, not parsed."""


@dataclass(slots=True)
class Reply:
    """The assembled response of one exchange (choice 0)."""

    text: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None
    error_type: str | None = None
    error_code: Any = None
    events: int = 0
    """SSE data events (0 for a JSON body)."""
    done: bool = False
    """A stream ended with ``data: [DONE]``."""
    choices: int = 0
    bad: int = 0
    """Events or bodies that could not be parsed."""
    truncated: bool = False
    """The body was too large or in an encoding it could not decode."""

    def message(self) -> dict[str, Any]:
        """The assistant message a chat client feeds back (for session matching)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


@dataclass(slots=True)
class _Choice:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish: str | None = None


class Capture:
    """Incremental response assembly for one exchange.

    **Usage**::

        cap = Capture(chat=True, sse=True)
        for chunk in chunks:
            cap.feed(chunk, time.monotonic_ns())
        reply = cap.finish()
    """

    def __init__(
        self,
        *,
        chat: bool,
        sse: bool,
        encoding: str | None = None,
        limit: int = JSON_LIMIT,
    ) -> None:
        self.chat = chat
        self.sse = sse
        self.first_token_ns: int | None = None
        """When the first event carrying output (text, reasoning, a tool call) arrived."""
        self.bytes = 0
        self._buf = bytearray()
        self._data: list[bytes] = []
        self._choices: dict[int, _Choice] = {}
        self._reply = Reply()
        self._limit = limit
        self._decoder: Any = None
        enc = (encoding or "identity").lower()
        if enc in ("gzip", "x-gzip", "deflate"):
            self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)
        elif enc != "identity":
            self._reply.truncated = True

    # -- input -------------------------------------------------------------------

    def feed(self, data: bytes, now_ns: int) -> None:
        """Take the next bytes of the body as received (``now_ns``: when)."""
        self.bytes += len(data)
        if self._reply.truncated:
            return
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data)
            except zlib.error:
                self._reply.truncated = True
                return
        self._ingest(data, now_ns)

    def _ingest(self, data: bytes, now_ns: int) -> None:
        if not self.sse:
            if len(self._buf) + len(data) > self._limit:
                self._reply.truncated = True
                self._buf.clear()
            else:
                self._buf += data
            return
        self._buf += data
        if len(self._buf) > self._limit:  # one unterminated line this long: not SSE we read
            self._reply.truncated = True
            self._buf.clear()
            return
        start = 0
        buf = self._buf
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = bytes(buf[start:nl])
            start = nl + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            self._line(line, now_ns)
        if start:
            del buf[:start]

    def _line(self, line: bytes, now_ns: int) -> None:
        if not line:
            if self._data:
                data = b"\n".join(self._data)
                self._data.clear()
                self._event(data, now_ns)
            return
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
        # comments (": keep-alive") and other fields carry no output

    def _event(self, data: bytes, now_ns: int) -> None:
        if data == b"[DONE]":
            self._reply.done = True
            return
        self._reply.events += 1
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._reply.bad += 1
            return
        if not isinstance(obj, dict):
            self._reply.bad += 1
            return
        if self._error(obj):
            return
        self._usage(obj.get("usage"))
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return
        produced = False
        for c in choices:
            if not isinstance(c, dict):
                continue
            ch = self._choice(c.get("index", 0))
            if self.chat:
                delta = c.get("delta")
                if isinstance(delta, dict):
                    produced |= self._delta(ch, delta)
            else:
                text = c.get("text")
                if isinstance(text, str) and text:
                    ch.text.append(text)
                    produced = True
            fr = c.get("finish_reason")
            if isinstance(fr, str):
                ch.finish = fr
        if produced and self.first_token_ns is None:
            self.first_token_ns = now_ns

    def _choice(self, index: Any) -> _Choice:
        i = index if isinstance(index, int) else 0
        ch = self._choices.get(i)
        if ch is None:
            ch = self._choices[i] = _Choice()
        return ch

    @staticmethod
    def _delta(ch: _Choice, delta: dict[str, Any]) -> bool:
        produced = False
        content = delta.get("content")
        if isinstance(content, str) and content:
            ch.text.append(content)
            produced = True
        for key in ("reasoning", "reasoning_content"):
            r = delta.get(key)
            if isinstance(r, str) and r:
                ch.reasoning.append(r)
                produced = True
                break
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for frag in calls:
                if isinstance(frag, dict):
                    i = frag.get("index", len(ch.calls))
                    _accumulate(ch.calls.setdefault(i if isinstance(i, int) else 0, {}), frag)
                    produced = True
        return produced

    def _error(self, obj: dict[str, Any]) -> bool:
        err = obj.get("error")
        if isinstance(err, dict):
            src: dict[str, Any] = err
        elif obj.get("object") == "error":
            src = obj  # flat shape of vLLM < 0.10.1
        elif isinstance(err, str):
            src = {"message": err}
        else:
            return False
        msg = src.get("message")
        self._reply.error = msg if isinstance(msg, str) else orjson.dumps(src).decode()
        t = src.get("type")
        self._reply.error_type = t if isinstance(t, str) else None
        self._reply.error_code = src.get("code")
        return True

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        r = self._reply
        r.prompt_tokens = _int(usage.get("prompt_tokens"), r.prompt_tokens)
        r.completion_tokens = _int(usage.get("completion_tokens"), r.completion_tokens)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            r.cached_tokens = _int(details.get("cached_tokens"), r.cached_tokens)

    # -- output ------------------------------------------------------------------

    def finish(self, status: int = 200) -> Reply:
        """The assembled reply (call once, after the last byte)."""
        r = self._reply
        if self._decoder is not None and not r.truncated:
            try:
                rest = self._decoder.flush()
            except zlib.error:
                rest = b""
            if rest:
                self._ingest(rest, 0)
        if self.sse and (self._buf or self._data) and not r.truncated:
            self._ingest(b"\n\n", 0)  # a last event the upstream did not terminate
        elif not self.sse and not r.truncated and self._buf:
            self._body(bytes(self._buf), status)
        self._buf.clear()
        return self.reply()

    @property
    def finishing(self) -> bool:
        """A finish reason, an error or ``[DONE]`` has been read: only the stream's
        tail is left, and whatever completes ``[DONE]`` may be in the next read."""
        r = self._reply
        return r.done or r.error is not None or any(c.finish for c in self._choices.values())

    @property
    def done(self) -> bool:
        """The stream's ``data: [DONE]`` has been read: the reply is complete."""
        return self._reply.done

    def reply(self) -> Reply:
        """The reply assembled from what was read so far (complete once :attr:`done`)."""
        r = self._reply
        r.choices = len(self._choices)
        first = self._choices.get(0) or next(iter(self._choices.values()), None)
        if first is not None:
            if first.text or r.text is None:
                r.text = "".join(first.text)
            if first.reasoning:
                r.reasoning = "".join(first.reasoning)
            if first.calls:
                r.tool_calls = [first.calls[i] for i in sorted(first.calls)]
            r.finish_reason = first.finish
        return r

    def _body(self, raw: bytes, status: int) -> None:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            if status >= 400:
                self._reply.error = raw[:4096].decode(errors="replace")
            else:
                self._reply.bad += 1
            return
        if not isinstance(obj, dict):
            self._reply.bad += 1
            return
        if self._error(obj):
            return
        if status >= 400:
            self._reply.error = raw[:4096].decode(errors="replace")
            return
        self._usage(obj.get("usage"))
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return
        for c in choices:
            if not isinstance(c, dict):
                continue
            ch = self._choice(c.get("index", 0))
            if self.chat:
                msg = c.get("message")
                if isinstance(msg, dict):
                    content = msg.get("content")
                    if isinstance(content, str):
                        ch.text.append(content)
                    for key in ("reasoning", "reasoning_content"):
                        r = msg.get(key)
                        if isinstance(r, str) and r:
                            ch.reasoning.append(r)
                            break
                    calls = msg.get("tool_calls")
                    if isinstance(calls, list) and calls:
                        ch.calls = {i: c for i, c in enumerate(calls)}
            else:
                text = c.get("text")
                if isinstance(text, str):
                    ch.text.append(text)
            fr = c.get("finish_reason")
            if isinstance(fr, str):
                ch.finish = fr


def _int(v: Any, default: int | None) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _accumulate(acc: dict[str, Any], frag: dict[str, Any]) -> None:
    """Merge one streamed tool-call fragment (the openai SDK's ``accumulate_delta``)."""
    for key, value in frag.items():
        if key == "index" or value is None:
            continue
        cur = acc.get(key)
        if cur is None:
            if isinstance(value, dict):
                acc[key] = {}
                _accumulate(acc[key], value)
            else:
                acc[key] = value
        elif key == "type":
            continue
        elif isinstance(cur, str) and isinstance(value, str):
            acc[key] = cur + value
        elif isinstance(cur, dict) and isinstance(value, dict):
            _accumulate(cur, value)
        else:
            acc[key] = value
