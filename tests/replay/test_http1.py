"""The replay's HTTP/1.1 client against raw loopback servers that misbehave
on purpose: each way an exchange can end becomes the error class a crash
report relies on, and a pooled connection is reused only when that is safe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest

from replayer.replay.client import HTTPTransport
from replayer.replay.http1 import Gate, Pool, request_head, split
from replayer.replay.results import Result, Status
from replayer.replay.transport import Request

pytestmark = pytest.mark.inprocess

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK_BODY = orjson.dumps(
    {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], "usage": {}}
)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


def answer(body: bytes = OK_BODY, *, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> str:
        async def wrapped(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                await handler(r, w)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                w.close()

        server = await asyncio.start_server(wrapped, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    yield start
    for s in servers:
        s.close()
        await s.wait_closed()


async def post(pool: Pool, url: str, body: bytes = b"{}") -> Result:
    r = Result(target="t", row=0, request_id="r", session_id="s", turn=0)
    loop = asyncio.get_running_loop()
    request = Request(
        url, body, {"Content-Type": "application/json"}, r, t0=loop.time(), timeout=10
    )
    await HTTPTransport(pool).handle(request)
    return r


async def posts(url: str, n: int, pool: Pool | None = None) -> tuple[list[Result], int]:
    """``n`` requests one after another; and how many connections they took."""
    pool = pool or Pool()
    try:
        return [await post(pool, url, b'{"n":%d}' % i) for i in range(n)], pool.opened
    finally:
        pool.close()


async def test_keep_alive_carries_requests_on_one_connection(serve):
    seen: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for _ in range(3):
            seen.append(await read_request(r))
            w.write(answer())

    url = await serve(handler)
    results, opened = await posts(url, 3)
    assert [x.status for x in results] == [Status.OK] * 3
    assert opened == 1
    assert [s.rpartition(b"\r\n\r\n")[2] for s in seen] == [b'{"n":0}', b'{"n":1}', b'{"n":2}']
    assert seen[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")


async def test_a_connection_the_server_closed_while_idle_is_not_reused(serve):
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(answer())  # says keep-alive, then closes: uvicorn's idle timeout

    url = await serve(handler)
    pool = Pool()
    lost = asyncio.Event()
    own_lost = pool._lost
    pool._lost = lambda c: (own_lost(c), lost.set())  # type: ignore[method-assign]
    try:
        first = await post(pool, url)
        async with asyncio.timeout(10):
            await lost.wait()
        second = await post(pool, url)
    finally:
        pool.close()
    assert (first.status, second.status, pool.opened) == (Status.OK, Status.OK, 2)


async def test_an_idle_connection_past_the_reuse_window_is_not_reused(serve):
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            w.write(answer())

    url = await serve(handler)
    results, opened = await posts(url, 2, Pool(idle_close=0.0))
    assert [x.status for x in results] == [Status.OK] * 2 and opened == 2


async def test_connection_close_is_honoured(serve):
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(answer(extra=b"Connection: close\r\n"))
        await w.drain()
        await r.read()  # keeps the socket open: only the header says not to reuse it

    url = await serve(handler)
    results, opened = await posts(url, 2)
    assert [x.status for x in results] == [Status.OK] * 2 and opened == 2


async def test_an_early_answer_leaves_the_connection_unused(serve):
    """The server answers before reading the body: the rest of it is still
    queued, and a next request on that connection would be read as its tail."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 2\r\n\r\n{}")
        await w.drain()
        await asyncio.sleep(30)  # never reads the body; the fixture's close ends it

    url = await serve(handler)
    pool = Pool()
    try:
        r = await post(pool, url, b"x" * (64 << 20))
        idle = list(pool._idle.get(split(url).origin, []))
    finally:
        pool.close()
    assert (r.status, r.error_class, idle) == (Status.HTTP_ERROR, "http_413", [])


async def test_chunked_and_close_delimited_bodies(serve):
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(OK_BODY), OK_BODY)

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunked
        )
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + OK_BODY)

    url = await serve(handler)
    results, opened = await posts(url, 2)
    assert [(x.status, x.http_status, x.finish_reason) for x in results] == [
        (Status.OK, 200, "stop")
    ] * 2
    assert opened == 1  # the chunked answer kept it; the close-delimited one ended it


@pytest.mark.parametrize(
    ("reply", "error_class"),
    [
        (b"", "disconnected"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            b'1e\r\ndata: {"choices": []}\r\n\r\n\r\n',
            "stream_cut",
        ),
        (b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"choi', "stream_cut"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "client"),
    ],
    ids=["closed-before-answering", "closed-mid-stream", "closed-mid-body", "not-http"],
)
async def test_how_an_exchange_ends_is_its_error_class(serve, reply, error_class):
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(reply)
        await w.drain()

    url = await serve(handler)
    pool = Pool()
    try:
        r = await post(pool, url)
    finally:
        pool.close()
    assert (r.status, r.error_class) == (Status.TRANSPORT_ERROR, error_class)
    assert r.error


async def test_a_refused_port_is_a_connect_error(serve):
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        pass

    url = await serve(handler)
    pool = Pool()
    server_port = split(url).origin.port
    # A port that was just free: bind one, close it, point there.
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    free = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    assert free != server_port
    try:
        r = await post(pool, f"http://127.0.0.1:{free}/v1/chat/completions")
    finally:
        pool.close()
    assert (r.status, r.error_class, r.http_status) == (Status.TRANSPORT_ERROR, "connect", None)
    assert r.error is not None and r.error.startswith("cannot connect (")


def test_the_head_frames_the_message_and_refuses_injection():
    t = split("http://user@10.0.0.3:8000/v1/messages?beta=true")
    head = request_head(t, {"X-Api-Key": "k", "content-length": "9", "Host": "evil"}, 12)
    assert head == (
        b"POST /v1/messages?beta=true HTTP/1.1\r\nHost: 10.0.0.3:8000\r\n"
        b"Content-Length: 12\r\nAccept: */*\r\nX-Api-Key: k\r\n\r\n"
    )
    with pytest.raises(ValueError, match="line break"):
        request_head(t, {"X-Session": "a\r\nX-Injected: 1"}, 0)
    with pytest.raises(ValueError, match="not an http"):
        split("ftp://10.0.0.3/x")


async def test_the_gate_spreads_writes_over_turns_in_arrival_order():
    """Thirty bodies due in the same millisecond must not all be written in
    one turn of the loop (it would not run its timers and signals
    meanwhile); one larger than the budget still goes, alone."""
    gate = Gate(budget=10)
    ticks = 0
    log: list[tuple[str, int]] = []

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        if ticks < 100:
            asyncio.get_running_loop().call_soon(tick)

    async def write(name: str, size: int) -> None:
        await gate.clear(size)
        log.append((name, ticks))

    asyncio.get_running_loop().call_soon(tick)
    async with asyncio.TaskGroup() as tg:
        for name, size in [("a", 6), ("b", 6), ("c", 3), ("d", 20), ("e", 1)]:
            tg.create_task(write(name, size))
    assert [n for n, _ in log] == ["a", "b", "c", "d", "e"]
    t = dict(log)
    assert t["a"] < t["b"] == t["c"] < t["d"] < t["e"]
