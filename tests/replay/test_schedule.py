"""Joins on the schedule: a request waits for the end of every request it
joins on (the trace's ``after``), in every order and timing; exactly, on
virtual time, and against the emulator's own request log with a real
kv-cache-tester session and its sub-agent."""

from __future__ import annotations

import pytest

from replayer.cli import build_parser
from replayer.replay.client import Endpoint
from replayer.replay.engine import Replay
from replayer.replay.plan import build_plan, select
from replayer.replay.policy import OnFailure, Order, ReplayPolicy, Timing
from replayer.replay.results import ResultsWriter, Status, read_results
from replayer.testing import FakeServer, Script, VirtualClock
from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace.subset import write_subset
from tests.helpers.replay import MODEL, arrivals, replay

# (request id, session, turn, recorded start and end in ms, joins): a parent
# P launches sub-agents A (two turns) and B from p0; p1 carries both results
JOINED = [
    ("p0", "P", 0, 0, 10, None),
    ("a0", "A", 0, 12, 30, ["p0"]),
    ("b0", "B", 0, 15, 50, ["p0"]),
    ("a1", "A", 1, 35, 60, None),
    ("p1", "P", 1, 100, 110, ["a1", "b0"]),
    ("p2", "P", 2, 130, 140, None),
]


def make_trace(path, rows=JOINED):
    with TraceWriter(path, TraceMeta(source="test")) as w:
        for rid, sid, turn, start, end, after in rows:
            body = {"model": "m", "prompt": rid, "max_tokens": 3}
            w.add(
                RequestRecord.from_body(
                    body,
                    request_id=rid,
                    session_id=sid,
                    turn=turn,
                    start_us=start * 1000,
                    end_us=end * 1000,
                    after=after,
                )
            )
    return Trace.open(path)


async def vreplay(tmp_path, trace, policy, rows=None, script=None):
    """Replay on virtual time (every request answered 20 ms after it
    arrives unless ``script`` says otherwise): arrival ms and results by id."""
    clock = VirtualClock(limit=3600)
    server = FakeServer(clock, script) if script else FakeServer(clock)
    writer = ResultsWriter(tmp_path / f"results-{id(clock)}.arrow")
    plan = build_plan(trace, select(trace) if rows is None else rows, policy)
    run = Replay(trace, plan, policy, [Endpoint("e", "http://e")], writer, clock=clock,
                 transport=server)  # fmt: skip
    try:
        await run.run()
    finally:
        writer.close()
    at = {a.request_id: round((a.at - run.t0) * 1000, 3) for a in server.arrivals}
    results = {r["request_id"]: r for r in read_results(writer.path)}
    return at, results


ASAP = {"p0": 0, "a0": 20, "b0": 20, "a1": 40, "p1": 60, "p2": 80}
# gaps: each think gap runs from the latest recorded end of what it waits
# for: a0 2 ms after p0 (12 - 10), b0 5, a1 5 after a0, p1 40 after a1's
# recorded end (the latest of a1 60, b0 50, p0 10), p2 20 after p1
GAPS = {"p0": 0, "a0": 22, "b0": 25, "a1": 47, "p1": 107, "p2": 147}


@pytest.mark.inprocess
@pytest.mark.parametrize("order", [Order.STRICT, Order.SESSION])
@pytest.mark.parametrize(
    ("timing", "want"),
    [(Timing.ASAP, ASAP), (Timing.GAPS, GAPS), (Timing.RECORDED, GAPS)],
)
async def test_a_join_waits_for_the_end_of_what_it_names(tmp_path, order, timing, want):
    trace = make_trace(tmp_path / "t.arrow")
    at, res = await vreplay(tmp_path, trace, ReplayPolicy(timing=timing, order=order))
    # recorded: every due time is past its recorded start, so as gaps
    assert at == want
    assert all(r["status"] == Status.OK for r in res.values())


@pytest.mark.inprocess
@pytest.mark.parametrize("timing", list(Timing))
async def test_admitted_order_honours_joins_too(tmp_path, timing):
    trace = make_trace(tmp_path / "t.arrow")
    at, res = await vreplay(tmp_path, trace, ReplayPolicy(timing=timing, order=Order.ADMITTED))
    for rid, _, _, _, _, after in JOINED:
        for dep in after or ():
            assert at[rid] * 1000 >= res[dep]["done_us"], (rid, dep)
    assert list(at) == ["p0", "a0", "b0", "a1", "p1", "p2"]


@pytest.mark.inprocess
async def test_a_failed_dependency_still_releases_its_dependant(tmp_path):
    trace = make_trace(tmp_path / "t.arrow")
    policy = ReplayPolicy(timing=Timing.ASAP, on_failure=OnFailure.CONTINUE)
    at, res = await vreplay(
        tmp_path, trace, policy, script=lambda rid: Script(status=500 if rid == "a1" else 200)
    )
    assert res["a1"]["status"] == Status.HTTP_ERROR
    # a1 arrives at 40 and fails at its headers (10 ms): p1 goes then
    assert (at["a1"], res["a1"]["done_us"], at["p1"]) == (40, 50_000, 50)


@pytest.mark.inprocess
async def test_a_join_on_an_unselected_request_is_dropped(tmp_path):
    trace = make_trace(tmp_path / "t.arrow")
    rows = select(trace, sessions="P,B")  # sub-agent A left out
    plan = build_plan(trace, rows, ReplayPolicy())
    assert [trace.column("request_id")[r] for r in plan.rows] == ["p0", "b0", "p1", "p2"]
    assert plan.after == [(), (0,), (1,), ()]
    at, _ = await vreplay(tmp_path, trace, ReplayPolicy(timing=Timing.ASAP), rows=rows)
    assert at == {"p0": 0, "b0": 20, "p1": 40, "p2": 60}


@pytest.mark.inprocess
async def test_a_subset_without_a_sub_agent_replays_without_waiting(tmp_path):
    """What a bisect candidate is: the rows it keeps, written as a trace."""
    trace = make_trace(tmp_path / "t.arrow")
    keep = [r for r in trace.order if trace.column("session_id")[r] != "A"]
    write_subset(trace, keep, tmp_path / "cand.arrow")
    cand = Trace.open(tmp_path / "cand.arrow")
    after = dict(zip(cand.column("request_id"), cand.column("after"), strict=True))
    assert after == {"p0": None, "b0": ["p0"], "p1": ["b0"], "p2": None}
    at, _ = await vreplay(tmp_path, cand, ReplayPolicy(timing=Timing.ASAP))
    assert at == {"p0": 0, "b0": 20, "p1": 40, "p2": 60}
    # and with no sub-agent left at all, p1 follows p0 at once
    solo = [r for r in trace.order if trace.column("session_id")[r] == "P"]
    write_subset(trace, solo, tmp_path / "solo.arrow")
    solo_trace = Trace.open(tmp_path / "solo.arrow")
    at, _ = await vreplay(tmp_path, solo_trace, ReplayPolicy(timing=Timing.ASAP))
    assert at == {"p0": 0, "p1": 20, "p2": 40}


@pytest.mark.inprocess
def test_the_plan_drops_a_join_on_a_later_request(tmp_path):
    rows = [
        ("x0", "X", 0, 0, 10, ["y0"]),  # y0 starts later: strict order could never send x0
        ("y0", "Y", 0, 5, 20, None),
        ("x1", "X", 1, 30, 40, ["y0", "nope"]),  # a name not in the trace: dropped
    ]
    trace = make_trace(tmp_path / "t.arrow", rows)
    plan = build_plan(trace, select(trace), ReplayPolicy())
    assert plan.after == [(), (), (1,)]
    assert [plan.waits(i) for i in range(3)] == [(), (), (0, 1)]
    assert plan.gap[2] == pytest.approx(0.010)  # 30 - y0's end 20
    # no joins at all: no per-request list
    plain = make_trace(tmp_path / "p.arrow", [r[:5] + (None,) for r in rows])
    assert build_plan(plain, select(plain), ReplayPolicy()).after is None


# -- the acceptance: a real sub-agent, the emulator's own log ----------------


def import_kv(src, out):
    args = build_parser().parse_args(["import", "kv-cache-tester", str(src), "-o", str(out)])
    assert args.func(args) == 0
    return Trace.open(out)


@pytest.mark.parametrize("order", ["strict", "session", "admitted"])
async def test_a_parent_turn_reaches_the_server_after_its_sub_agent_ended(
    emulator_factory, shared_data, tmp_path, order
):
    """trace_0003 replayed as fast as possible: the parent's first turn, its
    Explore sub-agent's ten, then the parent's turn that carries the result
    and two more. Server-side, each request that joins on another arrives
    after that one arrived and once nothing is running or waiting in the
    engine: every join ended (it is one chain: nothing else may be in
    flight); without joins the sub-agent ran beside its parent."""
    src = shared_data / "kv_cache_tester_claude_code" / "trace_0003.json.gz"
    trace = import_kv(src, tmp_path / "t.arrow")
    emu = emulator_factory(["--speed", "200"], log_bodies=False)  # ~0.4 ms a token
    policy = ReplayPolicy(timing=Timing.ASAP, order=Order(order), model=MODEL)
    outcome, rows, results = await replay(
        trace, [Endpoint("e", emu.url)], tmp_path, policy, requests="0..13"
    )
    assert outcome.exit_code == 0
    assert all(r["status"] == Status.OK for r in results), [r["error"] for r in results]
    rid, after = trace.column("request_id"), trace.column("after")
    joins = {rid[r]: after[r] for r in rows if after[r]}
    assert joins == {
        "trace_0003/agent_001:0": ["trace_0003:0"],
        "trace_0003:1": ["trace_0003/agent_001:9"],
    }
    log = {e["request_id"]: e for e in arrivals(emu)}
    assert len(log) == 14
    for dependant, deps in joins.items():
        got = log[dependant]
        for dep in deps:
            assert log[dep]["seq"] < got["seq"], (dependant, dep)
        assert (got["running"], got["waiting"]) == (0, 0), dependant
    # the sub-agent's turns all came between its launch and its parent's next turn
    seq = [log[rid[r]]["session"] for r in sorted(rows, key=lambda r: log[rid[r]]["seq"])]
    assert seq == ["trace_0003"] + ["trace_0003/agent_001"] * 10 + ["trace_0003"] * 3


@pytest.mark.inprocess
async def test_a_bisect_that_removes_a_sub_agent_still_replays(tmp_path):
    """A whole bisect over the joined trace, each trial a real replay on
    virtual time. The crash needs p1 with sub-agent B's result: candidates
    without sub-agent A (whose last turn p1 joins on) still send every
    request they hold, and the result is B's turn and p1."""
    from replayer.bisect.oracle import Outcome
    from replayer.bisect.pipeline import Bisect, BisectOptions, run_bisect
    from replayer.bisect.runner import FunctionRunner, Observation, Trial

    trace = make_trace(tmp_path / "t.arrow")
    sent: list[tuple[list[str], dict[str, float]]] = []

    async def run(trial: Trial) -> Observation:
        at, _ = await vreplay(trial.out, trial.trace, trial.policy, rows=list(trial.rows))
        sent.append((trial.request_ids(), at))
        if {"b0", "p1"} <= set(at):
            return Observation(Outcome.MATCH, signature="planted", failed_request="p1")
        return Observation(Outcome.PASS)

    opts = BisectOptions(
        stages=("calibrate", "cut", "prefix", "sessions", "turns"),
        calibrate_matches=2,
        calibrate_runs=3,
        confirm=2,
    )
    b = Bisect(trace, select(trace), FunctionRunner(run), tmp_path / "b", opts,
               policy=ReplayPolicy(timing=Timing.ASAP), say=lambda m: None)  # fmt: skip
    res = await run_bisect(b)
    assert res.status == "complete" and res.requests == ["b0", "p1"]
    without_a = [(ids, at) for ids, at in sent if "p1" in ids and "a1" not in ids]
    assert without_a  # the search did replay p1 without its sub-agent A
    for ids, at in sent:
        assert set(at) == set(ids), ids  # every request of every trial was sent
    bundle = Trace.open(tmp_path / "b" / "bundle" / "trace.arrow")
    after = dict(zip(bundle.column("request_id"), bundle.column("after"), strict=True))
    assert after == {"b0": None, "p1": ["b0"]}  # p0 and a1 are gone, so are joins on them
