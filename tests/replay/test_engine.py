"""The replay engine against real emulator subprocesses: order, dependencies,
timing, verbatim bodies, live mode. Ground truth is the emulator's log."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from replayer.replay.client import Target
from replayer.replay.plan import select
from replayer.replay.policy import Mode, Order, ReplayPolicy, Timing
from replayer.replay.results import read_results
from replayer.replay.run import replay_to_dir
from replayer.trace import Kind, RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace.synth import SynthOptions, write_trace

MODEL = "moonshotai/Kimi-K3"  # the emulator's default served model


def synth(tmp_path, name="t.arrow", **kw):
    p = tmp_path / name
    write_trace(p, SynthOptions(model=MODEL, **{"max_tokens": 8, **kw}))
    return Trace.open(p)


async def replay(trace, targets, tmp_path, policy=None, name="run", **selection):
    rows = select(trace, **selection)
    out = tmp_path / name
    out.mkdir()
    outcome = await replay_to_dir(
        trace, rows, policy or ReplayPolicy(), targets, out, command=["test"], progress=False
    )
    return outcome, rows, read_results(out / "results.arrow")


def arrivals(emu):
    return [e for e in emu.read_request_log() if e["event"] == "request"]


async def test_strict_order_arrives_in_trace_order(emulator_factory, tmp_path):
    # 24 sessions arriving fast, each turn waiting on the last: heavy interleaving
    t = synth(tmp_path, sessions=24, turns=5, context=6_000, rate=40, think=0.01, seed=3)
    emu = emulator_factory(["--speed", "20"], log_bodies=False)  # ~8 ms a request
    out, rows, results = await replay(
        t, [Target("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP)
    )
    assert out.exit_code == 0
    rid = t.column("request_id")
    assert [e["request_id"] for e in arrivals(emu)] == [rid[r] for r in rows]
    assert sorted(r["seq"] for r in results) == list(range(len(rows)))
    by_id = {r["request_id"]: r for r in results}
    assert [by_id[rid[r]]["seq"] for r in rows] == list(range(len(rows)))
    # no turn went out before its predecessor completed
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
        t, [Target("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP, order=Order.ADMITTED)
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
        t, [Target("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP, order=Order.SESSION)
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


@pytest.mark.parametrize("speed", [1.0, 2.5])
async def test_recorded_timing_scales_with_speed(emulator_factory, tmp_path, speed):
    starts = [0, 40, 90, 150, 300, 310, 320, 500, 800, 1000]
    t = timed_trace(tmp_path, starts)
    emu = emulator_factory(["--speed", "instant"])
    out, rows, results = await replay(
        t, [Target("e", emu.url)], tmp_path, ReplayPolicy(speed=speed)
    )
    assert out.exit_code == 0
    by_id = {r["request_id"]: r for r in results}
    for i, ms in enumerate(starts):
        r = by_id[f"r{i}"]
        assert r["scheduled_us"] == round(ms * 1000 / speed)
        # dispatched on time (never early; the bound is loose for a loaded CI
        # machine: bench/RESULTS.md has the real lag figures)
        assert 0 <= r["dispatched_us"] - r["scheduled_us"] < 50_000
    # the server saw the same spacing (its own clock)
    log = arrivals(emu)
    seen = [(e["t"] - log[0]["t"]) * 1000 for e in log]
    for got, ms in zip(seen, starts, strict=True):
        assert got == pytest.approx(ms / speed, abs=50)


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
    out, _, results = await replay(Trace.open(p), [Target("e", emu.url)], tmp_path)
    by_id = {r["request_id"]: r for r in results}
    t0, t1 = by_id["t0"], by_id["t1"]
    assert t0["done_us"] > 150_000  # 10 decode steps of 20 ms
    assert t1["scheduled_us"] == t0["done_us"] + 50_000  # not at its recorded 70 ms
    assert 0 <= t1["dispatched_us"] - t1["scheduled_us"] < 50_000


async def test_idle_connections_are_dropped_before_the_server_drops_them(
    emulator_factory, tmp_path
):
    # vLLM closes a keep-alive connection idle for 5 s; a request written on a
    # connection the server is closing fails as if the server had crashed. So
    # the replayer reuses a connection after a short gap and never after a
    # gap longer than IDLE_CLOSE_S.
    from replayer.replay.client import IDLE_CLOSE_S

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
    await replay(Trace.open(p), [Target("e", emu.url)], tmp_path)
    ports = [e["peer_port"] for e in arrivals(emu)]
    assert len(ports) == 3
    assert ports[1] == ports[0]  # 0.1 s idle: kept alive
    assert ports[2] != ports[1]  # idle past IDLE_CLOSE_S: a fresh connection


async def test_session_order_builds_each_body_just_before_it_is_due(
    emulator_factory, tmp_path, monkeypatch
):
    # thousands of sessions waiting for their start must not each hold a
    # body (memory) nor build them all at T0 before the first send (lag)
    import asyncio

    from replayer.replay import engine

    built: dict[int, float] = {}
    orig = engine.Replay._body

    def spy(self, run, i):
        built[i] = asyncio.get_running_loop().time() - self.t0
        return orig(self, run, i)

    monkeypatch.setattr(engine.Replay, "_body", spy)
    p = tmp_path / "many.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for k in range(120):  # 120 one-turn sessions, one every 5 ms
            w.add(
                RequestRecord.from_body(
                    {"model": MODEL, "prompt": f"q{k}", "max_tokens": 1},
                    request_id=f"r{k}",
                    session_id=f"s{k}",
                    turn=0,
                    start_us=k * 5_000,
                    end_us=k * 5_000 + 1_000,
                )
            )
    emu = emulator_factory(["--speed", "instant"])
    policy = ReplayPolicy(order=Order.SESSION)
    _, rows, results = await replay(Trace.open(p), [Target("e", emu.url)], tmp_path, policy)
    assert len(built) == 120 and {r["status"] for r in results} == {"ok"}
    # plan index i is the i-th request in trace order, r{i}
    sched = {int(r["request_id"][1:]): r["scheduled_us"] / 1e6 for r in results}
    early = [i for i in built if built[i] < sched[i] - engine._BODY_LEAD - 0.002]
    assert not early, f"{len(early)} bodies built before their lead window"


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
            t, [Target("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP), name=name
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
        t, [Target("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP, force_stream=False)
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
        t, [Target("e", emu.url)], tmp_path, ReplayPolicy(timing=Timing.ASAP, model="other")
    )
    assert out.exit_code == 0
    log = arrivals(emu)
    assert [e["body"]["model"] for e in log] == ["other"] * 3
    assert [(e["request_id"], e["session"]) for e in log] == [
        ("r0", "s0"),
        ("r1", "s1"),
        ("r2", "s2"),
    ]


async def test_live_mode_threads_the_targets_replies(emulator_factory, tmp_path):
    t = synth(tmp_path, sessions=1, turns=3, context=5_000, seed=5)
    emu = emulator_factory(["--speed", "instant"], log_bodies=True)
    out, rows, results = await replay(
        t,
        [Target("e", emu.url)],
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
        [Target("a", a.url), Target("b", b.url)],
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
