"""A replay under bad luck: its run directory on a disk that fills while it
runs, and the replayer killed with SIGKILL at random instants. Either way
nothing already written is lost or torn: ``results.arrow`` reads back whole
batches, the JSON files are whole or absent, and a full disk is one line on
stderr and exit 2 within seconds, never a traceback or a hang."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from replayer._async import live_tasks, spawn
from replayer.errors import DiskFullError
from replayer.options import WatchConfig
from replayer.replay.client import Endpoint
from replayer.replay.engine import Replay
from replayer.replay.plan import build_plan, select
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.replay.results import SCHEMA, ResultsWriter, Status, read_results
from replayer.replay.run import replay_to_dir
from replayer.trace import Trace
from tests.helpers.cli import REPO, assert_one_line_error
from tests.helpers.disk import fill, small_disk
from tests.helpers.replay import synth

STATUSES = {s.value for s in Status}


def whole_batches(path: Path) -> int:
    """Rows in the whole record batches at the start of a results stream,
    read message by message (independently of the results reader): a torn
    tail ends the count."""
    rows = 0
    with pa.OSFile(str(path)) as f:
        reader = ipc.MessageReader.open_stream(f)
        first = True
        while True:
            try:
                msg = reader.read_next_message()
            except (pa.ArrowInvalid, OSError, StopIteration):
                break
            if msg is None:
                break
            if first:
                assert msg.type == "schema"
                first = False
                continue
            rows += ipc.read_record_batch(msg, SCHEMA).num_rows
    return rows


def is_torn(path: Path) -> bool:
    """Does the stream end in a partial message (what a full disk must not leave)?"""
    try:
        with pa.OSFile(str(path)) as f:
            ipc.open_stream(f).read_all()
    except (pa.ArrowInvalid, OSError):
        return True
    return False


def check_results(path: Path, trace: Trace, target: str) -> list[dict]:
    """``results.arrow`` read back: every whole batch, nothing torn, each row a
    real request of the trace once."""
    rows = read_results(path)
    assert len(rows) == whole_batches(path)
    ids = set(trace.column("request_id"))
    assert {r["target"] for r in rows} <= {target}
    assert {r["status"] for r in rows} <= STATUSES
    assert {r["request_id"] for r in rows} <= ids
    assert len({r["row"] for r in rows}) == len(rows)  # no request twice
    return rows


async def no_task_left(within: float = 5.0) -> bool:
    """Whether every task replayer started has ended (polled, bounded)."""
    deadline = time.monotonic() + within
    for _ in range(10_000):  # polling a condition, bounded in count and time
        if not live_tasks() or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)
    return not live_tasks()


# -- a full disk ----------------------------------------------------------------------


def long_trace(tmp_path: Path) -> Trace:
    """~10 s of real-time traffic: a full disk must stop it long before its end."""
    return synth(tmp_path, sessions=20, turns=10, context=20_000, rate=20, think=0.2, seed=5)


def test_cli_replay_on_a_disk_that_fills_stops_with_one_line(emulator, tmp_path):
    t = long_trace(tmp_path)
    with small_disk(tmp_path, "256k") as disk:
        fill(disk, leave=24 << 10)
        out = disk / "run"
        cmd = [sys.executable, "-m", "replayer", "replay", str(t.path)]
        cmd += ["--target", f"e={emulator.url}", "--out", str(out), "--quiet"]
        started = time.monotonic()
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
        took = time.monotonic() - started
        assert_one_line_error(res, f"{out}/", "no space left on device")
        assert res.stderr.startswith("replayer replay: error: ")
        # stopped on the first refused write, not at the trace's end (~10 s)
        rows = check_results(out / "results.arrow", t, "e")
        assert len(rows) < len(t)
        assert took < 60, took
        assert not is_torn(out / "results.arrow")
        assert orjson.loads((out / "run.json").read_bytes())["trace"]["requests"] == len(t)
        assert not (out / "summary.json").exists()
        assert not [p.name for p in out.iterdir() if ".tmp" in p.name]


async def test_results_on_a_full_disk_end_on_their_last_whole_batch(emulator, tmp_path):
    t = long_trace(tmp_path)
    rows = select(t)
    policy = ReplayPolicy()  # real time: a batch a second, ~20 rows each
    with small_disk(tmp_path, "256k") as disk:
        fill(disk, leave=12 << 10)
        out = disk / "run"
        with pytest.raises(DiskFullError) as err:
            await asyncio.wait_for(
                replay_to_dir(t, rows, policy, [Endpoint("e", emulator.url)], out,
                              command=["test"], progress=False),
                60,
            )  # fmt: skip
        want = f"{out}/results.arrow: no space left on device (free space and rerun)"
        assert str(err.value) == want
        got = check_results(out / "results.arrow", t, "e")
        assert 0 < len(got) < len(rows)
        assert not is_torn(out / "results.arrow")
        assert not (out / "summary.json").exists()
        assert await no_task_left(), live_tasks()


async def test_metrics_on_a_full_disk_stop_the_replay(emulator, tmp_path):
    """The old behaviour: the scraper's task died on ENOSPC, logged, and the
    replay went on with nowhere to put what it measured."""
    t = long_trace(tmp_path)
    plan_rows = select(t)
    policy = ReplayPolicy(timing=Timing.ASAP, max_inflight=4)
    with small_disk(tmp_path, "64k") as disk:
        fill(disk, leave=0)
        writer = ResultsWriter(tmp_path / "results.arrow")  # room for these
        replay = Replay(
            t, build_plan(t, plan_rows, policy), policy, [Endpoint("e", emulator.url)], writer,
            watch=WatchConfig(scrape_interval=0.2), out=disk,
        )  # fmt: skip
        task = spawn(replay.run(), name="replay-under-test")
        done, _ = await asyncio.wait({task}, timeout=30)
        assert done, "the replay went on after metrics.arrow could not be written"
        assert task.cancelled()
        writer.close()
        assert isinstance(replay.output_error, DiskFullError)
        assert replay.output_error.path == str(disk / "metrics.arrow")
        got = read_results(tmp_path / "results.arrow")
        assert len(got) == len(plan_rows)  # every request accounted for, none sent after
        assert sum(r["status"] == "ok" for r in got) < len(plan_rows)


# -- kill -9 anywhere -----------------------------------------------------------------

FLUSHED_WITHIN = 3.0
"""Seconds within which a settled result is on disk: the 1 s flush interval,
the 0.5 s tick, and a busy machine's slack."""
KILL_SEEDS = range(20)
"""One kill instant per seed: ``random.Random(seed)``, spread over the replay's
life (start-up, steady state, clean-up) as the reference run timed it."""


def replay_cmd(trace: Path, url: str, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "replayer", "replay", str(trace), "--target", f"e={url}"]
    # ~4 s of requests, then a short grace: start-up, steady state and
    # clean-up each take a fair share of the run's life
    cmd += ["--out", str(out), "--quiet", "--timing", "recorded", "--speed", "4"]
    return [*cmd, "--grace", "0.5", "--health-interval", "0.2"]


@pytest.mark.slow
def test_replay_killed_anywhere_keeps_every_whole_batch(emulator, tmp_path):
    t = synth(tmp_path, sessions=6, turns=6, context=8_000, rate=12, think=0.3, seed=7)
    began = time.monotonic()
    ref = subprocess.run(
        replay_cmd(t.path, emulator.url, tmp_path / "ref"), capture_output=True, text=True,
        timeout=120, cwd=REPO,
    )  # fmt: skip
    life = time.monotonic() - began
    assert ref.returncode == 0, ref.stderr[-2000:]
    assert len(check_results(tmp_path / "ref" / "results.arrow", t, "e")) == len(t)
    for seed in KILL_SEEDS:
        at = random.Random(seed).uniform(0.0, life)
        out = tmp_path / f"k{seed}"
        began = time.time()  # the emulator's request log is on the wall clock
        with subprocess.Popen(
            replay_cmd(t.path, emulator.url, out), cwd=REPO, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        ) as proc:  # fmt: skip
            try:
                proc.wait(timeout=at)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the whole group: nothing of it is left
            proc.wait(timeout=30)
        killed_at = time.time()
        got: list[dict] = []
        if (out / "results.arrow").exists():  # it is renamed into place with its schema
            got = check_results(out / "results.arrow", t, "e")
        # results are flushed every second: what the emulator answered well
        # before the kill (instantly, at arrival) was on disk when it came
        old = {
            e["request_id"]
            for e in emulator.read_request_log()
            if e["event"] == "request" and began <= e["t"] <= killed_at - FLUSHED_WITHIN
        }
        assert old <= {r["request_id"] for r in got if r["status"] == "ok"}, seed
        for name in ("run.json", "summary.json"):
            if (out / name).exists():
                assert isinstance(orjson.loads((out / name).read_bytes()), dict), (seed, name)
        if proc.returncode == 0:
            assert len(read_results(out / "results.arrow")) == len(t)
