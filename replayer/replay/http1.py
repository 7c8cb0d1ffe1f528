"""The replay's own HTTP/1.1 client: keep-alive connections as asyncio
protocols, responses read by llhttp (through httptools).

Why not aiohttp's client here: a burst of hundreds of sessions due at one
instant leaves only as fast as the client's per-request work allows, and
aiohttp's (its request and response objects, the stream reader, a task
wake-up per chunk) put the same 710 pre-built bodies on the wire in 265 ms
where a bare protocol took 146 (bench/RESULTS.md, wire speed). Here a
response's chunks go from ``data_received`` straight to the caller's sink,
on the loop callback that read them, stamped with the time they came.

Only what a replay sends: ``POST`` with a known length, to ``http`` or
``https`` origins, no proxies, no redirects, no cookies, no compression.
aiohttp stays for everything else (pre-flight, probes, the recording proxy).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import urlsplit

import httptools

from replayer._http import CONNECT_TIMEOUT_S, IDLE_CLOSE_S

Sink = Callable[[bytes, float], None]
"""Takes a streamed response's chunks as they arrive, with the loop time
they were read at."""


class Origin(NamedTuple):
    scheme: str
    host: str
    port: int


class Target(NamedTuple):
    origin: Origin
    path: str
    """The request target: path and query."""
    host: str
    """The Host header."""


@lru_cache(maxsize=1024)
def split(url: str) -> Target:
    """Where ``url`` points (a replay sends to a handful of URLs, millions of
    times: parsed once each)."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = u.port or (443 if u.scheme == "https" else 80)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    return Target(Origin(u.scheme, u.hostname, port), path, u.netloc.rpartition("@")[2])


_OWN = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def request_head(target: Target, headers: dict[str, str], length: int) -> bytes:
    """A ``POST``'s request line and headers. A header the caller passes
    that would frame the message differently (Content-Length, Host, ...)
    is dropped: the framing is this module's."""
    parts = [
        f"POST {target.path} HTTP/1.1\r\nHost: {target.host}\r\n"
        f"Content-Length: {length}\r\nAccept: */*\r\n"
    ]
    for k, v in headers.items():
        if "\r" in v or "\n" in v or "\r" in k or "\n" in k or ":" in k:
            raise ValueError(f"header {k!r} has a line break or a colon in it: not sent")
        if k.lower() not in _OWN:
            parts.append(f"{k}: {v}\r\n")
    parts.append("\r\n")
    return "".join(parts).encode()


class ConnectError(Exception):
    """The connection could not be opened (the OS said why)."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(os_error.strerror or str(os_error) or type(os_error).__name__)
        self.os_error = os_error


class Disconnected(Exception):
    """The connection closed before the response's headers were in."""


class StreamCut(Exception):
    """The connection closed in the middle of the response's body."""


class BadResponse(Exception):
    """What came back is not HTTP/1.1."""


class ClientAbort(Exception):
    """The client gave up on the response on purpose (a replayed abort):
    raised by a sink, or passed to :meth:`Conn.abort`; the connection closes."""


class Response:
    """One response as it arrives. ``head`` resolves once its headers are
    in (or the exchange failed first: ``error``), ``done`` once it is
    complete (or failed). Neither ever holds an exception: nobody is left
    with one to retrieve."""

    __slots__ = (
        "status",
        "content_type",
        "head",
        "done",
        "body",
        "head_at",
        "error",
        "sink",
        "streamed",
        "keep_alive",
        "framed",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, sink: Sink) -> None:
        self.status = 0
        """0 until the headers are in (llhttp never reports 0)."""
        self.content_type = "application/octet-stream"
        """Lower case, without parameters (aiohttp's default when absent)."""
        self.head: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.body: list[bytes] = []
        """The body's chunks, unless streamed to ``sink``."""
        self.head_at = 0.0
        self.error: Exception | None = None
        self.sink = sink
        self.streamed = False
        """A 200 ``text/event-stream``: its chunks went to the sink."""
        self.keep_alive = False
        self.framed = False
        """Its length is known (Content-Length or chunked): not read to close."""

    @property
    def headers_in(self) -> bool:
        return self.status != 0

    def finish(self) -> None:
        for f in (self.head, self.done):
            if not f.done():
                f.set_result(None)

    def fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        self.finish()


class Conn(asyncio.Protocol):
    """One keep-alive connection; one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: Pool, origin: Origin) -> None:
        self._loop = loop
        self._pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.usable = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._resp: Response | None = None

    # -- the transport's side ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.usable = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        self._pool._lost(self)
        r, self._resp = self._resp, None
        if r is None:
            return
        if r.headers_in and not r.framed and exc is None:
            r.finish()  # a body read to the connection's close: complete
            return
        why = f" ({exc})" if exc is not None else ""
        if r.headers_in:
            r.fail(StreamCut(f"connection closed before the response finished{why}"))
        else:
            r.fail(Disconnected(f"server disconnected before answering{why}"))

    def data_received(self, data: bytes) -> None:
        if self._resp is None:  # nothing was asked: the stream is out of step
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # the sink raised
            self._fail(exc.__context__ if isinstance(exc.__context__, Exception) else exc)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(BadResponse(f"not an HTTP/1.1 response: {exc}"))

    def eof_received(self) -> bool:
        return False  # close; connection_lost settles the response

    def _fail(self, error: Exception) -> None:
        r, self._resp = self._resp, None
        if r is not None:
            r.fail(error)
        self.close()

    # -- llhttp's callbacks --------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        r = self._resp
        assert r is not None
        n = name.lower()
        if n == b"content-type":
            r.content_type = value.split(b";", 1)[0].strip().lower().decode("latin-1")
        elif n == b"content-length" or (n == b"transfer-encoding" and b"chunked" in value.lower()):
            r.framed = True

    def on_headers_complete(self) -> None:
        r = self._resp
        assert r is not None
        r.status = self._parser.get_status_code()
        r.head_at = self._loop.time()
        r.streamed = r.status == 200 and r.content_type == "text/event-stream"
        if r.status in (204, 304):
            r.framed = True
        r.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        r = self._resp
        assert r is not None
        if r.streamed:
            r.sink(body, self._loop.time())
        else:
            r.body.append(body)

    def on_message_complete(self) -> None:
        r, self._resp = self._resp, None
        assert r is not None
        r.keep_alive = self._parser.should_keep_alive()
        r.finish()

    # -- the caller's side ---------------------------------------------------

    def request(self, head: bytes, body: bytes, sink: Sink) -> Response:
        """Write a request (headers and body as two writes: the body goes to
        the socket from its own bytes, not joined into a new buffer). Not
        waited on: the transport holds what the socket has not taken, and
        the response may come before all of it is out."""
        r = Response(self._loop, sink)
        t = self.transport
        if t is None or t.is_closing():
            r.fail(Disconnected("server disconnected before the request was written"))
            return r
        self._resp = r
        t.write(head)
        t.write(body)
        return r

    def abort(self, error: Exception) -> None:
        """Give up on the response in flight (it fails with ``error``) and
        close the connection: the server sees the client go away."""
        self._fail(error)

    @property
    def flushed(self) -> bool:
        """Everything written is out: a server that answered before it read
        the whole body leaves the rest queued, and the next request on this
        connection would be read as its tail."""
        t = self.transport
        return t is not None and t.get_write_buffer_size() == 0

    def close(self) -> None:
        self.usable = False
        if self.transport is not None:
            self.transport.close()


WRITE_BUDGET = 1 << 20
"""Bytes that requests may hand to their transports in one turn of the
event loop; a request that would pass it waits for the next turn (one alone
always goes, whatever its size). On loopback a socket write of a megabyte
costs the kernel 3-10 ms on this machine's VM: thirty sessions due in the
same millisecond, each writing its body in the same turn, kept the loop
from its timers and signals for 20-35 ms (bench/RESULTS.md, wire speed)."""


class Gate:
    """Spreads request writes over turns of the loop, in arrival order:
    :data:`WRITE_BUDGET`'s why. The budget counts what it lets through; a
    write let through at once and those woken from the previous turn's
    queue can land in one turn: at most twice the budget (or one write of
    any size) per turn."""

    def __init__(self, budget: int = WRITE_BUDGET) -> None:
        self.budget = budget
        self._used = 0
        self._turn_ends = False
        self._waiting: deque[tuple[asyncio.Future[None], int]] = deque()

    async def clear(self, size: int) -> None:
        """Until ``size`` bytes may be written in this turn."""
        if self._used and (self._waiting or self._used + size > self.budget):
            fut = asyncio.get_running_loop().create_future()
            self._waiting.append((fut, size))
            await fut  # cancelled: the next turn skips it
            return
        self._take(size)

    def _take(self, size: int) -> None:
        self._used += size
        if not self._turn_ends:
            self._turn_ends = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._used, self._turn_ends = 0, False
        while self._waiting:
            fut, size = self._waiting[0]
            if fut.done():
                self._waiting.popleft()
                continue
            if self._used and self._used + size > self.budget:
                break
            self._waiting.popleft()
            self._take(size)
            fut.set_result(None)


class Pool:
    """Keep-alive connections by origin, unbounded (the replay bounds its
    own concurrency). An idle connection is reused only within
    :data:`~replayer._http.IDLE_CLOSE_S` (why: there), the warmest first."""

    def __init__(
        self,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        idle_close: float = IDLE_CLOSE_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._idle_close = idle_close
        self._ssl = ssl_context
        self._idle: dict[Origin, list[Conn]] = {}
        self._open: set[Conn] = set()
        self.opened = 0
        """Connections opened so far."""
        self.gate = Gate()
        """Writes of this pool's requests, spread over turns of the loop."""

    async def connect(self, origin: Origin) -> Conn:
        """An idle connection to ``origin``, or a new one (``ConnectError``;
        ``TimeoutError`` past the connect timeout)."""
        idle = self._idle.get(origin)
        if idle:
            now = asyncio.get_running_loop().time()
            while idle:
                c = idle.pop()
                if c.usable and now - c.idle_since < self._idle_close:
                    return c
                c.close()
        return await self._open_one(origin)

    async def preopen(self, origin: Origin, n: int, *, batch: int = 32) -> int:
        """Open ``n`` connections to ``origin``, ``batch`` at a time (710 at
        once kept the loop busy for 60-130 ms), idle in the pool and reused
        within the idle window like any other; how many opened. A failure
        stops it and is left for the first request to meet and report."""
        opened = 0
        while opened < n:
            got = await asyncio.gather(
                *(self._open_one(origin) for _ in range(min(batch, n - opened))),
                return_exceptions=True,
            )
            for c in got:
                if isinstance(c, Conn):
                    self.release(c)
                    opened += 1
                elif not isinstance(c, Exception):
                    raise c  # a cancel: the run is stopping
            if not all(isinstance(c, Conn) for c in got):
                break
        return opened

    async def _open_one(self, origin: Origin) -> Conn:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if origin.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Conn(loop, self, origin),
                    origin.host,
                    origin.port,
                    ssl=tls,
                    server_hostname=origin.host if tls is not None else None,
                )
        except OSError as exc:
            raise ConnectError(exc) from None
        self.opened += 1
        self._open.add(conn)
        return conn

    def release(self, conn: Conn) -> None:
        """Back to the pool, for the next request to its origin; closed
        instead when the request it carried is not all out. Idle ones past
        the reuse window are closed here (the coldest are first in line)."""
        if not conn.usable or not conn.flushed:
            conn.close()
            return
        now = asyncio.get_running_loop().time()
        conn.idle_since = now
        idle = self._idle.setdefault(conn.origin, [])
        while idle and (not idle[0].usable or now - idle[0].idle_since >= self._idle_close):
            idle.pop(0).close()
        idle.append(conn)

    def _lost(self, conn: Conn) -> None:
        self._open.discard(conn)

    def close(self) -> None:
        """Close every connection (in use or not)."""
        for c in list(self._open):
            c.close()
        self._open.clear()
        self._idle.clear()
