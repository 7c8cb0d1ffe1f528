"""An incremental decoder for ``text/event-stream`` (WHATWG HTML §9.2.6).

Bytes go in as they were read, events come out as they complete. Lines end
at LF, CRLF or a lone CR; a chunk may end anywhere, inside a CRLF pair or a
UTF-8 sequence included. A CR that ends a chunk ends its line at once (the
LF that may follow is skipped when it comes): an event is never held back
waiting for a byte that may not come. A leading UTF-8 BOM is dropped. Fields
are ``data`` (lines joined by LF), ``event``, ``id`` (ignored if it holds
NUL) and ``retry`` (ASCII digits only); a line starting with ``:`` is a
comment (vLLM's ``: keep-alive``); other fields are ignored, a line without
a colon is a field with an empty value. A blank line dispatches the event,
unless no ``data`` line came. At the end of the stream, an event without
its blank line is discarded (:meth:`SSEDecoder.close`), as the spec and the
``openai`` SDK do.

``data`` stays bytes (orjson parses bytes; decoding first would cost a copy
per event), ``event`` and ``id`` are decoded with replacement. It is
hand-written, not a library: httpx-sse binds to httpx, and the replay hot
path runs on aiohttp (bench/RESULTS.md). The scan is index-based, each CR
found once, and a one-line ``data`` is passed on without a join: one slice
and one :class:`Event` per event.
"""

from __future__ import annotations

from dataclasses import dataclass

_BOM = b"\xef\xbb\xbf"
_LF = 0x0A
_SPACE = 0x20
_COLON = 0x3A


# Not frozen: a frozen dataclass is about three times slower to build, and one
# is built per event on the replay's hot path.
@dataclass(slots=True)
class Event:
    """One dispatched event."""

    data: bytes
    """The ``data`` lines, joined by LF, as raw UTF-8."""
    event: str = "message"
    """The ``event`` field (``message`` when the event had none)."""
    id: str = ""
    """The last event id seen so far in the stream (it persists across events)."""


def is_event_stream(content_type: str | None) -> bool:
    """``Content-Type`` names an event stream (the media type, any parameters, any case)."""
    if not content_type:
        return False
    return content_type.partition(";")[0].strip().lower() == "text/event-stream"


class SSEDecoder:
    """Incremental event-stream decoder.

    **Usage**::

        dec = SSEDecoder()
        for chunk in chunks:
            for ev in dec.feed(chunk):
                handle(ev.data)
        dec.close()
    """

    __slots__ = ("_buf", "_data", "_event", "_skip_lf", "_start", "last_event_id", "retry")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._event = ""
        self._skip_lf = False
        self._start = True
        self.last_event_id = ""
        """The ``id`` buffer: what the next event's :attr:`Event.id` will be."""
        self.retry: int | None = None
        """The last valid ``retry`` field (milliseconds), for a reconnecting client."""

    def feed(self, chunk: bytes) -> list[Event]:
        """The events ``chunk`` completes (a list: the state is updated whole,
        even if the caller stops iterating early)."""
        out: list[Event] = []
        if not chunk:
            return out
        buf = self._buf + chunk if self._buf else chunk
        pos = 0
        if self._start:
            if len(buf) < 3 and _BOM.startswith(buf):
                self._buf = buf  # maybe a BOM split across reads
                return out
            self._start = False
            if buf.startswith(_BOM):
                pos = 3
        elif self._skip_lf:  # the last read ended with a CR; here is its LF
            self._skip_lf = False
            if buf[0] == _LF:
                pos = 1
        n = len(buf)
        cr = buf.find(b"\r", pos)
        data = self._data
        while pos < n:
            nl = buf.find(b"\n", pos)
            if cr != -1 and (nl == -1 or cr < nl):
                end = cr
                if cr + 1 == n:
                    nxt = n
                    self._skip_lf = True
                else:
                    nxt = cr + 2 if buf[cr + 1] == _LF else cr + 1
                cr = buf.find(b"\r", nxt)
            elif nl == -1:
                break
            else:
                end, nxt = nl, nl + 1
            if end == pos:  # a blank line: dispatch
                if data:
                    payload = data[0] if len(data) == 1 else b"\n".join(data)
                    out.append(Event(payload, self._event or "message", self.last_event_id))
                    data.clear()
                self._event = ""
            elif buf.startswith(b"data:", pos):
                s = pos + 5
                if s < end and buf[s] == _SPACE:
                    s += 1
                data.append(buf[s:end])
            elif buf[pos] != _COLON:
                self._field(buf[pos:end])
            pos = nxt
        self._buf = buf[pos:] if pos < n else b""
        return out

    def _field(self, line: bytes) -> None:
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode(errors="replace")
        elif name == b"id":
            if b"\0" not in value:
                self.last_event_id = value.decode(errors="replace")
        elif name == b"retry" and value.isdigit():  # bytes.isdigit: ASCII digits only
            self.retry = int(value)

    @property
    def pending(self) -> int:
        """Bytes held for an unfinished line or event (a bound for the caller to enforce)."""
        return len(self._buf) + sum(len(d) for d in self._data)

    def close(self) -> bool:
        """The stream ended. An unterminated event is discarded, as the spec says;
        returns whether there was one (or an unterminated line)."""
        partial_bom = self._start and _BOM.startswith(self._buf)
        cut = bool(self._data) or (bool(self._buf) and not partial_bom)
        self._buf, self._event, self._skip_lf = b"", "", False
        self._data.clear()
        return cut
