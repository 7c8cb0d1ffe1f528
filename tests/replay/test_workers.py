"""``--workers N``: bodies built in worker processes are the same bytes, in
the same order, and a worker's death loses nothing."""

from __future__ import annotations

import hashlib
import os
import re
import signal
from pathlib import Path

import pytest

from replayer.replay.bodies import body_patch
from replayer.replay.client import Endpoint
from replayer.replay.plan import build_plan, select
from replayer.replay.policy import Order, ReplayPolicy, Timing
from replayer.replay.results import read_results
from replayer.replay.run import as_replayed, replay_to_dir
from replayer.replay.workers import ProcBodies, shard, spec_of
from replayer.trace import TokenSpace, Trace

SAMPLES = Path(__file__).resolve().parents[2] / "traces"


def reference(trace: Trace, rows: list[int], policy: ReplayPolicy) -> list[bytes]:
    """Every body as one process builds it (the replay's own builder)."""
    b = trace.builder(rows)
    base = {"model": policy.model} if policy.model else {}
    return [b.json(r, body_patch(trace, r, base, policy.force_stream)) for r in rows]


def proc_bodies(trace: Trace, policy: ReplayPolicy, n: int, **kw) -> tuple[ProcBodies, list[int]]:
    rows = select(trace)
    plan = build_plan(trace, rows, policy)
    spec = spec_of(trace, policy)
    assert spec is not None
    ref = reference(trace, rows, policy)
    bodies = ProcBodies(
        spec,
        n,
        lambda i: ref[i],  # what the replay's process builds itself (none here: all static)
        [True] * len(rows),
        plan.rows,
        plan.sessions,
        [int(x or 0) for x in trace.column("input_tokens")],
        due=None,
        horizon=1.0,
        **{"ahead_bytes": 1 << 20, **kw},
    )
    return bodies, rows


@pytest.mark.parametrize("name", ["blocks-16x12.arrow", "agents-8x10.arrow"])
@pytest.mark.parametrize("model", [None, "other"])
async def test_bodies_from_two_workers_are_the_bytes_one_process_builds(name, model):
    trace = Trace.open(SAMPLES / name)
    policy = ReplayPolicy(timing=Timing.ASAP, model=model)
    bodies, rows = proc_bodies(trace, policy, 2)
    try:
        got = [await bodies.get(i) for i in range(len(rows))]
    finally:
        bodies.close()
    assert got == reference(trace, rows, policy)
    assert bodies.died == []


async def test_a_worker_that_dies_is_reported_and_its_bodies_still_go_out():
    trace = Trace.open(SAMPLES / "blocks-16x12.arrow")
    policy = ReplayPolicy(timing=Timing.ASAP)
    # a budget of one body and no ring (every body by pipe, which fills):
    # the workers stay blocked well short of the end
    bodies, rows = proc_bodies(trace, policy, 2, ahead_bytes=1, ring_bytes=1)
    ref = reference(trace, rows, policy)
    try:
        assert await bodies.get(0) == ref[0]
        os.kill(bodies.pids[0], signal.SIGKILL)
        got = [ref[0]] + [await bodies.get(i) for i in range(1, len(rows))]
    finally:
        bodies.close()
    assert got == ref
    # noted before the bodies it owed were handed over (the last gets waited for it)
    [note] = bodies.died
    m = re.fullmatch(
        rf"body worker 0 \(pid {bodies.pids[0]}\) died with exit code -9 \(.+\); its (\d+) "
        r"remaining bodies are built in the replay's process",
        note,
    )
    assert m and int(m[1]) >= 1, note


@pytest.mark.inprocess
def test_sessions_are_dealt_whole_to_the_least_loaded_worker():
    sessions = ["a", "b", "a", "c", "b", "d", "a"]
    weight = [10, 3, 10, 2, 3, 1, 10]
    # a (30) -> 0; b (6) -> 1; c (2) -> 1 (6 < 30); d (1) -> 1 (8 < 30)
    assert shard(sessions, weight, 2) == [0, 1, 0, 1, 1, 1, 0]
    assert shard(sessions, weight, 1) == [0] * 7


async def test_a_replay_with_two_workers_sends_what_one_sends_in_the_same_order(
    emulator_factory, tmp_path
):
    trace = Trace.open(SAMPLES / "blocks-16x12.arrow")
    rid = trace.column("request_id")
    emu = emulator_factory(["--speed", "instant"], log_bodies=True)
    sha: dict[int, dict[str, str]] = {}
    for n, order in ((1, Order.STRICT), (2, Order.STRICT), (2, Order.ADMITTED)):
        out = tmp_path / f"w{n}-{order.value}"
        before = len(emu.read_request_log())
        policy = ReplayPolicy(timing=Timing.ASAP, workers=n, order=order)
        rows = select(trace)
        outcome = await replay_to_dir(trace, rows, policy, [Endpoint("e", emu.url)], out)
        assert outcome.exit_code == 0
        assert outcome.summary.get("body_workers") == (
            None if n == 1 else {"workers": 2, "died": []}
        )
        log = [e for e in emu.read_request_log()[before:] if e["event"] == "request"]
        sha.setdefault(n, {e["request_id"]: e["body_sha256"] for e in log})
        by_id = {r["request_id"]: r for r in read_results(out / "results.arrow")}
        assert [by_id[rid[r]]["seq"] for r in rows] == list(range(len(rows)))  # trace order
        if order is Order.ADMITTED:  # each waits for the last one's headers: the server's order
            assert [e["request_id"] for e in log] == [rid[r] for r in rows]
    assert len(sha[1]) == len(trace) and sha[2] == sha[1]  # the same bytes


GB = 1 << 30


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("body_bytes", "span_s", "cpus", "want"),
    [
        (
            40 * GB,
            None,
            2,
            (1, "2 usable CPU(s): " + "a worker process would take a core from the sends"),
        ),
        (GB // 2, None, 16, (1, "537 MB of bodies: one thread builds them")),
        (40 * GB, 3_600.0, 16, (1, "12 MB/s of bodies on average: one thread keeps up")),
        (40 * GB, 60.0, 16, (2, "42,950 MB of bodies at 716 MB/s, 16 usable CPUs")),
        (40 * GB, None, 4, (2, "42,950 MB of bodies at as fast as possible, 4 usable CPUs")),
    ],
)
def test_auto_workers_only_where_a_thread_cannot_keep_up(body_bytes, span_s, cpus, want):
    from replayer.replay.workers import auto_workers

    assert auto_workers(body_bytes, span_s, cpus) == want


@pytest.mark.inprocess
def test_workers_option_takes_auto_or_a_count():
    from replayer.errors import OptionError

    assert ReplayPolicy().workers == "auto"
    assert ReplayPolicy(workers="auto").workers == "auto"
    assert ReplayPolicy(workers="3").workers == 3
    for bad in (0, "none", True):
        with pytest.raises((OptionError, ValueError), match="workers"):
            ReplayPolicy(workers=bad)  # type: ignore[arg-type]


async def test_auto_says_why_in_the_summary(emulator_factory, tmp_path, monkeypatch):
    # on this machine's cores or a small trace, auto is one process; the
    # summary says which rule decided
    from replayer.replay import workers

    monkeypatch.setattr(workers, "AUTO_MIN_BYTES", 0)  # the sample trace counts as large
    monkeypatch.setattr(workers, "AUTO_MIN_CPUS", 1)
    trace = Trace.open(SAMPLES / "blocks-16x12.arrow")
    emu = emulator_factory(["--speed", "instant"])
    rows = select(trace)
    out = await replay_to_dir(
        trace, rows, ReplayPolicy(timing=Timing.ASAP), [Endpoint("e", emu.url)], tmp_path / "r"
    )
    assert out.exit_code == 0
    bw = out.summary["body_workers"]
    assert (bw["workers"], bw["died"]) == (2, [])
    assert re.fullmatch(r"[\d,]+ MB of bodies at as fast as possible, \d+ usable CPUs", bw["auto"])


@pytest.mark.parametrize("n", [1, 2])
async def test_a_replay_in_another_token_range_leaves_the_callers_trace_as_it_was(
    emulator_factory, tmp_path, n
):
    """``--token-range`` and ``--body-cache-mb`` are the replay's: the server
    gets the bodies of the policy's range (from this process or from the
    workers), and the trace the caller handed in keeps its token space,
    cache bound and bodies."""
    trace = Trace.open(SAMPLES / "blocks-16x12.arrow")
    recorded = dict(trace.iter_json())
    emu = emulator_factory(["--speed", "instant"], log_bodies=True)
    policy = ReplayPolicy(timing=Timing.ASAP, token_range=(3, 1000), body_cache_mb=1, workers=n)
    rows = select(trace)
    out = await replay_to_dir(trace, rows, policy, [Endpoint("e", emu.url)], tmp_path / "r")
    assert out.exit_code == 0
    space = TokenSpace(3, 1000, trace.recorded_tokens.salt)
    replayed = as_replayed(trace, policy)
    assert (replayed.tokens, replayed.body_cache_bytes) == (space, 1 << 20)
    assert out.replay is not None and out.replay.trace.tokens == space
    rid = trace.column("request_id")
    bodies = reference(replayed, rows, policy)
    want = {rid[r]: hashlib.sha256(b).hexdigest() for r, b in zip(rows, bodies, strict=True)}
    log = [e for e in emu.read_request_log() if e["event"] == "request"]
    assert {e["request_id"]: e["body_sha256"] for e in log} == want
    assert (trace.tokens, trace.body_cache_bytes) == (TokenSpace(), 512 << 20)
    assert dict(trace.iter_json()) == recorded
