"""Bisects over pools of Slurm jobs on a real one-node cluster (the tier's
``slurm`` fixture): each server an emulator run by ``sbatch`` on loopback,
with the planted crash of the single-server tests and its exact answer.

A pool finds the exact prefix on three jobs; a job cancelled mid-trial is
taken as lost (not a crash): a new job is submitted and the trial re-run;
a job that cannot start is reported with Slurm's reason, and the bisect
goes on with the servers that can; nothing of ours is left in the queue,
after a bisect and after SIGTERM to ``replayer bisect --pool``."""

from __future__ import annotations

import asyncio
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from replayer import api
from replayer._async import spawn
from replayer.errors import LaunchError
from replayer.options import BisectOptions, ReplayPolicy, WatchConfig
from replayer.replay.policy import Timing
from replayer.testing.slurm import LocalSlurm
from replayer.trace import Trace
from replayer.trace.synth import SynthOptions, write_trace
from tests.helpers.net import free_ports

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]

MODEL = "moonshotai/Kimi-K3"
CRASH = "exit after=0.2 when request=17"
"""The planted crash: the server dies on its 17th request; the answer is the
trace's first 17 requests (as tests/bisect/test_pipeline.py asserts on one server)."""
ANSWER = 17
WATCH = WatchConfig(
    health_interval=0.1, scrape_interval=1.0, stall_timeout=60.0, settle=3.0, grace=0.8
)
OPTS = BisectOptions(
    stages=("calibrate", "cut", "prefix"), calibrate_matches=2, calibrate_runs=4, confirm=0
)
POLICY = ReplayPolicy(timing=Timing.ASAP)
WAIT_S = 60.0
"""Bound on every wait for evidence (a job running, a request seen, an exit)."""


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("slurm-trace") / "t.arrow"
    write_trace(
        p,
        SynthOptions(
            sessions=5, turns=6, context=8_000, rate=50, think=0.0, max_tokens=4, model=MODEL,
            seed=3,
        ),
    )  # fmt: skip
    return p


def emulator(*faults: str) -> str:
    """An emulator launch template (``{port}`` filled per server)."""
    args = [sys.executable, "-m", "replayer.emulator", "--port", "{port}", "--speed", "instant"]
    for f in faults:
        args += ["--fault", f]
    return shlex.join(args)


def pool_file(
    d: Path, servers: int, launch: str, *, gres: str = "gpu:1", pending: float = 30,
    partition: str | None = None, extra: tuple[str, ...] = (),
) -> Path:  # fmt: skip
    d.mkdir(parents=True, exist_ok=True)
    lines = [
        f"servers = {servers}",
        f"launch = {orjson.dumps(launch).decode()}",
        f"port = {free_ports(servers)}",
        'url = "http://127.0.0.1:{port}"',
        "ready_timeout = 60",
        "[slurm]",
        f'gres = "{gres}"',
        f"pending_timeout = {pending}",
    ]
    if partition is not None:
        lines.append(f'partition = "{partition}"')
    if extra:
        lines.append(f"extra = {orjson.dumps(list(extra)).decode()}")
    p = d / "pool.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


async def run_bisect(trace: Path, pool: Path, out: Path) -> tuple[Any, dict[str, Any]]:
    res = await api.bisect(
        trace, None, out, OPTS, policy=POLICY, watch=WATCH, pool=pool, say=lambda m: None
    )
    manifest = orjson.loads((out / "bundle" / "manifest.json").read_bytes())
    return res, manifest


def first_ids(trace: Path, n: int) -> list[str]:
    t = Trace.open(trace)
    return [t.column("request_id")[r] for r in t.order[:n]]


def journal(out: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (out / "journal.jsonl").read_bytes().splitlines()]


def ours(cluster: LocalSlurm) -> list[tuple[str, str, str]]:
    """Jobs of a pool in the queue (every pool job is named ``replayer-...``)."""
    return [j for j in cluster.squeue() if j[1].startswith("replayer-")]


def poll(what: str, check: Callable[[], Any], within: float = WAIT_S) -> Any:
    """Call ``check`` (bounded) until it returns something true; that."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)  # polling real evidence (bounded above)
    raise AssertionError(f"no {what} within {within:g} s")


async def until(what: str, check: Callable[[], Any], within: float = WAIT_S) -> Any:
    """:func:`poll` off the event loop (the bisect under test runs on it)."""
    return await asyncio.to_thread(poll, what, check, within)


def jobs_of(cluster: LocalSlurm, slot: int) -> dict[str, str]:
    """Job id -> state of every job pool server ``slot`` ran, ended ones too."""
    return {j: state for j, name, state in cluster.jobs() if name.endswith(f"-{slot}")}


async def test_a_pool_of_slurm_jobs_finds_the_exact_prefix(
    slurm: LocalSlurm, trace: Path, tmp_path: Path
) -> None:
    pool = pool_file(tmp_path, 3, emulator(CRASH))
    res, m = await run_bisect(trace, pool, tmp_path / "b")
    assert res.status == "complete"
    assert m["prefix_length"] == ANSWER
    assert m["requests"] == first_ids(trace, ANSWER)
    trials = [e["record"] for e in journal(tmp_path / "b") if e["event"] == "trial"]
    assert {t["server"] for t in trials} == {0, 1, 2}  # the three jobs all ran trials
    assert not ours(slurm)  # every job of the pool is gone once the bisect returned


HANG_ONCE = """#!/bin/sh
# the first job of server 1 hangs on its 2nd request (its trial cannot end
# before the test cancels the job); every other job is the plain emulator
slot=$1; shift
if [ "$slot" = 1 ] && mkdir "{d}/hung" 2>/dev/null; then
    exec "$@" --fault "hang when request=2" --request-log "{d}/hung/requests.jsonl"
fi
exec "$@"
"""


def job_of(cluster: LocalSlurm, slot: int) -> str | None:
    """The running job of pool server ``slot``."""
    for job, name, state in ours(cluster):
        if name.endswith(f"-{slot}") and state == "RUNNING":
            return job
    return None


async def test_a_job_cancelled_mid_trial_is_replaced_and_its_trial_rerun(
    slurm: LocalSlurm, trace: Path, tmp_path: Path
) -> None:
    wrapper = tmp_path / "launch.sh"
    wrapper.write_text(HANG_ONCE.replace("{d}", str(tmp_path)))
    wrapper.chmod(0o755)
    pool = pool_file(tmp_path, 2, f"{wrapper} {{slot}} {emulator(CRASH)}")
    out = tmp_path / "b"
    task = spawn(run_bisect(trace, pool, out), name="bisect")
    try:
        log = tmp_path / "hung" / "requests.jsonl"
        # evidence the trial is under way on the hung server: its 2nd request came
        await until("2nd request on server 1", lambda: log.exists() and
                    len(log.read_bytes().splitlines()) >= 2)  # fmt: skip
        killed = await until("server 1's job", lambda: job_of(slurm, 1))
        await asyncio.to_thread(subprocess.run, ["scancel", killed], check=True, timeout=30)
        res, m = await asyncio.wait_for(task, 240)
    finally:
        task.cancel()
    assert res.status == "complete"
    assert m["prefix_length"] == ANSWER
    assert m["requests"] == first_ids(trace, ANSWER)
    trials = [e["record"] for e in journal(out) if e["event"] == "trial"]
    lost = [t for t in trials if t["outcome"] == "INFRA"]
    assert len(lost) == 1 and lost[0]["server"] == 1, [(t["outcome"], t["server"]) for t in trials]
    assert "CANCELLED by the scheduler" in lost[0]["message"]
    # its candidate ran again, after it; server 1 came back as a new job
    assert any(t["key"] == lost[0]["key"] and t["trial"] > lost[0]["trial"]
               and t["outcome"] != "INFRA" for t in trials)  # fmt: skip
    assert any(t["server"] == 1 and t["trial"] > lost[0]["trial"] for t in trials)
    ran = jobs_of(slurm, 1)
    assert ran[killed] == "CANCELLED" and max(map(int, ran)) > int(killed)
    assert not ours(slurm)


@pytest.mark.parametrize(
    ("job", "reason"),
    [
        ({"gres": "gpu:99"}, "Requested node configuration is not available"),
        ({"partition": "nosuch"}, "invalid partition specified: nosuch"),
        ({"extra": ("--hold",), "pending": 2}, "still PENDING after 2s: JobHeldUser"),
    ],
    ids=["gres", "partition", "pending"],
)
async def test_a_job_that_cannot_start_is_reported_with_slurms_reason(
    slurm: LocalSlurm, trace: Path, tmp_path: Path, job: dict[str, Any], reason: str
) -> None:
    pool = pool_file(tmp_path, 1, emulator(CRASH), **job)
    with pytest.raises(LaunchError) as err:
        await run_bisect(trace, pool, tmp_path / "b")
    assert reason in str(err.value)
    assert not ours(slurm)  # the held job was cancelled, not left queued


async def test_a_bisect_goes_on_without_the_server_that_cannot_start(
    slurm: LocalSlurm, trace: Path, tmp_path: Path
) -> None:
    # every job is submitted held; the test releases those of servers 0 and
    # 2 as they appear, so server 1's stay pending (JobHeldUser) until retired.
    # Server 1 is sure to be tried: calibration's first round takes two
    # servers, none ready yet, in the pool's order (0, then 1)
    pool = pool_file(tmp_path, 3, emulator(CRASH), extra=("--hold",), pending=10)
    task = spawn(run_bisect(trace, pool, tmp_path / "b"), name="bisect")
    released: set[str] = set()

    def release() -> None:
        for job, name, state in ours(slurm):
            if state == "PENDING" and not name.endswith("-1") and job not in released:
                subprocess.run(["scontrol", "release", job], check=False, timeout=30)
                released.add(job)

    try:
        while not task.done():
            await asyncio.to_thread(release)
            await asyncio.wait([task], timeout=0.2)  # polling the queue until the bisect ends
        res, m = task.result()
    finally:
        task.cancel()
    assert res.status == "complete"
    assert m["prefix_length"] == ANSWER
    assert m["requests"] == first_ids(trace, ANSWER)
    trials = [e["record"] for e in journal(tmp_path / "b") if e["event"] == "trial"]
    held = [t for t in trials if t["server"] == 1]
    assert held and all(t["outcome"] == "INFRA" for t in held)
    why = [t["message"] for t in held]
    assert all("still PENDING after 10s: JobHeldUser" in m for m in why), why
    assert {t["server"] for t in trials if t["outcome"] != "INFRA"} <= {0, 2}
    assert not ours(slurm)


FAST = [
    *("--timing", "asap", "--settle", "3", "--grace", "0.8", "--health-interval", "0.1"),
    *("--stall-timeout", "60", "--calibrate", "2", "--calibrate-runs", "4", "--confirm", "0"),
    *("--stages", "calibrate,cut,prefix"),
]


@pytest.mark.parametrize("running", [1, 2], ids=["first-job", "in-trials"])
def test_sigterm_to_the_cli_leaves_no_job_behind(
    slurm: LocalSlurm, trace: Path, tmp_path: Path, running: int
) -> None:
    # stopped as its first job runs (the bisect reads the server's facts
    # then), or once both servers run trials: they hang on their first
    # request, so the trials are under way whatever the machine's speed
    pool = pool_file(tmp_path, 2, emulator("hang when request=1"))
    cmd = [sys.executable, "-m", "replayer", "bisect", str(trace), "--out", str(tmp_path / "b"),
           "--pool", str(pool), *FAST]  # fmt: skip
    err = tmp_path / "stderr.txt"
    with (
        err.open("wb") as errf,
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf, env=slurm.env()) as proc,
    ):
        try:

            def started() -> bool:
                jobs = [j for j in ours(slurm) if j[2] == "RUNNING"]
                return proc.poll() is not None or len(jobs) >= running

            poll(f"{running} running job(s) of the CLI's pool", started)
            assert proc.poll() is None, err.read_text()[-2000:]
            proc.send_signal(signal.SIGTERM)
            proc.wait(WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode not in (None, 0)
    assert not ours(slurm), (ours(slurm), err.read_text()[-3000:])
