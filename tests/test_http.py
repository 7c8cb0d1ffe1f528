"""The shared HTTP connection policy (replayer/_http.py)."""

from __future__ import annotations

import errno

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from replayer._http import (
    CONNECT_TIMEOUT_S,
    IDLE_CLOSE_S,
    out_of_fds,
    pooled_connector,
    streaming_timeout,
)

pytestmark = pytest.mark.inprocess


async def test_pool_closes_idle_connections_before_vllm_does():
    conn = pooled_connector(7)
    try:
        assert (conn.limit, conn.limit_per_host) == (7, 0)
        assert conn._keepalive_timeout == IDLE_CLOSE_S < 5.0  # uvicorn's keep-alive
    finally:
        await conn.close()


def test_only_the_connect_is_bounded():
    t = streaming_timeout()
    assert (t.total, t.connect, t.sock_read, t.sock_connect) == (
        None,
        None,
        None,
        CONNECT_TIMEOUT_S,
    )
    assert streaming_timeout(3.0).sock_connect == 3.0


def test_out_of_fds():
    key = ConnectionKey("h", 1, False, True, None, None, None)
    for code, own in ((errno.EMFILE, True), (errno.ENFILE, True), (errno.ECONNREFUSED, False)):
        exc = aiohttp.ClientConnectorError(key, OSError(code, "x"))
        assert out_of_fds(exc) is own
