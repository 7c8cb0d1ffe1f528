"""The fault proxy in front of a real emulator: each fault is what a socket
client sees (an RST, not a FIN; silence with the connection open; a pause;
a refused connect), on exactly the requests its rule picks."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from replayer.testing.faultproxy import Fault, FaultKind, FaultProxy
from tests.helpers.emulator import MODEL

pytestmark = pytest.mark.e2e

BOUND = 20.0


def request(stream: bool = True, tokens: int = 64) -> bytes:
    body = orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": tokens,
            "stream": stream,
        }
    )
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def exchange(url: str, raw: bytes) -> tuple[bytes, BaseException | None]:
    """Send ``raw`` (``Connection: close``) on a new connection; everything
    read until EOF or an error (which is returned), bounded."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    got = bytearray()
    err: BaseException | None = None
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(BOUND):
            for _ in range(10_000):
                chunk = await reader.read(65536)
                if not chunk:
                    break
                got += chunk
    except (ConnectionError, TimeoutError) as exc:
        err = exc
    finally:
        writer.close()
    return bytes(got), err


@pytest.fixture
def emu(emulator_factory):
    return emulator_factory(["--speed", "instant"])


async def test_passthrough_relays_every_byte_and_logs_the_request(emu):
    async with FaultProxy(emu.url) as proxy:
        direct, _ = await exchange(emu.url, request())
        got, err = await exchange(proxy.url, request())
    assert err is None
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert got.count(b"data: ") == direct.count(b"data: ")
    assert [(e.method, e.path, e.fault) for e in proxy.events] == [
        ("POST", "/v1/chat/completions", FaultKind.PASS)
    ]


async def test_reset_sends_an_rst_after_exactly_after_bytes(emu):
    async with FaultProxy(emu.url) as proxy:
        proxy.on(Fault.reset(after_bytes=300))
        got, err = await exchange(proxy.url, request())
    assert isinstance(err, ConnectionResetError)  # an RST: a FIN would read as b""
    assert len(got) == 300 and got.startswith(b"HTTP/1.1 200")


async def test_half_open_goes_silent_without_closing(emu):
    async with FaultProxy(emu.url) as proxy:
        proxy.on(Fault.half_open(after_bytes=250))
        host, port = proxy.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request())
        got = await reader.readexactly(250)
        with pytest.raises(TimeoutError):  # nothing more, and no EOF either
            async with asyncio.timeout(1.0):
                await reader.read(1)
        assert not reader.at_eof()
        await proxy.close()  # the proxy's close drops it
        async with asyncio.timeout(BOUND):
            with pytest.raises(ConnectionResetError):
                await reader.read(1)
        writer.close()
    assert got.startswith(b"HTTP/1.1 200")


async def test_stall_holds_the_rest_for_its_seconds_then_relays_it(emu):
    async with FaultProxy(emu.url) as proxy:
        proxy.on(Fault.stall(1.5, after_bytes=200))
        host, port = proxy.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request())
        async with asyncio.timeout(BOUND):
            first = await reader.readexactly(200)
            t = time.monotonic()
            rest = await reader.read(1)
            waited = time.monotonic() - t
            for _ in range(10_000):
                chunk = await reader.read(65536)
                if not chunk:
                    break
                rest += chunk
        writer.close()
    assert waited >= 1.4
    assert first.startswith(b"HTTP/1.1 200") and rest.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")


async def test_refuse_resets_the_request_and_refuses_connects_for_a_while(emu):
    async with FaultProxy(emu.url) as proxy:
        proxy.on(Fault.refuse(1.0))
        got, err = await exchange(proxy.url, request())
        assert got == b"" and isinstance(err, ConnectionResetError)
        host, port = proxy.url.removeprefix("http://").split(":")
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(host, int(port))
        for _ in range(int(BOUND / 0.05)):  # until it listens again, bounded
            if proxy.listening:
                break
            await asyncio.sleep(0.05)
        again, err = await exchange(proxy.url, request())
    assert err is None and again.startswith(b"HTTP/1.1 200")
    assert proxy.refused == 1
    assert [e.fault for e in proxy.events] == [FaultKind.REFUSE, FaultKind.PASS]
    assert len(emu.read_request_log()) >= 1  # only the second reached the server


async def test_a_rule_picks_its_nth_matching_request_across_connections(emu):
    async with FaultProxy(emu.url) as proxy:
        proxy.on(Fault.reset(), path="/v1/chat", nth=2, times=2)
        results = []
        for _ in range(4):
            results.append(await exchange(proxy.url, request(stream=False, tokens=4)))
        health, err = await exchange(
            proxy.url, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    assert [isinstance(e, ConnectionResetError) for _, e in results] == [
        False,
        True,
        True,
        False,
    ]
    assert [e.fault for e in proxy.events] == [
        FaultKind.PASS,
        FaultKind.RESET,
        FaultKind.RESET,
        FaultKind.PASS,
        FaultKind.PASS,
    ]
    assert proxy.events[-1].path == "/health" and health.startswith(b"HTTP/1.1 200")


def test_bad_scripts_are_refused():
    with pytest.raises(ValueError, match="want http://HOST:PORT"):
        FaultProxy("127.0.0.1:80")
    with pytest.raises(ValueError, match="count from 1"):
        FaultProxy("http://127.0.0.1:1").on(Fault.reset(), nth=0)
    with pytest.raises(ValueError, match="negative"):
        Fault.stall(-1)
