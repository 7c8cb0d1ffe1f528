"""Assembling a recorded exchange's response from the bytes the upstream sent.

The proxy forwards every read as it arrives and hands the same bytes to a
:class:`Capture`, which reassembles what a client would see, with the wire
layer (:mod:`replayer.wire`): the decoder for a stream, the API's
accumulator for its events or its whole body. What is recorder-specific is
here: gzip/deflate bodies are decoded for assembly only, a JSON body is
kept (up to a bound) and read at the end, and an unterminated line past the
same bound stops the assembly. The forwarded bytes are never touched, and
nothing here raises on malformed input: the proxy must keep forwarding
whatever the upstream sends, so garbage is counted, not fatal.
"""

from __future__ import annotations

import zlib
from typing import Any

from replayer.wire import Api, Reply, SSEDecoder, accumulator

JSON_LIMIT = 64 << 20
"""Bytes of a non-streamed body (or of one unterminated SSE line) kept for
assembly; past it the response is forwarded, not parsed."""


class Capture:
    """Incremental response assembly for one exchange.

    **Usage**::

        cap = Capture(Api.CHAT, sse=True)
        for chunk in chunks:
            cap.feed(chunk, time.monotonic_ns())
        reply = cap.finish()
    """

    def __init__(
        self,
        api: Api,
        *,
        sse: bool,
        encoding: str | None = None,
        limit: int = JSON_LIMIT,
    ) -> None:
        self.sse = sse
        self.bytes = 0
        self._reply = Reply(keep_text=True)
        self._acc = accumulator(api, self._reply)
        self._sse = SSEDecoder() if sse else None
        self._body = bytearray()
        self._limit = limit
        self._decoder: Any = None
        self._finished = False
        enc = (encoding or "identity").lower()
        if enc in ("gzip", "x-gzip", "deflate"):
            self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)
        elif enc != "identity":
            self._reply.truncated = True

    @property
    def first_token_ns(self) -> int | None:
        """When the first event carrying output (text, reasoning, a tool call) arrived."""
        t = self._reply.first_token
        return None if t is None else int(t)

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
        if self._sse is None:
            if len(self._body) + len(data) > self._limit:
                self._reply.truncated = True
                self._body.clear()
            else:
                self._body += data
            return
        acc = self._acc
        for ev in self._sse.feed(data):
            acc.event(ev, now_ns)
        if self._sse.pending > self._limit:  # one unterminated line this long: not SSE we read
            self._reply.truncated = True
            self._sse.close()

    # -- output ------------------------------------------------------------------

    def finish(self, status: int = 200) -> Reply:
        """The assembled reply (after the last byte; again, the same reply).
        A last event the upstream did not terminate is dropped, as a client
        drops it."""
        r = self._reply
        if self._finished:
            return r
        self._finished = True
        if self._decoder is not None and not r.truncated:
            try:
                rest = self._decoder.flush()
            except zlib.error:
                rest = b""
            if rest:
                self._ingest(rest, 0)
        if self._sse is not None:
            self._sse.close()
        elif not r.truncated and self._body:
            self._acc.body(bytes(self._body), status)
        self._body.clear()
        return r

    def may_end(self, chunk: bytes) -> bool:
        """``chunk`` may hold the stream's end event: the reply must be read
        from it before it is relayed (see :mod:`replayer.record.proxy`)."""
        return self._reply.finishing or any(m in chunk for m in self._acc.end_markers)

    @property
    def finishing(self) -> bool:
        """A finish reason, an error or the end event has been read: only the
        stream's tail is left, and whatever completes it may be in the next read."""
        return self._reply.finishing

    @property
    def done(self) -> bool:
        """The stream's end event (``[DONE]``) has been read: the reply is complete."""
        return self._reply.done

    def reply(self) -> Reply:
        """The reply assembled from what was read so far (complete once :attr:`done`)."""
        return self._reply
