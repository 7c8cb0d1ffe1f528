"""``replayer record`` and ``replayer trace merge`` as a user runs them: real
subprocesses on loopback. A recorder killed with SIGKILL under load leaves a
readable trace holding every exchange completed before the kill; SIGTERM
closes cleanly; a restart writes a new segment and merge re-links the
sessions; a recorded multi-session agent run replays
against a fresh emulator with the same bodies, order and sessions."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from replayer._async import spawn
from replayer.testing.emulator import poll_until
from replayer.trace.reader import Trace

MODEL = "moonshotai/Kimi-K3"


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "replayer", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_error(res, *fragments):
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


class RecorderProcess:
    """``replayer record`` as a subprocess on a free loopback port."""

    def __init__(self, tmp: Path, upstream: str, out: Path, *extra: str) -> None:
        n = len(list(tmp.glob("recorder*.port")))
        self.port_file = tmp / f"recorder{n}.port"
        self.err_path = tmp / f"recorder{n}.stderr"
        cmd = [sys.executable, "-m", "replayer", "record", "--upstream", upstream]
        cmd += ["--listen", "127.0.0.1:0", "-o", str(out), "--port-file", str(self.port_file)]
        cmd += ["--progress", "0", *extra]
        with self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        poll_until(self._bound, 30, what="the recorder's port file")
        self.url = f"http://127.0.0.1:{int(self.port_file.read_text())}"

    def _bound(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"recorder exited {self.proc.returncode}: {self.stderr}")
        return self.port_file.exists() and self.port_file.read_text().endswith("\n")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def recorders():
    started: list[RecorderProcess] = []

    def make(*args, **kw) -> RecorderProcess:
        r = RecorderProcess(*args, **kw)
        started.append(r)
        return r

    yield make
    for r in started:
        r.kill()


class Agent:
    """A chat agent that feeds every reply back, optionally naming its session."""

    def __init__(self, name: str, header: bool) -> None:
        self.name = name
        self.header = header
        self.turn = 0
        self.messages: list[dict] = [
            {"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": f"Task for {name}: make the tests pass."},
        ]

    async def step(self, s: aiohttp.ClientSession, url: str) -> None:
        stream = self.turn % 2 == 1
        body = {"model": MODEL, "messages": self.messages, "max_tokens": 6 + self.turn}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        headers = {"X-Request-Id": f"{self.name}-t{self.turn}"}
        if self.header:
            headers["X-Session-Id"] = self.name
        async with s.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            if stream:
                text = ""
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        ev = orjson.loads(line[6:])
                        if ev["choices"]:
                            text += ev["choices"][0]["delta"].get("content") or ""
                reply = {"role": "assistant", "content": text}
            else:
                reply = (await r.json())["choices"][0]["message"]  # as returned, nulls and all
        self.messages = [
            *self.messages,
            reply,
            {"role": "user", "content": f"{self.name}: result of turn {self.turn} ok"},
        ]
        self.turn += 1

    async def run(self, s: aiohttp.ClientSession, url: str, turns: int) -> None:
        for _ in range(turns):
            await self.step(s, url)


async def run_agents(url: str, agents: list[Agent], turns: int) -> None:
    async with aiohttp.ClientSession() as s, asyncio.TaskGroup() as tg:
        for a in agents:
            tg.create_task(a.run(s, url, turns))


def requests_of(emu) -> list[dict]:
    return [e for e in emu.read_request_log() if e["event"] == "request"]


def test_record_then_replay_delivers_the_same_bodies_order_and_sessions(
    emulator_factory, recorders, tmp_path
):
    first = emulator_factory(["--speed", "instant", "--seed", "5"], log_bodies=True)
    out = tmp_path / "agents.arrow"
    rec = recorders(tmp_path, first.url, out, "--flush-interval", "0.2")
    agents = [Agent(f"hdr{i}", True) for i in range(3)] + [
        Agent(f"auto{i}", False) for i in range(3)
    ]
    asyncio.run(run_agents(rec.url, agents, turns=4))
    assert rec.terminate() == 0
    assert f"stopped; 24 exchanges recorded in {out}" in rec.stderr

    t = Trace.open(out)
    assert len(t) == 24 and not t.torn_tail
    c = t.column
    order = t.order
    ids = [c("request_id")[r] for r in order]
    log1 = {e["request_id"]: e for e in requests_of(first)}
    # recorded bodies are what the first server received, byte for byte
    for r in order:
        e = log1[c("request_id")[r]]
        assert (t.body(r), c("body_sha256")[r]) == (e["body"], e["body_sha256"])
    # sessions: the header names them (as in the first server's log); inferred
    # sessions are exactly the header-less agents, turns in order
    for r in order:
        name, turn = c("request_id")[r].rsplit("-t", 1)
        assert c("turn")[r] == int(turn)
        if name.startswith("hdr"):
            assert c("session_id")[r] == log1[c("request_id")[r]]["session"] == name
        else:
            assert c("session_id")[r] == f"s-{name}-t0"

    second = emulator_factory(["--speed", "instant", "--seed", "5"], log_bodies=True)
    res = run(
        "replay", out, "--target", second.url, "--timing", "asap", "--no-force-stream",
        "--out", tmp_path / "run", "--quiet",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    log2 = requests_of(second)
    assert [e["request_id"] for e in log2] == ids  # the trace's order
    assert [e["body"] for e in log2] == [t.body(r) for r in order]
    assert [e["session"] for e in log2] == [c("session_id")[r] for r in order]
    hdr = [e for e in log2 if e["request_id"].startswith("hdr")]
    assert [e["session"] for e in hdr] == [log1[e["request_id"]]["session"] for e in hdr]


def test_sigkill_under_load_keeps_every_flushed_row(emulator_factory, recorders, tmp_path):
    """What the recorder reported on disk just before a SIGKILL is all in the
    trace, intact (asked of the recorder itself, its live metrics), and so is
    every exchange a client saw complete."""
    emu = emulator_factory(["--speed", "instant", "--disable-uvicorn-access-log"])
    out = tmp_path / "load.arrow"
    rec = recorders(tmp_path, emu.url, out, "--flush-interval", "0.25", "--metrics-port", "0")
    poll_until(lambda: "metrics on http" in rec.stderr, 30, what="the recorder's metrics")
    metrics = re.search(r"metrics on (http://\S+)", rec.stderr).group(1).rstrip("/")
    done: set[str] = set()
    stop = asyncio.Event()

    async def worker(s: aiohttp.ClientSession, w: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            rid = f"w{w}-{n}"
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"worker {w} request {n} " * 20}],
                "max_tokens": 16,
                "stream": n % 2 == 0,
            }
            try:
                async with s.post(
                    f"{rec.url}/v1/chat/completions", json=body, headers={"X-Request-Id": rid}
                ) as r:
                    await r.read()
                    if r.status == 200:
                        done.add(rid)
            except aiohttp.ClientError:
                return  # the recorder is gone

    async def flushed(s: aiohttp.ClientSession) -> int:
        async with s.get(f"{metrics}/metrics") as r:
            text = await r.text()
        return int(float(re.search(r"^replayer_record_rows_flushed_total (\S+)$", text, re.M)[1]))

    async def load() -> int:
        async with aiohttp.ClientSession() as s:
            tasks = [spawn(worker(s, w), name=f"worker{w}") for w in range(8)]
            on_disk = 0
            for _ in range(3000):  # bounded: until 300 rows are on disk
                on_disk = await flushed(s)
                if on_disk >= 300:
                    break
                await asyncio.sleep(0.01)
            on_disk = await flushed(s)
            os.kill(rec.proc.pid, signal.SIGKILL)
            stop.set()
            await asyncio.gather(*tasks)
            return on_disk

    on_disk = asyncio.run(load())
    rec.proc.wait(10)
    assert rec.proc.returncode == -signal.SIGKILL
    t = Trace.open(out)  # readable: complete batches kept, a torn tail dropped
    assert on_disk >= 300 and len(t) >= on_disk
    kept = t.column("request_id")
    # every exchange a client saw complete is in the trace (each is written
    # before its client gets the end; a row whose end the kill kept from its
    # client may be there too: the server had answered it in full)
    assert done <= set(kept)
    assert all(t.outcome(r)["status"] == 200 for r in range(len(t)))
    assert all(t.body(r)["messages"][0]["content"].startswith("worker") for r in range(len(t)))


def test_restart_writes_a_segment_and_merge_relinks_sessions(emulator_factory, recorders, tmp_path):
    emu = emulator_factory(["--speed", "instant"])
    out = tmp_path / "rec.arrow"
    a, b = Agent("auto", False), Agent("named", True)
    rec = recorders(tmp_path, emu.url, out)
    asyncio.run(run_agents(rec.url, [a, b], turns=2))
    assert rec.terminate() == 0
    rec2 = recorders(tmp_path, emu.url, out)
    seg = tmp_path / "rec.1.arrow"
    asyncio.run(run_agents(rec2.url, [a, b], turns=2))
    assert rec2.terminate() == 0
    assert f"{out} exists: recording to a new segment, {seg}" in rec2.stderr
    assert "replayer trace merge" in rec2.stderr
    assert Trace.open(out).provenance["segment"] == 0
    s1 = Trace.open(seg)
    assert s1.provenance["segment"] == 1
    # the second recorder never saw turn 0-1 of the unnamed conversation
    assert sorted(set(s1.column("session_id"))) == ["named", "s-auto-t2"]

    merged = tmp_path / "merged.arrow"
    res = run("trace", "merge", out, seg, "-o", merged)
    assert res.returncode == 0, res.stderr
    assert "merged 8 requests from 2 segment(s)" in res.stderr and "2 re-linked" in res.stderr
    m = Trace.open(merged)
    c = m.column
    starts = [c("start_us")[r] for r in range(len(m))]
    assert starts == sorted(starts) and m.form == "file"
    got = {(c("request_id")[r], c("session_id")[r], c("turn")[r]) for r in range(len(m))}
    want = {(f"auto-t{k}", "s-auto-t0", k) for k in range(4)}
    want |= {(f"named-t{k}", "named", k) for k in range(4)}
    assert got == want
    # bodies survive the merge
    for r in range(len(m)):
        rid = c("request_id")[r]
        src = Trace.open(out if rid[-1] in "01" else seg)
        assert m.body(r) == src.body(src.row_of(rid))

    res = run("trace", "merge", out, seg, "-o", merged)
    assert_one_line_error(res, "already exists")


@pytest.mark.inprocess
@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--upstream", "ftp://x"], "--upstream wants http://"),
        (["--upstream", "http://x", "--redact", "("], "--redact bad regular expression"),
        (["--upstream", "http://x", "--listen", "here"], "--listen wants HOST:PORT"),
        (["--upstream", "http://x", "--flush-interval", "0"], "--flush-interval must be positive"),
    ],
)
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, extra, fragment):
    from replayer.cli import main

    out = tmp_path / "x.arrow"
    assert main(["record", "-o", str(out), *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert (
        len(lines) == 1 and lines[0].startswith("replayer record: error: ") and fragment in lines[0]
    )
    assert not out.exists()


def test_merge_of_a_missing_file_is_a_one_line_error(tmp_path):
    res = run("trace", "merge", tmp_path / "missing.arrow", "-o", tmp_path / "m.arrow")
    assert_one_line_error(res, "no such file")


def test_port_in_use_is_a_one_line_error_and_leaves_no_file(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = tmp_path / "x.arrow"
        res = run("record", "--upstream", "http://127.0.0.1:9", "--listen", str(port), "-o", out)
    assert_one_line_error(res, "cannot listen on 127.0.0.1")
    assert not out.exists()
