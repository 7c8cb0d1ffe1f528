"""HTTP connection policy shared by every client replayer runs against a server.

The replay client, the recording proxy's upstream session and the metrics
scraper all talk to vLLM over pooled keep-alive connections, and must all
close idle ones before vLLM does (:data:`IDLE_CLOSE_S`); every probe must
tell a server that refuses connections from a replayer that ran out of file
descriptors (:func:`out_of_fds`). A leaf: aiohttp and the standard library
only, so the replay, record and monitor layers share it without importing
each other.
"""

from __future__ import annotations

import errno
import socket

import aiohttp

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
