"""The replay engine, in two halves.

On a virtual clock with a fake server (:mod:`replayer.testing.virtual`): the schedule
itself, exactly. Dispatch times are the recorded offsets / speed to the
microsecond, turns wait for their predecessor plus the think gap, order is
trace order, the watchdog fires at its threshold. Nothing there depends on
how loaded the machine is.

Against real emulator subprocesses: what only a real server shows (bodies
as received, headers, connection reuse, live mode), with the emulator's own
request log as ground truth, and only what the code guarantees about it:
strict order fixes the order requests are *sent* in, but two requests on
different connections can be *read* by the server either way round (a new
connection is accepted a loop pass after data on an open one), so the
server-side order is asserted where a response orders it (admitted order,
turns of one session).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest

from replayer._async import spawn
from replayer.monitor.watch import WatchConfig
from replayer.replay import dispatch, schedule
from replayer.replay.client import Endpoint
from replayer.replay.content import TargetContent
from replayer.replay.engine import Replay
from replayer.replay.plan import build_plan, select
from replayer.replay.policy import Mode, OnFailure, Order, ReplayPolicy, Timing
from replayer.replay.results import ResultsWriter
from replayer.testing import FakeHealth, FakeServer, Script, VirtualClock
from replayer.trace import Kind, RequestRecord, Trace, TraceMeta, TraceWriter
from tests.helpers.replay import MODEL, arrivals, replay, synth

REPO = Path(__file__).resolve().parents[2]


async def test_strict_order_sends_in_trace_order(emulator_factory, tmp_path):
    # 24 sessions arriving fast, each turn waiting on the last: heavy interleaving
    t = synth(tmp_path, sessions=24, turns=5, context=6_000, rate=40, think=0.01, seed=3)
    emu = emulator_factory(["--speed", "20"], log_bodies=False)  # ~8 ms a request
    out, rows, results = await replay(
        t, [Endpoint("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP)
    )
    assert out.exit_code == 0
    rid = t.column("request_id")
    # sent in trace order (seq is the dispatch order)
    by_id = {r["request_id"]: r for r in results}
    assert [by_id[rid[r]]["seq"] for r in rows] == list(range(len(rows)))
    # the server took every request once, each session's turns in order (a
    # turn is sent only after the server answered the one before)
    log = arrivals(emu)
    assert sorted(e["request_id"] for e in log) == sorted(rid[r] for r in rows)
    turns: dict[str, list[int]] = {}
    for e in log:
        turns.setdefault(e["session"], []).append(int(e["request_id"][-3:]))
    assert turns == {f"synth-{s:05d}": list(range(5)) for s in range(24)}
    # no turn went out before its predecessor completed (one process, one clock)
    for r in rows:
        k = t.column("turn")[r]
        if k:
            prev = by_id[f"{t.column('session_id')[r]}-t{k - 1:03d}"]
            assert by_id[rid[r]]["dispatched_us"] >= prev["done_us"]


async def test_admitted_order_waits_for_each_streams_headers(emulator_factory, tmp_path):
    """Admitted order: trace order on arrival, and no request leaves before
    the previous one's response headers came (the engine has taken it)."""
    t = synth(tmp_path, sessions=8, turns=3, context=6_000, rate=100, think=0.0, seed=6)
    emu = emulator_factory(["--speed", "20"], log_bodies=False)
    out, rows, results = await replay(
        t,
        [Endpoint("e", emu.url)],
        tmp_path,
        ReplayPolicy(timing=Timing.ASAP, order=Order.ADMITTED),
    )
    assert out.exit_code == 0
    rid = t.column("request_id")
    assert [e["request_id"] for e in arrivals(emu)] == [rid[r] for r in rows]
    by_seq = sorted(results, key=lambda r: r["seq"])
    assert [r["request_id"] for r in by_seq] == [rid[r] for r in rows]
    for prev, nxt in zip(by_seq, by_seq[1:], strict=False):
        assert nxt["dispatched_us"] >= prev["first_byte_us"]


async def test_session_order_keeps_each_session_in_order(emulator_factory, tmp_path):
    t = synth(tmp_path, sessions=12, turns=6, context=6_000, rate=100, think=0.0, seed=4)
    emu = emulator_factory(["--speed", "20"])
    out, rows, results = await replay(
        t, [Endpoint("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP, order=Order.SESSION)
    )
    assert out.exit_code == 0
    seen: dict[str, list[int]] = {}
    for e in arrivals(emu):
        seen.setdefault(e["session"], []).append(int(e["request_id"][-3:]))
    assert seen == {f"synth-{s:05d}": list(range(6)) for s in range(12)}
    by_id = {r["request_id"]: r for r in results}
    for r in results:
        k = r["turn"]
        if k:
            prev = by_id[f"{r['session_id']}-t{k - 1:03d}"]
            assert r["dispatched_us"] >= prev["done_us"]


def timed_trace(tmp_path, starts_ms, name="timed.arrow"):
    p = tmp_path / name
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for i, ms in enumerate(starts_ms):
            w.add(
                RequestRecord.from_body(
                    {"model": MODEL, "prompt": f"request {i}", "max_tokens": 2},
                    request_id=f"r{i}",
                    session_id=f"s{i}",
                    turn=0,
                    start_us=ms * 1000,
                )
            )
    return Trace.open(p)


async def test_recorded_timing_on_a_real_server_is_never_early(emulator_factory, tmp_path):
    # the exact times are asserted on the virtual clock (below); here, the
    # real clock's precise wait: scheduled as recorded, never sent before it
    # (how late depends on the machine: bench/RESULTS.md has the lag figures)
    starts = [0, 40, 90, 150, 300, 310, 320, 500]
    t = timed_trace(tmp_path, starts)
    emu = emulator_factory(["--speed", "instant"])
    out, rows, results = await replay(
        t, [Endpoint("e", emu.url)], tmp_path, ReplayPolicy(speed=2.0)
    )
    assert out.exit_code == 0
    by_id = {r["request_id"]: r for r in results}
    for i, ms in enumerate(starts):
        r = by_id[f"r{i}"]
        assert r["scheduled_us"] == ms * 500
        assert r["dispatched_us"] >= r["scheduled_us"]
    assert len(arrivals(emu)) == len(starts)


async def test_recorded_timing_waits_for_the_previous_turn_plus_think_gap(
    emulator_factory, tmp_path
):
    p = tmp_path / "t.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        # turn 1 recorded 50 ms after turn 0 ended; turn 0 takes ~200 ms here
        w.add(
            RequestRecord.from_body(
                {"model": MODEL, "prompt": "a", "max_tokens": 10},
                request_id="t0",
                session_id="s",
                turn=0,
                start_us=0,
                end_us=20_000,
            )
        )
        w.add(
            RequestRecord.from_body(
                {"model": MODEL, "prompt": "ab", "max_tokens": 1},
                request_id="t1",
                session_id="s",
                turn=1,
                start_us=70_000,
            )
        )
    emu = emulator_factory(["--decode-time", "0.02"])
    out, _, results = await replay(Trace.open(p), [Endpoint("e", emu.url)], tmp_path)
    by_id = {r["request_id"]: r for r in results}
    t0, t1 = by_id["t0"], by_id["t1"]
    assert t0["done_us"] > 150_000  # 10 decode steps of 20 ms
    assert t1["scheduled_us"] == t0["done_us"] + 50_000  # not at its recorded 70 ms
    assert t1["dispatched_us"] >= t1["scheduled_us"]


@pytest.mark.parametrize(
    ("starts_ms", "before_t0", "opened"),
    [([0] * 6, 6, 6), ([0, 1000], 1, 1)],
    ids=["a-burst-of-six", "one-now-one-later"],
)
async def test_the_first_seconds_connections_open_before_t0(
    emulator_factory, tmp_path, starts_ms, before_t0, opened
):
    """A burst of new sessions against a server busy with prefill needs a
    connection each; opened inside the burst they made its tail late. The
    requests due in the first second find theirs open (and nothing more
    is opened for them); a later one reuses what is idle."""
    emu = emulator_factory(["--decode-time", "0.02"])
    out, _, results = await replay(
        timed_trace(tmp_path, starts_ms), [Endpoint("e", emu.url)], tmp_path
    )
    assert out.exit_code == 0 and [r["status"] for r in results] == ["ok"] * len(starts_ms)
    conns = out.summary["targets"]["e"]["connections"]
    assert conns == {"opened": opened, "before_t0": before_t0}
    assert len({e["peer_port"] for e in arrivals(emu)}) == opened


async def test_idle_connections_are_dropped_before_the_server_drops_them(
    emulator_factory, tmp_path
):
    # vLLM closes a keep-alive connection idle for 5 s; a request written on a
    # connection the server is closing fails as if the server had crashed. So
    # the replayer reuses a connection after a short gap and never after a
    # gap longer than IDLE_CLOSE_S.
    from replayer._http import IDLE_CLOSE_S

    gap_us = round((IDLE_CLOSE_S + 0.4) * 1e6)
    p = tmp_path / "gaps.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for k, start in enumerate((0, 100_000, 100_000 + gap_us)):
            w.add(
                RequestRecord.from_body(
                    {"model": MODEL, "prompt": "a" * (k + 1), "max_tokens": 1},
                    request_id=f"t{k}",
                    session_id="s",
                    turn=k,
                    start_us=start,
                    end_us=start + 1_000,
                )
            )
    emu = emulator_factory(["--speed", "instant"])
    await replay(Trace.open(p), [Endpoint("e", emu.url)], tmp_path)
    ports = [e["peer_port"] for e in arrivals(emu)]
    assert len(ports) == 3
    assert ports[1] == ports[0]  # 0.1 s idle: kept alive
    assert ports[2] != ports[1]  # idle past IDLE_CLOSE_S: a fresh connection


def blocks_trace(tmp_path):
    p = tmp_path / "b.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for k in range(3):
            w.add(
                RequestRecord(
                    request_id=f"b{k}",
                    session_id="s",
                    turn=k,
                    start_us=k,
                    kind=Kind.BLOCKS,
                    params={"model": MODEL, "prompt": None, "max_tokens": 3, "ignore_eos": True},
                    content=list(range(1, 3 + k)),
                    block_size=16,
                    input_tokens=16 * (2 + k) + 5,
                )
            )
        w.add(
            RequestRecord.from_body(
                {"model": MODEL, "prompt": "some text ü", "max_tokens": 2, "temperature": 0.5},
                request_id="x0",
                session_id="x",
                turn=0,
                start_us=10,
            )
        )
    return Trace.open(p)


async def test_verbatim_bodies_arrive_as_recorded(emulator_factory, tmp_path):
    chat = synth(tmp_path, sessions=2, turns=3, context=5_000, seed=8)
    blocks = blocks_trace(tmp_path)
    emu = emulator_factory(["--speed", "instant"], log_bodies=True)
    for name, t in (("chat", chat), ("blocks", blocks)):
        out, rows, _ = await replay(
            t, [Endpoint("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP), name=name
        )
        assert out.exit_code == 0
    log = {e["request_id"]: e for e in arrivals(emu)}
    for t in (chat, blocks):
        for r in range(len(t)):
            body = t.body(r)
            if t.column("kind")[r] == "blocks":  # token ids regenerated identically
                assert len(body["prompt"]) == t.column("input_tokens")[r]
            sent = log[t.column("request_id")[r]]["body"]
            assert sent == {**body, "stream": True, "stream_options": {"include_usage": True}}


async def test_without_force_stream_bodies_are_byte_identical(emulator_factory, tmp_path):
    t = blocks_trace(tmp_path)
    emu = emulator_factory(["--speed", "instant"], log_bodies=True)
    out, rows, results = await replay(
        t, [Endpoint("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP, force_stream=False)
    )
    assert out.exit_code == 0
    log = {e["request_id"]: e for e in arrivals(emu)}
    for r in rows:
        raw = t.body_json(r)
        e = log[t.column("request_id")[r]]
        assert (e["body_bytes"], e["body_sha256"]) == (len(raw), hashlib.sha256(raw).hexdigest())
    assert {r["status"] for r in results} == {"ok"}


async def test_model_override_and_request_headers(emulator_factory, tmp_path):
    t = timed_trace(tmp_path, [0, 1, 2])
    emu = emulator_factory(["--speed", "instant", "--served-model-name", "other"], log_bodies=True)
    out, _, _ = await replay(
        t, [Endpoint("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP, model="other")
    )
    assert out.exit_code == 0
    # keyed by request id: the three go out at once on three connections, and
    # the server may read them in any order (see the module docstring)
    log = {e["request_id"]: e for e in arrivals(emu)}
    assert {rid: (e["body"]["model"], e["session"]) for rid, e in log.items()} == {
        "r0": ("other", "s0"),
        "r1": ("other", "s1"),
        "r2": ("other", "s2"),
    }


async def test_live_mode_threads_the_targets_replies(emulator_factory, tmp_path):
    t = synth(tmp_path, sessions=1, turns=3, context=5_000, seed=5)
    emu = emulator_factory(["--speed", "instant"], log_bodies=True)
    out, rows, results = await replay(
        t,
        [Endpoint("e", emu.url)],
        tmp_path,
        ReplayPolicy(timing=Timing.ASAP, mode=Mode.LIVE, save_output=True),
    )
    assert out.exit_code == 0
    log = {e["request_id"]: e["body"]["messages"] for e in arrivals(emu)}
    by_id = {r["request_id"]: r for r in results}
    recorded = [t.body(r)["messages"] for r in rows]
    n0 = len(recorded[0])
    # turn 1 carries turn 0's live reply where the recorded tool call was
    live0 = log["synth-00000-t001"][n0]
    assert live0 == {"role": "assistant", "content": by_id["synth-00000-t000"]["output_text"]}
    assert recorded[1][n0]["tool_calls"]  # the recorded reply was a tool call
    assert log["synth-00000-t001"][:n0] == recorded[0]
    assert log["synth-00000-t001"][n0 + 1 :] == recorded[1][n0 + 1 :]
    # and turn 2 carries both live replies
    assert log["synth-00000-t002"][n0] == live0
    n1 = len(recorded[1])
    assert log["synth-00000-t002"][n1]["content"] == by_id["synth-00000-t001"]["output_text"]


async def test_every_request_is_accounted_for_once_per_target(emulator_factory, tmp_path):
    t = synth(tmp_path, sessions=4, turns=4, context=5_000, seed=2)
    a = emulator_factory(["--speed", "instant"])
    b = emulator_factory(["--speed", "instant"])
    out, rows, results = await replay(
        t,
        [Endpoint("a", a.url), Endpoint("b", b.url)],
        tmp_path,
        ReplayPolicy(timing=Timing.ASAP),
        limit=10,
    )
    assert out.exit_code == 0
    rid = t.column("request_id")
    for name in ("a", "b"):
        mine = [r for r in results if r["target"] == name]
        assert sorted(r["request_id"] for r in mine) == sorted(rid[r] for r in rows)
        assert {r["status"] for r in mine} == {"ok"}
    assert len(arrivals(a)) == len(arrivals(b)) == 10
    assert orjson.loads((tmp_path / "run" / "run.json").read_bytes())["selection"]["count"] == 10


# -- on the virtual clock: the schedule, exactly --------------------------------------


async def vreplay(
    tmp_path,
    trace,
    policy=None,
    *,
    script=None,
    targets=("e",),
    watch=None,
    probers=None,
    clock=None,
):
    """Replay ``trace`` against a fake server on a virtual clock (with a
    watch: its /health prober a fake, 200 unless ``probers(clock)`` says
    otherwise); the Replay, the fake (its arrival log covers every target)
    and the clock."""
    policy = policy or ReplayPolicy()
    clock = clock or VirtualClock(limit=3600)
    server = FakeServer(clock, script) if script else FakeServer(clock)
    if watch is not None and probers is None:
        probers = {name: FakeHealth(clock) for name in targets}
    elif probers is not None:
        probers = probers(clock)
    writer = ResultsWriter(tmp_path / f"results-{id(clock)}.arrow")
    replay = Replay(
        trace,
        build_plan(trace, select(trace), policy),
        policy,
        [Endpoint(name, f"http://{name}") for name in targets],
        writer,
        clock=clock,
        transport=server,
        watch=watch,
        probers=probers,
    )
    try:
        await replay.run()
    finally:
        writer.close()
    return replay, server, clock


def us_after_t0(replay, at):
    return round((at - replay.t0) * 1e6)


def by_id(replay, target="e"):
    return {r.request_id: r for r in replay.runs[target].results}


def session_trace(tmp_path, sessions, name="s.arrow"):
    """``sessions``: per session, its turns as (start ms, end ms)."""
    p = tmp_path / name
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for s, turns in sessions.items():
            for k, (start, end) in enumerate(turns):
                w.add(
                    RequestRecord.from_body(
                        {"model": MODEL, "prompt": f"{s} turn {k}", "max_tokens": 2},
                        request_id=f"{s}-{k}",
                        session_id=s,
                        turn=k,
                        start_us=start * 1000,
                        end_us=None if end is None else end * 1000,
                    )
                )
    return Trace.open(p)


@pytest.mark.inprocess
@pytest.mark.parametrize("speed", [1.0, 2.5, 0.25])
async def test_recorded_timing_dispatches_at_the_offsets_over_speed(tmp_path, speed):
    starts = [0, 40, 90, 90, 150, 300, 310, 320, 500, 800, 1000]
    replay, server, _ = await vreplay(
        tmp_path, timed_trace(tmp_path, starts), ReplayPolicy(speed=speed)
    )
    results = by_id(replay)
    for i, ms in enumerate(starts):
        r = results[f"r{i}"]
        assert r.scheduled_us == r.dispatched_us == round(ms * 1000 / speed), r
    # the server took them in trace order (ties too), each at its offset
    assert server.order() == [f"r{i}" for i in range(len(starts))]
    assert [us_after_t0(replay, a.at) for a in server.arrivals] == [
        round(ms * 1000 / speed) for ms in starts
    ]


@pytest.mark.inprocess
async def test_a_turn_waits_for_its_predecessor_plus_the_think_gap(tmp_path):
    # turn 1 was recorded 50 ms after turn 0 ended; turn 0 takes 200 ms here
    t = session_trace(tmp_path, {"slow": [(0, 20), (70, None)], "fast": [(0, 20), (70, None)]})
    script = {"slow-0": Script(ttft=0.2, tokens=1), "fast-0": Script(ttft=0.005, tokens=1)}
    for order, fast_at in ((Order.SESSION, 70_000), (Order.STRICT, 250_000)):
        replay, _, _ = await vreplay(
            tmp_path, t, ReplayPolicy(order=order), script=lambda rid: script.get(rid, Script())
        )
        r = by_id(replay)
        assert r["slow-0"].done_us == 200_000
        assert r["slow-1"].scheduled_us == r["slow-1"].dispatched_us == 250_000  # not at 70 ms
        assert r["fast-0"].done_us == 5_000
        # at its recorded start (5 + 50 < 70); in strict order not before
        # slow-1, the request before it in the trace
        assert r["fast-1"].scheduled_us == r["fast-1"].dispatched_us == fast_at


@pytest.mark.inprocess
async def test_gaps_timing_is_closed_loop(tmp_path):
    t = session_trace(tmp_path, {"s": [(0, 20), (70, None)]})
    replay, _, _ = await vreplay(
        tmp_path,
        t,
        ReplayPolicy(timing=Timing.GAPS),
        script=lambda rid: Script(ttft=0.005, tokens=1),
    )
    assert by_id(replay)["s-1"].dispatched_us == 5_000 + 50_000  # earlier than recorded


@pytest.mark.inprocess
async def test_strict_order_is_trace_order_and_each_turn_waits(tmp_path):
    t = synth(tmp_path, sessions=6, turns=4, context=5_000, rate=50, think=0.0, seed=3)

    def script(rid):  # sessions take different times: they interleave
        session, turn = int(rid[6:11]), int(rid[-3:])
        return Script(ttft=0.001 * (1 + (7 * session + 3 * turn) % 5), tokens=2, itl=0.002)

    replay, server, _ = await vreplay(tmp_path, t, ReplayPolicy(timing=Timing.ASAP), script=script)
    rid, sid, turn = t.column("request_id"), t.column("session_id"), t.column("turn")
    rows = select(t)
    results = by_id(replay)
    assert server.order() == [rid[r] for r in rows]
    assert [results[rid[r]].seq for r in rows] == list(range(len(rows)))
    due = 0
    for r in rows:
        x = results[rid[r]]
        if turn[r]:
            due = max(due, results[f"{sid[r]}-t{turn[r] - 1:03d}"].done_us)
        # due when its previous turn completed, and not before the previous
        # request in trace order was due; sent at that instant
        assert x.scheduled_us == x.dispatched_us == due, rid[r]


@pytest.mark.inprocess
async def test_admitted_order_waits_for_the_previous_response_headers(tmp_path):
    t = timed_trace(tmp_path, [0, 0, 0, 0])
    headers_after = Script(ttft=0.03, tokens=1)
    admitted, server, _ = await vreplay(
        tmp_path,
        t,
        ReplayPolicy(timing=Timing.ASAP, order=Order.ADMITTED),
        script=lambda rid: headers_after,
    )
    results = by_id(admitted)
    assert server.order() == ["r0", "r1", "r2", "r3"]
    assert [results[f"r{i}"].dispatched_us for i in range(4)] == [0, 30_000, 60_000, 90_000]
    for i in range(1, 4):
        assert results[f"r{i}"].dispatched_us == results[f"r{i - 1}"].first_byte_us
    strict, _, _ = await vreplay(
        tmp_path,
        t,
        ReplayPolicy(timing=Timing.ASAP),
        script=lambda rid: headers_after,
    )
    assert [r.dispatched_us for r in strict.runs["e"].results] == [0, 0, 0, 0]


@pytest.mark.inprocess
async def test_session_order_runs_each_session_on_its_own(tmp_path):
    t = session_trace(tmp_path, {s: [(0, 1), (1, 2), (2, None)] for s in ("a", "b", "c")})
    took = {"a": 0.010, "b": 0.025, "c": 0.040}
    replay, server, _ = await vreplay(
        tmp_path,
        t,
        ReplayPolicy(timing=Timing.ASAP, order=Order.SESSION),
        script=lambda rid: Script(ttft=took[rid[0]], tokens=1),
    )
    # each turn right when its own predecessor is done, whatever the others do
    assert [(a.request_id, us_after_t0(replay, a.at)) for a in server.arrivals] == [
        ("a-0", 0),
        ("b-0", 0),
        ("c-0", 0),
        ("a-1", 10_000),
        ("a-2", 20_000),
        ("b-1", 25_000),
        ("c-1", 40_000),
        ("b-2", 50_000),
        ("c-2", 80_000),
    ]
    assert {r.request_id: r.lag_us for r in replay.runs["e"].results} == {
        f"{s}-{k}": 0 for s in "abc" for k in range(3)
    }


@pytest.mark.inprocess
async def test_session_order_builds_each_body_just_before_it_is_due(tmp_path, monkeypatch):
    # thousands of sessions waiting for their start must not each hold a
    # body (memory) nor build them all at T0 before the first send (lag)
    clock = VirtualClock(limit=3600)
    built_at: dict[int, float] = {}
    orig = TargetContent.build

    def spy(self, i):
        built_at[i] = clock.now()
        return orig(self, i)

    monkeypatch.setattr(TargetContent, "build", spy)
    t = timed_trace(tmp_path, [k * 5 for k in range(120)])  # a one-turn session every 5 ms
    replay, _, _ = await vreplay(tmp_path, t, ReplayPolicy(order=Order.SESSION), clock=clock)
    built = {i: round((at - replay.t0) * 1e6) for i, at in built_at.items()}
    lead = round(schedule.BODY_LEAD * 1e6)
    for i, r in enumerate(replay.runs["e"].results):  # plan index i is r{i}
        assert r.dispatched_us == r.scheduled_us == i * 5_000
        if r.scheduled_us >= lead:
            assert built[i] == r.scheduled_us - lead
        else:  # due within the lead of T0: built at the start
            assert built[i] <= 0


@pytest.mark.inprocess
async def test_every_target_runs_the_same_schedule_from_one_anchor(tmp_path):
    starts = [0, 40, 90, 150, 300]
    replay, server, _ = await vreplay(
        tmp_path, timed_trace(tmp_path, starts), targets=("mi355", "b300")
    )
    for name in ("mi355", "b300"):
        assert [r.dispatched_us for r in replay.runs[name].results] == [ms * 1000 for ms in starts]
        assert server.order(f"http://{name}") == [f"r{i}" for i in range(len(starts))]


@pytest.mark.inprocess
async def test_a_failure_stops_dispatch_and_the_rest_is_not_sent(tmp_path):
    t = timed_trace(tmp_path, [0, 100, 200, 300, 400, 500])
    fails = Script(ttft=0.010, status=500)
    replay, server, _ = await vreplay(
        tmp_path, t, script=lambda rid: fails if rid == "r2" else Script()
    )
    run = replay.runs["e"]
    assert run.failure is not None
    assert (run.failure.kind, run.failure.request_id, run.failure.at_us) == (
        "http_500",
        "r2",
        210_000,
    )
    assert server.order() == ["r0", "r1", "r2"]
    assert [r.status.value for r in run.results] == [
        "ok",
        "ok",
        "http_error",
        "not_sent_after_crash",
        "not_sent_after_crash",
        "not_sent_after_crash",
    ]


@pytest.mark.inprocess
async def test_a_burst_opens_its_connections_together_and_writes_in_trace_order(tmp_path):
    # 40 requests due at once, each connection 10 ms to open: opened one after
    # another (each once the previous request was written) the last would go
    # at 400 ms; AHEAD of them open together, each written once the one
    # before it is
    n = dispatch.AHEAD + 8
    t = timed_trace(tmp_path, [0] * n)
    replay, server, _ = await vreplay(
        tmp_path, t, script=lambda rid: Script(connect=0.010, ttft=1.0, tokens=1)
    )
    results = replay.runs["e"].results
    assert server.order() == [f"r{i}" for i in range(n)]
    assert [r.seq for r in results] == list(range(n))
    # the next one's connection opens once the oldest waiting one is written
    assert [r.dispatched_us for r in results] == [10_000] * dispatch.AHEAD + [20_000] * 8
    assert [us_after_t0(replay, a.at) for a in server.arrivals] == [
        r.dispatched_us for r in results
    ]
    assert all(r.status.value == "ok" for r in results)


@pytest.mark.inprocess
async def test_a_request_still_connecting_when_the_target_fails_is_never_sent(tmp_path):
    # r1 is due at 5 ms but its connection opens at 25 ms; r0 failed at 10 ms
    t = timed_trace(tmp_path, [0, 5, 6])
    script = {"r0": Script(ttft=0.010, status=500), "r1": Script(connect=0.020)}
    replay, server, _ = await vreplay(tmp_path, t, script=lambda rid: script.get(rid, Script()))
    run = replay.runs["e"]
    assert run.failure is not None and run.failure.at_us == 10_000
    assert server.order() == ["r0"]
    got = [(r.status.value, r.error_class, r.seq, r.dispatched_us) for r in run.results]
    assert got == [
        ("http_error", "http_500", 0, 0),
        ("not_sent_after_crash", "target_failed", None, None),
        ("not_sent_after_crash", "target_failed", None, None),
    ]


@pytest.mark.inprocess
async def test_continue_after_a_failure_keeps_the_schedule(tmp_path):
    t = timed_trace(tmp_path, [0, 100, 200, 300])
    fails = Script(ttft=0.010, status=500)
    replay, server, _ = await vreplay(
        tmp_path,
        t,
        ReplayPolicy(on_failure=OnFailure.CONTINUE),
        script=lambda rid: fails if rid == "r1" else Script(),
    )
    assert [r.dispatched_us for r in replay.runs["e"].results] == [0, 100_000, 200_000, 300_000]
    assert replay.runs["e"].failure.at_us == 110_000


WATCH = WatchConfig(
    health_interval=1.0, stall_timeout=5.0, settle=2.0, grace=1.0, scrape_target=False
)


@pytest.mark.inprocess
async def test_the_watchdog_declares_a_hang_exactly_stall_timeout_after_the_last_token(
    tmp_path,
):
    t = session_trace(tmp_path, {"s": [(0, 10), (20, 30), (40, None)]})
    # turn 1 streams two tokens (at 10 and 15 ms after it went), then nothing
    script = {"s-1": Script(ttft=0.010, tokens=5, itl=0.005, hang_after=2)}
    clock_health: list[FakeHealth] = []

    def probers(clock):
        h = FakeHealth(clock)  # a hung vLLM still answers /health 200
        clock_health.append(h)
        return {"e": h}

    replay, server, clock = await vreplay(
        tmp_path, t, script=lambda rid: script.get(rid, Script()), watch=WATCH, probers=probers
    )
    run = replay.runs["e"]
    r = by_id(replay)
    last_token_us = r["s-1"].dispatched_us + 15_000
    assert run.failure is not None and run.failure.kind == "hang"
    assert run.failure.at_us == last_token_us + 5_000_000
    assert (r["s-1"].status.value, r["s-1"].error_class) == ("timeout", "hang")
    assert r["s-1"].done_us == last_token_us + 5_000_000  # aborted by the watchdog
    assert r["s-2"].status.value == "not_sent_after_crash"
    assert run.report is not None and run.report.failure_class.value == "hang"
    assert clock_health[0].closed


@pytest.mark.inprocess
async def test_a_long_prefill_gets_its_allowance_and_no_more(tmp_path):
    t = session_trace(tmp_path, {"s": [(0, None)]})
    tokens = t.column("input_tokens")[0]
    config = WatchConfig(
        health_interval=1.0,
        stall_timeout=1.0,
        min_prefill_rate=tokens / 8,  # 8 s of prefill allowed, plus the stall timeout
        settle=1.0,
        grace=1.0,
        scrape_target=False,
    )
    # first token after 8.5 s of silence: within the allowance, not a hang
    ok, _, _ = await vreplay(tmp_path, t, watch=config, script=lambda rid: Script(ttft=8.5))
    assert ok.runs["e"].failure is None
    # headers, then silence: a hang exactly when the allowance runs out
    hung, _, _ = await vreplay(
        tmp_path, t, watch=config, script=lambda rid: Script(ttft=0.5, hang_after=0)
    )
    f = hung.runs["e"].failure
    assert f is not None and (f.kind, f.at_us) == ("hang", 9_000_000)


@pytest.mark.inprocess
@pytest.mark.parametrize("order", [Order.SESSION, Order.STRICT])
async def test_an_interrupt_during_a_hung_turn_sends_nothing_more(tmp_path, order):
    # Ctrl-C cancels the replay while a session waits on its hung first turn:
    # the session must stop there. (A session loop once took the cancel for
    # its send's, went on to the next turn, sent it into the hung server and
    # the interrupt waited on it.)
    import asyncio

    t = session_trace(tmp_path, {"a": [(0, 10), (20, 30), (40, 50)], "b": [(5, 15)]})
    policy = ReplayPolicy(timing=Timing.ASAP, order=order)
    clock = VirtualClock(limit=3600)
    hung = {"a-0"}
    server = FakeServer(clock, lambda rid: Script(hang_after=0 if rid in hung else None))
    writer = ResultsWriter(tmp_path / "r.arrow")
    replay = Replay(
        t,
        build_plan(t, select(t), policy),
        policy,
        [Endpoint("e", "http://e")],
        writer,
        clock=clock,
        transport=server,
    )
    task = spawn(replay.run(), name="replay")
    async with asyncio.timeout(30):  # wall-clock bound on the test itself
        while {a.request_id for a in server.arrivals} != {"a-0", "b-0"}:
            await clock.settle()
            await asyncio.sleep(0)
        await clock.settle()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    writer.close()
    assert sorted(a.request_id for a in server.arrivals) == ["a-0", "b-0"]
    got = {r.request_id: (r.status.value, r.error_class) for r in replay.runs["e"].results}
    assert got["a-0"] == ("timeout", "interrupted")
    assert got["a-1"] == got["a-2"] == ("not_sent_after_crash", "interrupted")
    assert got["b-0"] == ("ok", None)


@pytest.mark.inprocess
async def test_a_cookie_the_server_sets_is_never_sent_back(tmp_path):
    # A load balancer's stickiness cookie (AWSALB, say) on every response: a
    # client with a cookie jar would put it on every later request, headers
    # the trace never had, and route them differently than production did.
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    cookies: list[str | None] = []

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def complete(request):
        await request.read()
        cookies.append(request.headers.get("Cookie"))
        resp = web.json_response(
            {"id": "c", "object": "text_completion", "model": MODEL,
             "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
        )  # fmt: skip
        resp.set_cookie("AWSALB", f"node-{len(cookies)}")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        t = timed_trace(tmp_path, [0, 0, 0, 0])
        # by name: aiohttp's jar ignores cookies from IP-address hosts
        url = f"http://localhost:{server.port}"
        out, _, results = await replay(
            t, [Endpoint("e", url)], tmp_path, ReplayPolicy(timing=Timing.ASAP, force_stream=False)
        )
    finally:
        await server.close()
    assert out.exit_code == 0 and [r["status"] for r in results] == ["ok"] * 4
    assert cookies == [None] * 4


@pytest.mark.inprocess
async def test_two_targets_share_the_prompt_cache_and_leave_it_empty(tmp_path):
    """Each target's builder plans its builds: a session's prompts stay until
    the last target has built its last turn, then leave; a replay that
    stopped early takes back the builds it will not make."""
    t = Trace.open(REPO / "traces" / "blocks-16x12.arrow")
    cache = t._prompts._prompts
    replay, server, _ = await vreplay(tmp_path, t, targets=("mi355", "b300"))
    assert len(server.order("http://mi355")) == len(server.order("http://b300")) == len(t)
    assert t._prompts.stats["reused_blocks"] > 0
    assert (len(cache), cache._pending) == (0, {})

    fails = Script(ttft=0.010, status=500)
    stopped = Trace.open(REPO / "traces" / "blocks-16x12.arrow")
    third = stopped.column("request_id")[list(stopped.order)[len(stopped) // 3]]
    replay, server, _ = await vreplay(
        tmp_path, stopped, script=lambda rid: fails if rid == third else Script()
    )
    assert replay.runs["e"].failure is not None
    assert stopped._prompts._prompts._pending == {}
