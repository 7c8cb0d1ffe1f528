"""HTTP connection policy shared by the clients and the servers replayer runs.

The replay client, the recording proxy's upstream session and the metrics
scraper all talk to vLLM over pooled keep-alive connections, and must all
close idle ones before vLLM does (:data:`IDLE_CLOSE_S`); every probe must
tell a server that refuses connections from a replayer that ran out of file
descriptors (:func:`out_of_fds`). The servers replayer runs (the recorder,
the service) share what they do against abusive clients: a deadline on slow
heads and stalled bodies (:class:`ClientDeadline`), bounded heads, one line
for a malformed request, an open-files limit that fits their connections.
A leaf: aiohttp, the standard library and :mod:`replayer.errors` only, so
the replay, record, monitor and service layers share it without importing
each other.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import socket
import time
from collections.abc import Mapping
from typing import Self

import aiohttp
import aiohttp.http_exceptions
from aiohttp import web

IDLE_CLOSE_S = 2.0
"""Idle pooled connections are closed after this many seconds.

vLLM (uvicorn) closes an idle keep-alive connection after 5 s
(``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``). A client that keeps idle connections
longer (aiohttp's default is 15 s) can write a request on a connection the
server is closing at that moment: the POST fails before any response byte,
is not retried (it is not idempotent), and a healthy server is reported as
crashed. Measured in bench/replay.py: a client busy building 0.5 MB bodies
hit it on the kv-cache-tester corpus. Closing well before the server does
leaves a 3 s margin for the event loop to be busy."""

CONNECT_TIMEOUT_S = 30.0
"""Bound on opening a connection. Nothing else is bounded by the session: a
long prefill is minutes of silence before the first byte (VLLM.md §3.1), so
callers bound whole requests themselves where they need to."""


def pooled_connector(limit: int) -> aiohttp.TCPConnector:
    """A connection pool of ``limit`` connections (0: unbounded) to any number
    of hosts, closing idle ones after :data:`IDLE_CLOSE_S`."""
    return aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=IDLE_CLOSE_S)


def streaming_timeout(connect: float = CONNECT_TIMEOUT_S) -> aiohttp.ClientTimeout:
    """A session timeout that bounds only the connect (see :data:`CONNECT_TIMEOUT_S`)."""
    return aiohttp.ClientTimeout(total=None, connect=None, sock_connect=connect, sock_read=None)


def out_of_fds(exc: aiohttp.ClientConnectorError | OSError) -> bool:
    """The connection failed for lack of file descriptors: this process's
    limit (see ``ulimit -n``), which says nothing about the server."""
    err = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    return err.errno in (errno.EMFILE, errno.ENFILE)


def free_port() -> int:
    """A loopback port nothing listens on now: for a server we launch (it
    takes a port number, not a socket)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- serving: what the recorder and the service do against abusive clients -------------

CLIENT_TIMEOUT_S = 60.0
"""Seconds a client may keep our servers waiting: for a complete request head
(from its connection's opening or previous response; trickling bytes do not
reset it) or for more of a request body (see :class:`ClientDeadline`)."""

CLIENT_TIMEOUT_ENV = "REPLAYER_CLIENT_TIMEOUT"
"""Overrides :data:`CLIENT_TIMEOUT_S` for ``replayer record`` and ``replayer serve``."""

MAX_HEADERS = 128
"""Most header lines one request may carry (aiohttp < 3.14 allowed 32768)."""

SERVER_LOG = logging.getLogger("replayer.http")
"""The logger our aiohttp servers report connection-level trouble to."""


def client_timeout(environ: Mapping[str, str] | None = None) -> float:
    """:data:`CLIENT_TIMEOUT_S`, or ``$REPLAYER_CLIENT_TIMEOUT`` when set."""
    from replayer.errors import UsageError

    text = (os.environ if environ is None else environ).get(CLIENT_TIMEOUT_ENV, "").strip()
    if not text:
        return CLIENT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise UsageError(f"${CLIENT_TIMEOUT_ENV}={text!r}: want a positive number of seconds")
    return value


class ClientDeadline:
    """Cuts a connection whose client keeps the server waiting ``seconds``.

    aiohttp bounds a request head's size, not how long it may take to
    arrive (before 3.14 not at all, since then by the hour-long keep-alive
    timeout), nor how long a body may stall: a client sending one header
    byte a second (slowloris), or a body that stops coming, holds a
    connection, a descriptor and a handler for ever, and enough of them
    exhaust the process. Two clocks, as nginx's ``client_header_timeout``
    and ``client_body_timeout``:

    * head: from a connection's opening, and from the end of its previous
      response, to a complete request head; trickling bytes do not reset
      it, so an idle keep-alive connection closes after the same time;
    * body: while a handler waits on a request body, the time since its
      last bytes arrived (not while flow control has paused reading: then
      the server is the slow side). aiohttp's C parser leaves the body of
      a request with malformed chunking waiting for ever; this cuts it.

    A sweep every ``seconds / 4`` (at most 1 s) looks at each connection,
    so a cut comes between ``seconds`` and ``seconds`` plus one sweep.

    **Usage**::

        await runner.setup()
        deadline = ClientDeadline(runner.server, 60.0).start()  # before the site starts
        ...
        deadline.stop()
    """

    def __init__(self, server: web.Server, seconds: float) -> None:
        self.seconds = seconds
        self.cut = 0
        """Connections cut so far."""
        self._server = server
        self._busy: dict[web.RequestHandler, web.BaseRequest] = {}
        self._since: dict[web.RequestHandler, float] = {}
        self._body: dict[web.RequestHandler, tuple[int, float]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        inner = server.request_handler

        async def timed(request: web.BaseRequest) -> web.StreamResponse:
            proto = request.protocol
            self._busy[proto] = request
            try:
                return await inner(request)
            finally:
                if self._busy.get(proto) is request:
                    del self._busy[proto]
                self._body.pop(proto, None)
                self._since[proto] = time.monotonic()

        # each connection's protocol copies the handler when made: install first
        server.request_handler = timed

    def start(self) -> Self:
        self._loop = asyncio.get_running_loop()
        self._arm()
        return self

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._loop = None

    def _arm(self) -> None:
        if self._loop is not None:
            self._timer = self._loop.call_later(min(1.0, self.seconds / 4), self._sweep)

    def _sweep(self) -> None:
        try:
            self.sweep(time.monotonic())
        finally:
            self._arm()

    def sweep(self, now: float) -> int:
        """Cut the connections past a deadline at ``now``; how many."""
        conns = self._server.connections
        cut = 0
        for proto in conns:
            transport = proto.transport
            if transport is None:
                continue
            request = self._busy.get(proto)
            if request is None:
                late = self._head_late(proto, transport, now)
            else:
                late = self._body_late(proto, request, transport, now)
            if late:
                proto.force_close()
                cut += 1
        if len(self._since) + len(self._body) > len(conns):
            live = set(conns)
            for table in (self._since, self._body):
                for proto in [p for p in table if p not in live]:
                    del table[proto]
        self.cut += cut
        return cut

    def _head_late(
        self, proto: web.RequestHandler, transport: asyncio.Transport, now: float
    ) -> bool:
        since = self._since.get(proto)
        if since is None or transport.get_write_buffer_size() or not transport.is_reading():
            # new, or a response still going out (or pipelined heads queued): not idle
            self._since[proto] = now
            return False
        return now - since >= self.seconds

    def _body_late(
        self,
        proto: web.RequestHandler,
        request: web.BaseRequest,
        transport: asyncio.Transport,
        now: float,
    ) -> bool:
        body = request.content
        if body.is_eof() or body.exception() is not None or not transport.is_reading():
            self._body.pop(proto, None)
            return False
        seen = self._body.get(proto)
        if seen is None or seen[0] != body.total_bytes:
            self._body[proto] = (body.total_bytes, now)
            return False
        return now - seen[1] >= self.seconds


class _ClientFault(logging.Filter):
    """aiohttp logs every malformed request (bad chunking, oversized or too
    many headers) with its parser's traceback at ERROR, and a handler whose
    client went away mid-body fails with a traceback too: the client's doing,
    not ours, and a flood on stderr when a client repeats it. Those become
    one DEBUG line; any other exception keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, aiohttp.http_exceptions.HttpProcessingError | ConnectionResetError):
            return True
        detail = " ".join(str(exc).split()) or type(exc).__name__
        record.msg, record.args = f"{record.getMessage()}: {detail}", None
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_client_faults(logger: logging.Logger) -> None:
    """Log a client's malformed request or disconnect to ``logger`` as one
    DEBUG line, not an ERROR with a traceback (see :class:`_ClientFault`)."""
    if not any(isinstance(f, _ClientFault) for f in logger.filters):
        logger.addFilter(_ClientFault())


quiet_client_faults(SERVER_LOG)


def raise_fd_limit(needed: int) -> str | None:
    """Raise the soft open-files limit to the hard one when it is below
    ``needed``; a one-line warning when it cannot reach ``needed``.

    Every client connection is a descriptor, and a proxied one two: 1,024
    (a common soft default) runs out at ~1,000 idle clients, and then the
    listener stops accepting (EMFILE) and every client waits."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    want = needed if hard == resource.RLIM_INFINITY else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as exc:
        return f"cannot raise the open-files limit from {soft} to {want}: {exc}"
    if want < needed:
        return (
            f"the open-files limit is {want} (the hard limit), below the {needed} "
            "connections this may hold; raise it (ulimit -Hn)"
        )
    return None
