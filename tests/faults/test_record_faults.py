"""``replayer record`` under faults, as a user runs it (real subprocesses on
loopback, real SDK clients): SIGKILL at any instant never loses an exchange a
client saw complete, and a disk that fills while traffic flows stops the
recording, loudly, without holding or failing a single response."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import openai
import pytest

from replayer._async import spawn
from replayer.errors import TraceError
from replayer.testing.emulator import EmulatorProcess, poll_until
from replayer.trace.reader import Trace
from tests.helpers.cli import run
from tests.helpers.disk import fill, small_disk

MODEL = "moonshotai/Kimi-K3"
BOUND = 30.0
"""Seconds any one wait may take before it counts as a hang."""


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorProcess]:
    """One emulator for every run: 10 ms a token, so streams are in flight
    (80-250 ms each) when a kill lands."""
    args = ["--decode-time", "0.01", "--disable-uvicorn-access-log", "--stats-interval", "0"]
    with EmulatorProcess(args, request_log=False) as emu:
        yield emu


class Recorder:
    """``replayer record`` as a subprocess; its port is known once it listens.
    Its port and stderr files go in ``files`` (not beside a trace on a full disk)."""

    def __init__(self, upstream: str, out: Path, files: Path, *extra: str) -> None:
        self.port_file = files / f"{out.name}.port"
        self.err_path = files / f"{out.name}.stderr"
        cmd = [sys.executable, "-m", "replayer", "record", "--upstream", upstream]
        cmd += ["--listen", "127.0.0.1:0", "-o", str(out), "--port-file", str(self.port_file)]
        cmd += ["--progress", "0", "--drain", "5", *extra]
        with self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)

    @property
    def url(self) -> str | None:
        """The recorder's URL once it listens (None before)."""
        with contextlib.suppress(OSError, ValueError):
            text = self.port_file.read_text()
            if text.endswith("\n"):
                return f"http://127.0.0.1:{int(text)}"
        return None

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(BOUND)


@dataclass
class Clients:
    """SDK clients that loop until the recorder is gone, each adding a
    request's marker to ``complete`` only after it had the whole response."""

    url: str
    run: int
    complete: set[str] = field(default_factory=set)
    sent: int = 0

    async def chat_stream(self, rid: str) -> None:
        client = openai.AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key="sk-x", max_retries=0, timeout=BOUND
        )
        async with client:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"marker {rid}"}],
                max_tokens=8 + len(rid) % 17,
                stream=True,
                extra_headers={"X-Request-Id": rid},
            )
            finish = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            if finish is not None:  # the stream ran to its end
                self.complete.add(rid)

    async def chat_json(self, rid: str) -> None:
        client = openai.AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key="sk-x", max_retries=0, timeout=BOUND
        )
        async with client:
            r = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"marker {rid}"}],
                max_tokens=8,
                extra_headers={"X-Request-Id": rid},
            )
            if r.choices[0].finish_reason:
                self.complete.add(rid)

    async def messages_stream(self, rid: str) -> None:
        client = anthropic.AsyncAnthropic(
            base_url=self.url, api_key="sk-x", max_retries=0, timeout=BOUND
        )
        async with client:
            stream = await client.messages.create(
                model=MODEL,
                max_tokens=8 + len(rid) % 13,
                messages=[{"role": "user", "content": f"marker {rid}"}],
                stream=True,
                extra_headers={"X-Request-Id": rid},
            )
            stopped = False
            async for event in stream:
                stopped = stopped or event.type == "message_stop"
            if stopped:
                self.complete.add(rid)

    async def agent(self, name: str, call: Callable[[str], Awaitable[None]]) -> None:
        for n in range(10_000):  # bounded; ends when the recorder goes away
            rid = f"k{self.run}-{name}-{n}"
            self.sent += 1
            try:
                await call(rid)
            except (openai.APIError, anthropic.APIError):
                return  # the recorder is gone (or going): no marker for this one

    async def run_all(self) -> None:
        agents = [
            ("chat", self.chat_stream),
            ("chat2", self.chat_stream),
            ("json", self.chat_json),
            ("msgs", self.messages_stream),
            ("msgs2", self.messages_stream),
        ]
        async with asyncio.TaskGroup() as tg:
            for name, call in agents:
                tg.create_task(self.agent(name, call))


# (phase, seed): where in the recorder's life the kill lands. Start-up kills
# fall anywhere from exec to the first exchanges; steady ones after a random
# stretch of traffic; clean-up ones in the 0.15 s after SIGINT (the drain,
# the final write, the exit; a kill that comes after the exit checks the
# clean stop's trace instead).
RUNS = [
    *(("start-up", s) for s in (11, 23, 37, 41, 59, 61)),
    *(("steady", s) for s in (2, 3, 5, 7, 13, 17, 19, 29)),
    *(("clean-up", s) for s in (31, 43, 47, 53, 67, 71)),
]


async def kill_run(rec: Recorder, k: int, phase: str, seed: int) -> Clients | None:
    """Traffic through ``rec`` from when it listens, SIGKILL at the seeded
    instant of ``phase``; the clients that ran (None: it never listened)."""
    rng = random.Random(seed)
    started = time.monotonic()
    clients: Clients | None = None
    traffic: asyncio.Task[None] | None = None
    try:
        if phase == "start-up":
            kill_at = started + rng.uniform(0.0, 2.5)
        else:
            deadline = started + BOUND
            while rec.url is None:
                assert rec.proc.poll() is None, f"recorder exited: {rec.stderr}"
                assert time.monotonic() < deadline, "the recorder never listened"
                await asyncio.sleep(0.01)
            kill_at = time.monotonic() + rng.uniform(0.2, 1.5)
        sigint_at = None
        if phase == "clean-up":
            sigint_at = kill_at
            kill_at = sigint_at + rng.uniform(0.0, 0.15)
        while time.monotonic() < kill_at:  # bounded: kill_at is at most ~2.5 s away
            if traffic is None and (url := rec.url) is not None:
                clients = Clients(url, k)
                traffic = spawn(clients.run_all(), name=f"traffic{k}")
            if sigint_at is not None and time.monotonic() >= sigint_at:
                rec.proc.send_signal(signal.SIGINT)
                sigint_at = None
            await asyncio.sleep(0.005)
        rec.kill()  # SIGKILL (unless a clean-up run exited first)
        if traffic is not None:
            async with asyncio.timeout(BOUND):
                await traffic
    finally:
        rec.kill()
        if traffic is not None and not traffic.done():
            traffic.cancel()
    return clients


HOLDS_NOTHING = ("empty file, not a trace", "nothing left to read")
"""What the reader says of a segment killed before its first batch was
whole: it holds no exchange (none was written, so none was seen complete)."""


def rows_of(segment: Path) -> set[str]:
    try:
        return set(Trace.open(segment).column("request_id"))
    except TraceError as exc:
        if any(s in str(exc) for s in HOLDS_NOTHING):
            return set()
        raise


@pytest.mark.slow
def test_sigkill_anywhere_loses_no_exchange_a_client_saw_complete(emulator, tmp_path):
    """20 seeded kills, each run a restart (a new segment of one output); the
    recovery is the documented one: read each segment, and ``replayer trace
    merge`` the non-empty ones. Every exchange a client saw complete is there."""
    out = tmp_path / "rec.arrow"
    missing: dict[str, list[str]] = {}
    seen: set[str] = set()
    sent = steady_runs = 0
    for k, (phase, seed) in enumerate(RUNS):
        before = set(tmp_path.glob("rec*.arrow"))
        files = tmp_path / f"run{k}"
        files.mkdir()
        clients = asyncio.run(kill_run(Recorder(emulator.url, out, files), k, phase, seed))
        complete = clients.complete if clients is not None else set()
        new = set(tmp_path.glob("rec*.arrow")) - before
        assert len(new) <= 1
        segment = new.pop() if new else None
        recorded = rows_of(segment) if segment is not None else set()
        if complete - recorded:
            missing[f"{phase} seed {seed} ({segment})"] = sorted(complete - recorded)
        seen |= complete
        sent += clients.sent if clients is not None else 0
        steady_runs += phase == "steady" and bool(complete)
    assert not missing, f"seen complete by a client, not in the trace: {missing}"
    # the runs did what they claim: traffic flowed, and kills cut exchanges mid-way
    assert len(seen) >= 100 and steady_runs == 8, (len(seen), steady_runs)
    assert sent > len(seen)
    segments = sorted(p for p in tmp_path.glob("rec*.arrow") if rows_of(p))
    res = run("trace", "merge", *segments, "-o", tmp_path / "merged.arrow", timeout=120)
    assert res.returncode == 0, res.stderr
    merged = set(Trace.open(tmp_path / "merged.arrow").column("request_id"))
    assert seen <= merged, sorted(seen - merged)[:10]


async def until_full(url: str, rec: Recorder, extra: int) -> tuple[list[str], int, float]:
    """Chat through the recorder (JSON and streams, incompressible bodies:
    about 2 KB of disk a row) until it says it stopped recording, then
    ``extra`` more; every response must arrive whole. Returns the request
    ids completed, how many completed before the stop was told, and the
    slowest request (s)."""
    done: list[str] = []
    stopped_at: int | None = None
    slowest = 0.0
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-x", max_retries=0, timeout=BOUND)
    async with client:
        for n in range(400):  # bounded: the disk holds well under 400 rows
            rid = f"d{n}"
            body = [{"role": "user", "content": f"marker {rid} " + os.urandom(1500).hex()}]
            t0 = time.monotonic()
            if n % 2:
                stream = await client.chat.completions.create(
                    model=MODEL,
                    messages=body,
                    max_tokens=4,
                    stream=True,
                    extra_headers={"X-Request-Id": rid},
                )
                ends = [c.choices[0].finish_reason async for c in stream if c.choices]
                assert ends[-1] is not None
            else:
                r = await client.chat.completions.create(
                    model=MODEL, messages=body, max_tokens=4, extra_headers={"X-Request-Id": rid}
                )
                assert r.choices[0].finish_reason is not None
            done.append(rid)
            slowest = max(slowest, time.monotonic() - t0)
            if stopped_at is None and "recording stopped:" in rec.stderr:
                stopped_at = len(done)
            elif stopped_at is not None and len(done) >= stopped_at + extra:
                break
    assert stopped_at is not None, "the disk never filled"
    return done, stopped_at, slowest


def test_a_disk_that_fills_stops_the_recording_never_the_traffic(emulator, tmp_path):
    with small_disk(tmp_path, "512k") as disk:
        out = disk / "rec.arrow"
        fill(disk, leave=96 << 10)
        rec = Recorder(emulator.url, out, tmp_path, "--progress", "0.2")
        try:
            poll_until(lambda: rec.url is not None or rec.proc.poll() is not None, BOUND)
            url = rec.url
            assert url is not None, rec.stderr
            done, stopped_at, slowest = asyncio.run(until_full(url, rec, 20))
            # no response waited for the failed writer: the hold limit (10 s) never acted
            assert slowest < 5, slowest
            poll_until(lambda: "RECORDING STOPPED" in rec.stderr, BOUND)
            rec.proc.send_signal(signal.SIGINT)
            code = rec.proc.wait(BOUND)
        finally:
            rec.kill()
        err = rec.stderr
        lines = err.splitlines()
        assert "Traceback" not in err, err
        told = [ln for ln in lines if "recording stopped:" in ln]
        assert len(told) == 1, err
        assert told[0].startswith(f"record: error: recording stopped: disk full writing {out} (")
        assert " bytes free); the trace holds the " in told[0], told[0]
        progress = [ln for ln in lines if "RECORDING STOPPED (disk full writing" in ln]
        assert progress, err
        assert code == 2, err
        assert lines[-1].startswith("record: error: recording stopped early (disk full writing")
        # the trace up to the failure: whole (no torn batch), the first exchanges in order
        t = Trace.open(out)
        kept = t.column("request_id")
        assert not t.torn_tail
        assert 0 < len(kept) <= stopped_at and kept == done[: len(kept)]
        assert f"the trace holds {len(kept):,} exchanges, " in lines[-1], lines[-1]
        info = run("inspect", out)
        assert info.returncode == 0 and "Traceback" not in info.stderr, info.stderr
