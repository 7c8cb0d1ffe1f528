"""A bisect under bad luck: its directory on a disk that fills, and the
bisect killed with SIGKILL at random instants. The journal stays whole
lines, ``--resume`` (after space is freed) repeats no journaled trial, and
the bundle is the one an undisturbed bisect writes."""

from __future__ import annotations

import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from replayer.bisect.files import append_journal, journal_events
from replayer.errors import DiskFullError
from replayer.trace import Trace
from replayer.trace.synth import SynthOptions, write_trace
from tests.helpers.cli import REPO
from tests.helpers.disk import fill, small_disk
from tests.helpers.net import free_port

MODEL = "moonshotai/Kimi-K3"
CRASH_AT = 5
"""The emulator dies on the trace's 5th request: the minimal repro is its first 5."""
CHEAP = [
    *("--confirm", "1", "--stages", "calibrate,cut,prefix", "--timing", "asap"),
    *("--settle", "1", "--grace", "0.3", "--health-interval", "0.1"),
    *("--calibrate", "1", "--calibrate-runs", "2"),
]


def small_trace(tmp_path: Path) -> Path:
    p = tmp_path / "t.arrow"
    write_trace(
        p,
        SynthOptions(sessions=2, turns=4, context=6_000, rate=50, think=0.0, max_tokens=4,
                     model=MODEL, seed=3),
    )  # fmt: skip
    return p


def bisect_cmd(trace: Path, out: Path, port: int, *, resume: bool = False) -> list[str]:
    emu = [sys.executable, "-m", "replayer.emulator", "--port", str(port), "--speed", "instant"]
    emu += ["--fault", f"exit after=0.1 when request={CRASH_AT}"]
    cmd = [sys.executable, "-m", "replayer", "bisect", str(trace), "--out", str(out)]
    return [*cmd, "--launch", shlex.join(emu), *CHEAP, *(["--resume"] if resume else [])]


def run(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def journal_lines(path: Path) -> list[dict]:
    """Every line of the journal, each a whole JSON event (a torn line fails)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), data[-200:]
    return [orjson.loads(line) for line in data.splitlines()]


def trials(events: list[dict]) -> list[tuple[int, str, tuple[int, ...], str]]:
    """(number, stage, positions, outcome) of each journaled trial."""
    return [
        (e["record"]["trial"], e["record"]["stage"], tuple(e["positions"]),
         e["record"]["outcome"])
        for e in events
        if e["event"] == "trial"
    ]  # fmt: skip


def assert_resumed_without_repeats(before: list[dict], after: list[dict]) -> None:
    """``after`` keeps ``before`` as it was, and numbers no trial twice."""
    assert after[: len(before)] == before
    numbers = [n for n, *_ in trials(after)]
    assert len(numbers) == len(set(numbers)), numbers
    done = {n for n, *_ in trials(before)}
    new = [n for n, *_ in trials(after[len(before) :])]
    assert not done & set(new), (sorted(done), new)


def answer(out: Path) -> tuple[list[str], str]:
    """The bundle's minimal trace and the crash's signature."""
    m = orjson.loads((out / "bundle" / "manifest.json").read_bytes())
    return m["requests"], m["signature"]["hash"]


def port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


# -- the journal's append --------------------------------------------------------------


def test_a_journal_append_the_disk_refuses_leaves_the_journal_as_it_was(tmp_path):
    with small_disk(tmp_path, "64k") as disk:
        j = disk / "journal.jsonl"
        append_journal(j, [{"event": "mark", "name": "a", "trials": 1}])
        before = j.read_bytes()
        fill(disk, leave=2 << 10)
        big = {"event": "trial", "record": {"message": "x" * 16_000}}
        with pytest.raises(DiskFullError) as err:
            append_journal(j, [big, {"event": "time", "spent_s": 1.0}])
        assert str(err.value) == f"{j}: no space left on device (free space and rerun)"
        assert j.read_bytes() == before  # no half line, no line of the two
        (disk / "ballast").unlink()
        append_journal(j, [big, {"event": "time", "spent_s": 1.0}])
        events = [e for _, e in journal_events(j)]
        assert [e["event"] for e in events] == ["format", "mark", "trial", "time"]


# -- a full disk ----------------------------------------------------------------------


@pytest.mark.slow
def test_bisect_on_a_disk_that_fills_stops_then_resumes_to_the_same_bundle(tmp_path):
    trace = small_trace(tmp_path)
    port = free_port()
    with small_disk(tmp_path, "2m") as disk:
        fill(disk, leave=300 << 10)  # a few trials' worth
        out = disk / "b"
        started = time.monotonic()
        res = run(bisect_cmd(trace, out, port))
        # the progress lines go first; the last line is the one error
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2, res.stderr[-3000:]
        assert "Traceback" not in res.stderr
        assert lines[-1].startswith(f"replayer bisect: error: {out}/"), lines[-1]
        assert "no space left on device" in lines[-1]
        assert sum("error" in line for line in lines) == 1, res.stderr[-3000:]
        assert time.monotonic() - started < 120
        before = journal_lines(out / "journal.jsonl")
        assert trials(before), "the disk filled before the first trial was journaled"
        assert port_closed(port)  # the server it launched is stopped
        (disk / "ballast").unlink()
        res = run(bisect_cmd(trace, out, port, resume=True))
        assert res.returncode == 0, res.stderr[-3000:]
        after = journal_lines(out / "journal.jsonl")
        assert_resumed_without_repeats(before, after)
        ids = Trace.open(trace).column("request_id")
        order = Trace.open(trace).order
        assert answer(out)[0] == [ids[r] for r in order[:CRASH_AT]]
        assert port_closed(port)


# -- kill -9 anywhere -----------------------------------------------------------------

KILL_SEED = 20261206
KILLS = 20


def kill_group(proc: subprocess.Popen[bytes], at: float) -> bool:
    """SIGKILL ``proc``'s whole process group ``at`` seconds after it started
    (if it is still running); True if it was killed."""
    try:
        proc.wait(timeout=at)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        return True


def stop_left_servers(out: Path, port: int) -> None:
    """The launched emulator of a bisect killed last (its own session): the
    next resume reaps it; at the end of the test, this does, by pid file,
    only if its command line names the test's port."""
    for pidfile in out.glob("*.pid"):
        pid = int(pidfile.read_text().split()[0])
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if f"--port {port}".encode() in cmdline:
            os.killpg(pid, signal.SIGKILL)


@pytest.mark.slow
def test_bisect_killed_anywhere_resumes_to_the_same_bundle(tmp_path):
    """One uninterrupted reference run; then one bisect killed at 20 seeded
    instants (each counted from its own start, so they fall in start-up,
    in trials and in the clean-up that writes the bundle), resumed after
    each, and finally to the end."""
    trace = small_trace(tmp_path)
    ref = tmp_path / "ref"
    began = time.monotonic()
    res = run(bisect_cmd(trace, ref, free_port()))
    life = time.monotonic() - began
    assert res.returncode == 0, res.stderr[-3000:]
    reference = answer(ref)
    rng = random.Random(KILL_SEED)
    out, port = tmp_path / "b", free_port()
    journal = out / "journal.jsonl"
    kills = 0
    resumed = False
    try:
        for _ in range(2 * KILLS):  # bounded: a run that ends before its instant is not a kill
            if kills == KILLS:
                break
            before = journal_lines(journal)
            cmd = bisect_cmd(trace, out, port, resume=resumed)
            with subprocess.Popen(
                cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True,
            ) as proc:  # fmt: skip
                # start-up is ~1-2 s of it: a fifth of the instants land there
                killed = kill_group(proc, rng.uniform(0.0, life / 4))
            resumed = resumed or out.exists()
            after = journal_lines(journal)
            assert_resumed_without_repeats(before, after)
            if not killed:
                assert proc.returncode == 0
                out_done = out.with_name("b-done")
                shutil.rmtree(out_done, ignore_errors=True)
                os.replace(out, out_done)
                assert answer(out_done) == reference
                resumed = False  # a fresh bisect takes the remaining kills
                continue
            kills += 1
        assert kills == KILLS
        before = journal_lines(journal)
        res = run(bisect_cmd(trace, out, port, resume=resumed))
        assert res.returncode == 0, res.stderr[-3000:]
        assert_resumed_without_repeats(before, journal_lines(journal))
        assert answer(out) == reference
        assert port_closed(port)
    finally:
        stop_left_servers(out, port)
