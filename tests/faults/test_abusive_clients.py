"""Abusive HTTP clients against ``replayer record`` (in front of the emulator)
and ``replayer serve``, both real subprocesses on loopback.

Every abuse gets its answer within a bounded time: a head trickled in a byte
at a time, an idle connection and a body that stops coming are cut after
``$REPLAYER_CLIENT_TIMEOUT`` (no response: nothing to answer); oversized
heads get 400 and a closed connection; a declared body past the limit 413
before a byte of it is read; malformed chunking 400, or a cut when it comes
mid-body; a client vanishing mid-body leaves no row. A process started with
a soft open-files limit of 1,024 holds 1,000 idle connections. Meanwhile
sessions sent through the recorder by the official ``openai`` SDK are
recorded intact: the trace holds exactly what the client sent and received,
and nothing else, and neither process writes a traceback.

The abusive clients are raw asyncio streams; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from replayer._http import ClientDeadline
from replayer.record.proxy import MAX_BODY
from replayer.service.launcher import ServeProcess
from replayer.testing.emulator import EmulatorProcess, poll_until
from replayer.trace.reader import Trace
from tests.helpers.target import with_soft_nofile

MODEL = "moonshotai/Kimi-K3"
TOKEN = "abuse-token-0123456789abcdef"
WAIT = 2.0
"""``$REPLAYER_CLIENT_TIMEOUT`` of the abuse tests."""
CUT_BY = WAIT + 1.0 + 12.0
"""A cut must come by then: the timeout, one sweep, a busy machine's slack."""
IDLE = 1000
SOFT_NOFILE = 1024
"""The soft open-files limit the processes start with (a common default)."""
PROBES = 3
"""Descriptors the open-files baseline may hold that close meanwhile (a
readiness probe's connection)."""
RSS_BOUND_KIB = 200 << 10
"""A sanity bound on what 1,000 idle connections may add (bench/idle_conns.py
measures the real figure)."""

Turns = list[tuple[list[Any], str]]


# -- processes ------------------------------------------------------------------------


class Recorder:
    """One ``replayer record`` subprocess, started with a soft limit of 1,024 files."""

    def __init__(self, upstream: str, out: Path, *, wait: float) -> None:
        self.out = out
        self.port_file = out.with_suffix(".port")
        self.log_path = out.with_suffix(".log")
        cmd = [sys.executable, "-m", "replayer", "record", "--upstream", upstream, "-o", str(out)]
        cmd += ["--listen", "127.0.0.1:0", "--port-file", str(self.port_file), "--progress", "0"]
        cmd += ["--flush-interval", "0.2"]
        env = {**os.environ, "REPLAYER_CLIENT_TIMEOUT": str(wait)}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                with_soft_nofile(cmd, SOFT_NOFILE),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )

        def bound() -> bool:
            assert self.proc.poll() is None, f"record exited: {self.log()}"
            return self.port_file.exists() and self.port_file.read_text().endswith("\n")

        try:
            poll_until(bound, 60, interval=0.05, what="the recorder's port file")
        except BaseException:
            self.proc.kill()
            self.proc.wait(10)
            raise
        self.port = int(self.port_file.read_text())
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"record did not stop on SIGTERM: {self.log()}") from None


class SoftServe(ServeProcess):
    """``replayer serve`` started with a soft limit of 1,024 files."""

    def command(self) -> list[str]:
        return with_soft_nofile(super().command(), SOFT_NOFILE)


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorProcess]:
    with EmulatorProcess(["--speed", "instant"]) as emu:
        yield emu


@contextlib.contextmanager
def recorder(emulator: EmulatorProcess, out: Path, *, wait: float = WAIT) -> Iterator[Recorder]:
    rec = Recorder(emulator.url, out, wait=wait)
    try:
        yield rec
    except BaseException:
        rec.stop()
        raise
    assert rec.stop() == 0, rec.log()


def serve(tmp_path: Path, *, wait: float = WAIT, soft: bool = False) -> ServeProcess:
    """``replayer serve`` with uploads limited to 1 MiB."""
    env = {"REPLAYER_CLIENT_TIMEOUT": str(wait)}
    kind = SoftServe if soft else ServeProcess
    args = ["--max-upload", str(1 << 20)]
    return kind(tmp_path / "data", token=TOKEN, args=args, env=env, startup_timeout=60)


def proc_status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` figure (``VmRSS``: kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def soft_and_hard_nofile(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError(f"no open-files line in /proc/{pid}/limits")


def no_traceback(log: str) -> None:
    assert "Traceback" not in log, log[-3000:]
    assert "ERROR" not in log, log[-3000:]


# -- abusive clients ------------------------------------------------------------------


async def exchange(
    port: int, *parts: bytes, gap: float = 0.3, bound: float = CUT_BY
) -> tuple[bytes, float]:
    """Send ``parts`` (``gap`` s apart), then read until the server closes.
    What came back, and seconds from the last part to the close; an
    AssertionError if it stays open past ``bound``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i, part in enumerate(parts):
            if i:
                # apart, so the server most likely reads them apart (a body's
                # second half after its handler started); no outcome depends on it
                await asyncio.sleep(gap)
            writer.write(part)
            await writer.drain()
        t0 = time.monotonic()
        got = bytearray()
        with contextlib.suppress(ConnectionResetError):
            async with asyncio.timeout(bound):
                while data := await reader.read(1 << 16):
                    got += data
        return bytes(got), time.monotonic() - t0
    except TimeoutError:
        raise AssertionError(f"connection still open {bound} s after its last bytes") from None
    finally:
        writer.close()


async def trickle(port: int, *, every: float = 0.1, bound: float = CUT_BY) -> tuple[bytes, float]:
    """A slowloris: a request head one byte every ``every`` s, never
    finished. What came back and the seconds until the server cut it; an
    AssertionError if it did not within ``bound``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    try:
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        for _ in range(int(bound / every) + 1):
            try:
                writer.write(b"z")
                await writer.drain()
                data = await asyncio.wait_for(reader.read(1 << 16), every)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            return data, time.monotonic() - t0
        raise AssertionError(f"a head trickled for {bound} s was not cut")
    finally:
        writer.close()


async def vanish(port: int, data: bytes) -> None:
    """Send ``data`` (a request cut short) and go away."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    writer.close()
    await writer.wait_closed()


def status(raw: bytes) -> int:
    assert raw.startswith(b"HTTP/1."), raw[:200]
    return int(raw.split(b" ", 2)[1])


def head(method: str, path: str, *lines: str) -> bytes:
    text = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{h}\r\n" for h in lines)
    return (text + "\r\n").encode()


def open_idle(port: int, n: int) -> list[socket.socket]:
    socks = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.setblocking(False)  # still_open peeks without waiting
            socks.append(s)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


def still_open(s: socket.socket) -> bool:
    """Open and silent: nothing to read, no EOF."""
    try:
        return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


@pytest.fixture
def many_files() -> None:
    """This process holds 1,000 client sockets too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 4 * IDLE:
        want = 4 * IDLE if hard == resource.RLIM_INFINITY else min(hard, 4 * IDLE)
        if want < 2 * IDLE:
            pytest.skip(f"the open-files hard limit ({hard}) is too low for {IDLE} sockets")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# -- the well-behaved client ------------------------------------------------------------


async def chat(base_url: str, sid: str, turns: int = 2) -> Turns:
    """A conversation through the official SDK (odd turns streamed): the
    messages sent and the reply received, turn by turn."""
    client = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1",
        api_key="sk-abuse",
        max_retries=0,
        timeout=60,
        default_headers={"X-Session-Id": sid},
    )
    messages: list[Any] = [{"role": "user", "content": f"{sid}: fix the build. " * 20}]
    out: Turns = []
    try:
        for turn in range(turns):
            if turn % 2:
                stream = await client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=8, stream=True
                )
                text = "".join(
                    [c.choices[0].delta.content or "" async for c in stream if c.choices]
                )
            else:
                r = await client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=8
                )
                text = r.choices[0].message.content or ""
            assert text
            out.append(([dict(m) for m in messages], text))
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"{sid}: and turn {turn + 1}?"},
            ]
    finally:
        await client.close()
    return out


def assert_recorded(path: Path, sessions: dict[str, Turns]) -> None:
    """The trace holds these sessions, as sent and received, and nothing else."""
    t = Trace.open(path)
    sid = t.column("session_id")
    rows: dict[str, list[int]] = {}
    for r in t.order:
        rows.setdefault(sid[r], []).append(r)
    assert set(rows) == set(sessions)
    for name, turns in sessions.items():
        got = [(t.body(r)["messages"], t.outcome(r)["output_text"]) for r in rows[name]]
        assert got == [(sent, reply) for sent, reply in turns]
        assert {t.outcome(r)["status"] for r in rows[name]} == {200}
        assert all((t.meta(r) or {}).get("abandoned") is None for r in rows[name])


# -- the recorder -----------------------------------------------------------------------


@pytest.mark.e2e
async def test_recorder_cuts_slow_heads_and_idle_connections_and_records_the_rest(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    with recorder(emulator, tmp_path / "t.arrow") as rec:
        slow1, slow2, quiet, turns = await asyncio.gather(
            trickle(rec.port),
            trickle(rec.port, every=0.5),
            exchange(rec.port, b""),
            chat(rec.url, "during-slowloris", 3),
        )
        # one sweep late at most, and nothing sent back: there is no request to answer
        for got, secs in (slow1, slow2):
            assert got == b""
            assert WAIT * 0.9 <= secs <= CUT_BY
        assert quiet[0] == b"" and WAIT * 0.9 <= quiet[1] <= CUT_BY
        # after the cuts it serves as before
        after = await chat(rec.url, "after-slowloris", 2)
    no_traceback(rec.log())
    assert_recorded(rec.out, {"during-slowloris": turns, "after-slowloris": after})


@pytest.mark.e2e
async def test_recorder_refuses_oversized_heads_with_400_and_closes(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    with recorder(emulator, tmp_path / "t.arrow") as rec:
        long_line = head("GET", "/v1/models?q=" + "a" * 70_000)
        long_field = head("GET", "/v1/models", "X-Big: " + "b" * 70_000)
        many = head("GET", "/v1/models", *(f"X-H{i}: v" for i in range(200)))
        answers = await asyncio.gather(
            *(exchange(rec.port, h) for h in (long_line, long_field, many))
        )
        turns = await chat(rec.url, "beside-big-heads")
    assert [status(got) for got, _ in answers] == [400, 400, 400]
    assert [b"Too many headers" in got for got, _ in answers] == [False, False, True]
    no_traceback(rec.log())
    assert_recorded(rec.out, {"beside-big-heads": turns})


@pytest.mark.e2e
async def test_recorder_refuses_a_body_past_its_limit_before_reading_it(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    before = len(emulator.events("request"))
    with recorder(emulator, tmp_path / "t.arrow") as rec:
        over = MAX_BODY + 1
        ct = "Content-Type: application/json"
        plain = head("POST", "/v1/chat/completions", ct, f"Content-Length: {over}")
        expect = head(
            "POST", "/v1/completions", ct, f"Content-Length: {over}", "Expect: 100-continue"
        )
        other = head("PUT", "/v1/files", f"Content-Length: {over}")
        sent = b'{"model": "' + b"m" * 4096  # a first slice of the body, then nothing
        answers = await asyncio.gather(
            exchange(rec.port, plain + sent),
            exchange(rec.port, expect),
            exchange(rec.port, other),
            chat(rec.url, "beside-big-bodies"),
        )
    *refused, turns = answers
    for got, _ in refused:
        # 413 at once, never "100 Continue" first; the envelope says the limit
        assert got.startswith(b"HTTP/1.1 413 "), got[:200]
        assert b"Connection: close" in got
        assert f"exceeds the limit of {MAX_BODY:,}".encode() in got
    no_traceback(rec.log())
    assert_recorded(rec.out, {"beside-big-bodies": turns})
    assert len(emulator.events("request")) - before == len(turns)


@pytest.mark.e2e
async def test_recorder_answers_malformed_chunking_400_or_cuts_it(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    before = len(emulator.events("request"))
    te = "Transfer-Encoding: chunked"
    with recorder(emulator, tmp_path / "t.arrow") as rec:
        start = head("POST", "/v1/chat/completions", "Content-Type: application/json", te)
        at_once, later, turns = await asyncio.gather(
            # the parser sees it before the request is handed on: 400
            exchange(rec.port, start + b"zz\r\n{}\r\n0\r\n\r\n"),
            # a good chunk, then a bad size while the handler reads the body
            exchange(rec.port, start + b"1\r\n{\r\n", b"zz\r\n}\r\n0\r\n\r\n"),
            chat(rec.url, "beside-bad-chunks"),
        )
    assert status(at_once[0]) == 400
    assert b"Invalid character in chunk size" in at_once[0]
    # aiohttp's C parser leaves that body waiting for ever: the body deadline
    # cuts it (400 if both parts came in one read, as if sent at once)
    assert later[0] == b"" or status(later[0]) == 400
    assert later[1] <= CUT_BY
    no_traceback(rec.log())
    assert_recorded(rec.out, {"beside-bad-chunks": turns})
    assert len(emulator.events("request")) - before == len(turns)


@pytest.mark.e2e
async def test_client_vanishing_mid_body_leaves_no_row(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    before = len(emulator.events("request"))
    ct = "Content-Type: application/json"
    with recorder(emulator, tmp_path / "t.arrow") as rec:
        for framing in ("Content-Length: 8192", "Transfer-Encoding: chunked"):
            body = b'{"model": "m", "messages": [{"role": "user", "content": "half'
            if "chunked" in framing:
                body = f"{len(body):x}\r\n".encode() + body + b"\r\n"
            await vanish(rec.port, head("POST", "/v1/chat/completions", ct, framing) + body)
        turns = await chat(rec.url, "after-vanishing")
    no_traceback(rec.log())
    assert_recorded(rec.out, {"after-vanishing": turns})
    assert len(emulator.events("request")) - before == len(turns)


@pytest.mark.e2e
async def test_recorder_holds_1000_idle_connections_from_a_1024_file_limit(
    emulator: EmulatorProcess, tmp_path: Path, many_files: None
) -> None:
    # a client timeout longer than the test: the idle connections must stay
    with recorder(emulator, tmp_path / "t.arrow", wait=600) as rec:
        soft, hard = soft_and_hard_nofile(rec.pid)
        assert soft == hard  # raised at start-up from 1,024
        rss0, files0 = proc_status(rec.pid, "VmRSS"), open_files(rec.pid)
        socks = await asyncio.to_thread(open_idle, rec.port, IDLE)
        try:
            # accepted, not just queued in the listen backlog; then 12 sessions
            # (24 more descriptors) pass 1,024 open files
            poll_until(
                lambda: open_files(rec.pid) >= files0 + IDLE - PROBES,
                60,
                interval=0.05,
                what=f"the recorder to accept {IDLE} connections",
            )
            sessions = [f"idle-{i}" for i in range(12)]
            runs = await asyncio.gather(*(chat(rec.url, s, 3) for s in sessions))
            assert all(still_open(s) for s in socks)
            grown = proc_status(rec.pid, "VmRSS") - rss0
            assert grown < RSS_BOUND_KIB, f"RSS grew {grown} kB with {IDLE} idle connections"
        finally:
            for s in socks:
                s.close()
    no_traceback(rec.log())
    assert_recorded(rec.out, dict(zip(sessions, runs, strict=True)))


# -- the service ------------------------------------------------------------------------


async def traces_listed(srv: ServeProcess) -> set[str]:
    async with httpx.AsyncClient(base_url=srv.url, headers=srv.auth, timeout=30) as c:
        r = await c.get("/api/traces")
        jobs = await c.get("/api/jobs")
    assert (r.status_code, jobs.status_code) == (200, 200)
    return {t["name"] for t in r.json()["traces"]}


@pytest.mark.e2e
async def test_service_cuts_slow_clients_and_refuses_bad_requests(tmp_path: Path) -> None:
    auth = f"Authorization: Bearer {TOKEN}"
    with serve(tmp_path) as srv:
        port = srv.port or 0
        upload = head("PUT", "/api/traces/big.arrow", auth, f"Content-Length: {2 << 20}")
        chunked = head("PUT", "/api/traces/chunky.arrow", auth, "Transfer-Encoding: chunked")
        megabyte = b"100000\r\n" + b"\0" * (1 << 20) + b"\r\n"
        bad = head("PUT", "/api/traces/bad.arrow", auth, "Transfer-Encoding: chunked")
        half = head("PUT", "/api/traces/half.arrow", auth, "Content-Length: 4096")
        gone = head("PUT", "/api/traces/gone.arrow", auth, "Content-Length: 4096")
        job = head("POST", "/api/jobs", auth, "Content-Type: application/json",
                   f"Content-Length: {2 << 20}")  # fmt: skip
        abuse = asyncio.gather(
            trickle(port),
            exchange(port, b""),
            exchange(port, head("GET", "/healthz", "X-Big: " + "b" * 70_000)),
            exchange(port, upload),
            exchange(port, chunked + megabyte, megabyte + megabyte),
            exchange(port, bad + b"4\r\nARRO\r\n", b"zz\r\n"),
            exchange(port, half + b"ARROW1"),
            exchange(port, job + b'{"kind": "replay"'),
        )
        answers, listed_meanwhile, _ = await asyncio.gather(
            abuse, traces_listed(srv), vanish(port, gone + b"ARROW1")
        )
        slow, quiet, big_head, too_big, too_long, bad_chunks, stalled, big_job = answers
        assert slow[0] == b"" and WAIT * 0.9 <= slow[1] <= CUT_BY
        assert quiet[0] == b"" and WAIT * 0.9 <= quiet[1] <= CUT_BY
        assert status(big_head[0]) == 400
        assert status(too_big[0]) == 413 and b"1,048,576" in too_big[0]
        assert status(too_long[0]) == 413 and b"Connection: close" in too_long[0]
        # a bad size mid-body: the body deadline cuts what aiohttp leaves waiting
        assert bad_chunks[0] == b"" or status(bad_chunks[0]) == 400
        assert bad_chunks[1] <= CUT_BY
        assert stalled[0] == b"" and WAIT * 0.9 <= stalled[1] <= CUT_BY
        # a JSON body past its limit: 413 on its declared length, never read
        # (the server then lingers a little, as HTTP servers do, so the
        # client reads its answer before the close)
        assert status(big_job[0]) == 413 and b"Connection: close" in big_job[0]
        assert b"the body exceeds 1,048,576 bytes" in big_job[0]
        # still serving; nothing of the refused or cut uploads kept
        assert listed_meanwhile == set() == await traces_listed(srv)
    no_traceback(srv.log())
    leftovers = [p.name for p in (tmp_path / "data" / "traces").rglob("*") if p.is_file()]
    assert leftovers == []


@pytest.mark.e2e
async def test_service_holds_1000_idle_connections_from_a_1024_file_limit(
    tmp_path: Path, many_files: None
) -> None:
    with serve(tmp_path, wait=600, soft=True) as srv:
        pid = srv.proc.pid if srv.proc is not None else 0
        soft, hard = soft_and_hard_nofile(pid)
        assert soft == hard
        rss0, files0 = proc_status(pid, "VmRSS"), open_files(pid)
        socks = await asyncio.to_thread(open_idle, srv.port or 0, IDLE)
        try:
            poll_until(
                lambda: open_files(pid) >= files0 + IDLE - PROBES,
                60,
                interval=0.05,
                what=f"serve to accept {IDLE} connections",
            )
            # 20 requests at once, each on its own connection: past 1,024 open files
            async with httpx.AsyncClient(base_url=srv.url, headers=srv.auth, timeout=30) as c:
                answers = await asyncio.gather(*(c.get("/api/jobs") for _ in range(20)))
            assert {r.status_code for r in answers} == {200}
            assert all(still_open(s) for s in socks)
            grown = proc_status(pid, "VmRSS") - rss0
            assert grown < RSS_BOUND_KIB, f"RSS grew {grown} kB with {IDLE} idle connections"
        finally:
            for s in socks:
                s.close()
    no_traceback(srv.log())


@pytest.mark.parametrize("value", ["abc", "-1"])
def test_a_bad_client_timeout_is_one_line_and_exit_2(tmp_path: Path, value: str) -> None:
    env = {**os.environ, "REPLAYER_CLIENT_TIMEOUT": value, "REPLAYER_SERVE_TOKEN": TOKEN}
    line = f"$REPLAYER_CLIENT_TIMEOUT={value!r}: want a positive number of seconds"
    out = tmp_path / "t.arrow"
    runs = {
        "record": ["--upstream", "http://127.0.0.1:9", "-o", str(out), "--listen", "127.0.0.1:0"],
        "serve": ["--data", str(tmp_path / "data"), "--port", "0"],
    }
    for command, args in runs.items():
        cmd = [sys.executable, "-m", "replayer", command, *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        assert (done.returncode, done.stderr) == (2, f"replayer {command}: error: {line}\n")
    assert not out.exists()  # the claimed trace file is not left behind


async def test_a_response_still_going_out_is_not_cut() -> None:
    """A slow reader of a big response (a bundle download) is not an idle
    client: the head deadline waits for the response to leave."""
    body = os.urandom(16 << 20)

    async def big(request: web.BaseRequest) -> web.Response:
        return web.Response(body=body)

    server = web.Server(big)
    runner = web.ServerRunner(server)
    await runner.setup()
    deadline = ClientDeadline(server, 0.2).start()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head("GET", "/big"))
        await writer.drain()
        got = bytearray(await reader.readuntil(b"\r\n\r\n"))
        # the client stops reading for many times the deadline (the response
        # fills the socket buffers and waits in the server's)
        await asyncio.sleep(1.5)
        async with asyncio.timeout(CUT_BY):
            while len(got) < len(body) and (data := await reader.read(1 << 20)):
                got += data
        writer.close()
        assert bytes(got).endswith(body[-(1 << 20) :])
        assert deadline.cut == 0
    finally:
        deadline.stop()
        await runner.cleanup()
