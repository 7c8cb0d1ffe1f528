"""Bisect against real emulator subprocesses with planted faults, where the
emulator's semantics give the ground truth: exact minimal prefixes, an exact
minimal subset, another bug never accepted, a delayed crash."""

from __future__ import annotations

import asyncio
import math
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from replayer.bisect.oracle import Outcome
from replayer.bisect.pipeline import Bisect, BisectOptions, run_bisect
from replayer.bisect.stats import rate_dict
from replayer.monitor.watch import WatchConfig
from replayer.options import Server
from replayer.replay.plan import select
from replayer.replay.policy import Order, ReplayPolicy, Timing
from replayer.session import Session
from replayer.trace import RequestRecord, TokenSpace, Trace, TraceMeta, TraceWriter
from replayer.trace.synth import SynthOptions, write_trace
from tests.helpers.bisect import emulator_cmd
from tests.helpers.net import free_port

REPO = Path(__file__).resolve().parents[2]
MODEL = "moonshotai/Kimi-K3"
WATCH = WatchConfig(
    health_interval=0.1, scrape_interval=1.0, stall_timeout=5.0, settle=3.0, grace=0.8
)
QUICK = BisectOptions(calibrate_matches=2, calibrate_runs=4, confirm=2)


def synth(tmp_path, **kw):
    p = tmp_path / "t.arrow"
    write_trace(p, SynthOptions(model=MODEL, max_tokens=4, **kw))
    return Trace.open(p)


async def bisect(
    tmp_path, trace, *faults, opts=QUICK, extra=(), timing=Timing.ASAP, order=Order.STRICT,
    watch=WATCH, token_range=None,
):  # fmt: skip
    rows = select(trace)
    env = Session.open(
        trace,
        rows=rows,
        policy=ReplayPolicy(timing=timing, order=order, token_range=token_range),
        watch=watch,
        server=Server(launch=emulator_cmd(*faults, extra=extra)),
        logs=tmp_path / "bisect",
    )
    b = Bisect(trace, rows, env, tmp_path / "bisect", opts, say=lambda m: None)
    res = await run_bisect(b)
    manifest = orjson.loads((tmp_path / "bisect" / "bundle" / "manifest.json").read_bytes())
    return b, res, manifest


def stage_trials(b, stage):
    return [r for r in b.oracle.history() if r.stage == stage]


@pytest.mark.slow
async def test_exact_prefix_for_the_nth_request(tmp_path):
    t = synth(tmp_path, sessions=5, turns=6, context=8_000, rate=50, think=0.0, seed=3)
    opts = BisectOptions(
        stages=("calibrate", "cut", "prefix"), calibrate_matches=2, calibrate_runs=4, confirm=0
    )
    b, res, m = await bisect(
        tmp_path, t, "exit after=0.2 when request=17", opts=opts, token_range=(100, 8193)
    )
    assert res.status == "complete"
    assert m["prefix_length"] == 17
    # the bundle's bodies are the trials' (their token range); the trace
    # the bisect was handed keeps its own
    bundled = Trace.open(tmp_path / "bisect" / "bundle" / "trace.arrow")
    assert bundled.recorded_tokens == TokenSpace(100, 8193, t.tokens.salt)
    assert t.tokens == TokenSpace()
    assert len(res.best.positions) == 17
    # binary search: at most ceil(log2 n) probes over the cut trace (<= 30
    # requests), then the re-check of the longest quiet prefix (16)
    prefix = stage_trials(b, "prefix")
    assert len(prefix) <= math.ceil(math.log2(30)) + opts.prefix_recheck
    assert [r.size for r in prefix[-opts.prefix_recheck :]] == [16] * opts.prefix_recheck
    assert m["requests"] == [t.column("request_id")[r] for r in t.order[:17]]


def expected_threshold_prefix(trace, tokens, k):
    """1 + the first position whose request is long enough and whose session
    is at least the k-th distinct one (the emulator's session index)."""
    rank: dict[str, int] = {}
    for i, r in enumerate(trace.order):
        s = trace.column("session_id")[r]
        rank.setdefault(s, len(rank) + 1)
        if trace.column("input_tokens")[r] >= tokens and rank[s] >= k:
            return i + 1
    raise AssertionError("the fault never fires")


@pytest.mark.slow
async def test_exact_prefix_for_a_context_threshold_after_k_sessions(tmp_path):
    t = synth(tmp_path, sessions=6, turns=6, context=12_000, rate=3, think=0.2, seed=4)
    h = expected_threshold_prefix(t, 7_000, 4)
    opts = BisectOptions(
        stages=("calibrate", "cut", "prefix"), calibrate_matches=2, calibrate_runs=4, confirm=0
    )
    b, res, m = await bisect(
        tmp_path, t, "exit after=0.2 when prompt_tokens>=7000 and session>=4", opts=opts
    )
    assert m["prefix_length"] == h


@pytest.mark.slow
async def test_exact_prefix_when_the_crash_comes_later(tmp_path):
    # the engine dies 0.4 s after the 8th request: the run has gone on by then
    t = synth(tmp_path, sessions=4, turns=6, context=8_000, rate=50, think=0.0, seed=5)
    opts = BisectOptions(
        stages=("calibrate", "cut", "prefix"), calibrate_matches=2, calibrate_runs=4, confirm=0
    )
    b, res, m = await bisect(tmp_path, t, "exit after=0.2 when request=8 delay=0.4", opts=opts)
    first = stage_trials(b, "calibrate")[0]
    summary = orjson.loads((tmp_path / "bisect" / first.run / "summary.json").read_bytes())
    assert summary["targets"]["target"]["sent"] > 8  # the failure point is only a bound
    assert m["prefix_length"] == 8


SLOT_US = 150_000
"""Requests of the shared-document trace are this far apart: a reaches b
600 ms ahead (300 ms at 2x), room for a loaded machine to finish a first."""


def shared_document_trace(tmp_path):
    """Sessions a and b open with the same 4,000-token document; six others
    share nothing. b hits the prefix cache only if a ran before it."""
    doc = "the quick brown fox " * 800  # 16,000 bytes = 4,000 tokens
    plan = [
        ("n1", "x"),
        ("a", doc + "question a"),
        ("n2", "y"),
        ("n3", "z"),
        ("n4", "w"),
        ("b", doc + "question b"),
        ("n5", "v"),
        ("n6", "u"),
    ]
    p = tmp_path / "shared.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for i, (sid, text) in enumerate(plan):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 2,
            }
            w.add(
                RequestRecord.from_body(
                    body,
                    request_id=f"{sid}-0",
                    session_id=sid,
                    turn=0,
                    start_us=i * SLOT_US,
                    end_us=i * SLOT_US + 5_000,
                )
            )
    return Trace.open(p)


@pytest.mark.slow
async def test_exact_subset_for_a_trigger_that_needs_two_sessions(tmp_path):
    t = shared_document_trace(tmp_path)
    # recorded timing (SLOT_US apart): a is in the cache by the time b arrives;
    # at 2x still, while asap makes it a race the timing stage must not trade
    # the reliable timing for, so it is not offered here
    opts = BisectOptions(
        stages=("calibrate", "cut", "prefix", "sessions", "turns", "timing"),  # no shrink
        calibrate_matches=2,
        calibrate_runs=4,
        confirm=2,
        speedups=(2.0,),
        try_asap=False,
    )
    b, res, m = await bisect(
        tmp_path,
        t,
        "exit after=0.2 when cached_tokens>=3000",
        extra=("--enable-prompt-tokens-details",),
        timing=Timing.RECORDED,
        opts=opts,
    )
    assert res.status == "complete"
    assert m["requests"] == ["a-0", "b-0"]
    assert m["reproduction"]["crashes"] == m["reproduction"]["runs"] == 2
    assert m["signature"]["class"] == "process_exit"
    assert b.oracle.crash_rate()[0] == b.oracle.crash_rate()[1]  # deterministic throughout
    assert (m["policy"]["timing"], m["policy"]["speed"]) == ("recorded", 2.0)  # timing won
    # and it was kept only after crashing on every one of its runs
    kept = [r for r in b.oracle.history() if r.stage == "timing" and r.key == b.best.key()]
    assert len(kept) == 2 and all(r.outcome is Outcome.MATCH for r in kept)


@pytest.mark.slow
async def test_another_bug_is_recorded_never_accepted(tmp_path):
    # the chased crash: a long request of the 4th session. Planted earlier in
    # the trace: a CUDA crash whenever the 2nd request is long, which the full
    # trace never triggers (its 2nd request is a first turn) but reductions do.
    # "request=2" counts arrivals: admitted order makes the server read them in
    # trace order (strict only sends them so: a busy server may read a later
    # connection first), and a grace far above the 0.2 s crash delay keeps a
    # loaded machine from ending the run before the crash lands.
    t = synth(tmp_path, sessions=5, turns=5, context=12_000, rate=2, think=0.3, seed=6)
    opts = BisectOptions(
        stages=("calibrate", "cut", "turns"),
        calibrate_matches=2,
        calibrate_runs=4,
        confirm=2,
    )
    b, res, m = await bisect(
        tmp_path,
        t,
        "exit after=0.2 gpu=hsa when prompt_tokens>=9000 and session>=4",
        "exit after=0.2 gpu=cuda when request=2 and prompt_tokens>=5000",
        opts=opts,
        order=Order.ADMITTED,
        watch=replace(WATCH, grace=5.0),
    )
    others = [r for r in b.oracle.history() if r.outcome is Outcome.OTHER_FAILURE]
    assert others, "the reduction never ran into the second bug"
    chased = m["signature"]["hash"]
    assert all(r.signature != chased for r in others)
    assert m["bugs"] and {x["signature"] for x in m["bugs"]} == {r.signature for r in others}
    assert "Memory access fault" in m["signature"]["text"]  # still the HSA crash
    assert m["reproduction"]["crashes"] == 2


@pytest.mark.slow
async def test_shrink_finds_the_prompt_threshold_keeps_the_cache_hit_and_the_bundle_crashes(
    tmp_path, emulator_factory
):
    # token-id prompts (64-token blocks): the engine dies on a prompt of >= 7,000
    # tokens with a prefix-cache hit of >= 3,000
    t = synth(tmp_path, sessions=3, turns=5, context=12_000, rate=50, think=0.0, seed=3,
              payload="blocks")  # fmt: skip
    fault = "exit after=0.2 when cached_tokens>=3000 and prompt_tokens>=7000"
    # the pair the subset stages find (tested above): the shrink alone here
    pair = ("synth-00000-t001", "synth-00000-t002")
    opts = BisectOptions(stages=("calibrate", "shrink"), calibrate_matches=1, confirm=2)
    rows = select(t, requests=",".join(pair))
    out = tmp_path / "bisect"
    env = Session.open(
        t,
        rows=rows,
        # one request at a time: a turn is in the cache before the next is sent
        policy=ReplayPolicy(timing=Timing.ASAP, max_inflight=1),
        watch=WATCH,
        server=Server(launch=emulator_cmd(fault)),
        logs=out,
    )
    b = Bisect(t, rows, env, out, opts, say=lambda m: None)
    res = await run_bisect(b)
    assert res.status == "complete" and res.reproduction == (2, 2)
    m = orjson.loads((out / "bundle" / "manifest.json").read_bytes())
    source, crashing = m["requests"]
    assert (source, crashing) == pair and crashing == m["shrink"]["request"]
    bundle = Trace.open(out / "bundle" / "trace.arrow")
    row = {bundle.column("request_id")[r]: r for r in bundle.order}
    tokens = {rid: bundle.block_tokens(r) for rid, r in row.items()}
    # N to N + one block, for the prompt and for the hit its source gives it
    assert 7000 <= len(tokens[crashing]) < 7000 + 64
    assert 3000 <= len(tokens[source]) < 3000 + 64
    assert tokens[crashing][: len(tokens[source])] == tokens[source]  # still a shared prefix
    assert m["shrink"]["text"].startswith(
        f"crashes at >= {len(tokens[crashing]):,} prompt tokens, "
        f"not at {len(tokens[crashing]) - 64:,} prompt tokens; "
        f"its prefix-cache source {source} crashes at >= {len(tokens[source]):,} tokens"
    )
    # the bundle, shrunk, crashes a fresh server in one command; a healthy one not
    for args, code in ((["--fault", fault], 1), ([], 0)):
        srv = emulator_factory(["--speed", "instant", *args])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(out / "bundle" / "repro.py"), "--url", srv.url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        said, _ = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == code, said.decode()


@pytest.mark.slow
async def test_a_flaky_crash_bundle_crashes_fresh_servers_at_its_reported_rate(
    tmp_path, emulator_factory
):
    # Five triggers (requests 8-12), each killing the engine with p = 0.5: the
    # whole trace crashes 97% of the time, its minimal prefix (8 requests, one
    # trigger) 50%. A server restarted with the same --seed would draw the same
    # numbers, so every launch gets a new one (bench/bisect_launcher.py): each
    # trial draws anew, and the test is still reproducible from its seeds.
    fault = "exit after=0.1 when request>=8 and request<=12 p=0.5"
    t = synth(tmp_path, sessions=4, turns=5, context=4_000, rate=20, think=0.0, seed=22)
    launch = shlex.join(
        [sys.executable, str(REPO / "bench" / "bisect_launcher.py"), str(tmp_path / "launches"),
         "100", "--port", str(free_port()), "--speed", "instant", "--fault", fault]
    )  # fmt: skip
    out = tmp_path / "bisect"
    env = Session.open(
        t, policy=ReplayPolicy(timing=Timing.ASAP), watch=WATCH, server=Server(launch=launch),
        logs=out,
    )  # fmt: skip
    opts = BisectOptions(
        stages=("calibrate", "cut", "prefix"), calibrate_matches=5, calibrate_runs=12, confirm=10
    )
    b = Bisect(t, select(t), env, out, opts, say=lambda m: None)
    res = await run_bisect(b)
    assert res.status == "complete" and b.prefix_length == 8
    m = orjson.loads((out / "bundle" / "manifest.json").read_bytes())
    rep = m["reproduction"]
    assert rep["runs"] == 10 and 0 < rep["crashes"] < 10  # measured as flaky, not as certain
    # the bundle's rate is its own, not calibration's (the whole trace, 5 triggers)
    cal = [r.outcome for recs in b.oracle.records.values() for r in recs if r.stage == "calibrate"]
    assert cal.count(Outcome.MATCH) >= 5 and rep["high"] < 1.0, (cal, rep)
    # the bundle on fresh servers (seeds the bisect never drew): the two
    # measurements agree (their 95% intervals overlap) and neither says certain
    fresh = 30
    crashed = 0
    for seed in range(fresh):
        srv = emulator_factory(["--speed", "instant", "--fault", fault, "--seed", str(9000 + seed)])
        repro = await asyncio.create_subprocess_exec(
            sys.executable, str(out / "bundle" / "repro.py"), "--url", srv.url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        said, _ = await asyncio.wait_for(repro.communicate(), 120)
        assert repro.returncode in (0, 1), said.decode()
        crashed += repro.returncode == 1
    got = rate_dict(crashed, fresh)
    print(f"\nflaky bundle: stated {rep['text']}; fresh servers {got['text']}")
    assert got["low"] <= rep["high"] and rep["low"] <= got["high"], (got, rep)
    assert 0 < crashed < fresh


# -- a pool of emulator servers: the same answers in fewer rounds ------------------------


def pooled_cmd(*faults):
    """An emulator launch for ``--servers N``: ``{port}`` per server."""
    words = shlex.split(emulator_cmd(*faults))
    words[words.index("--port") + 1] = "{port}"
    return shlex.join(words)


async def pool_bisect(out, trace, launch, servers, opts, **kw):
    from replayer.options.pool import PoolSpec

    env = Session.open(
        trace,
        policy=ReplayPolicy(timing=Timing.ASAP),
        watch=WATCH,
        pool=PoolSpec.like(Server(launch=launch), servers),
        logs=out,
    )
    b = Bisect(trace, select(trace), env, out, opts, say=lambda m: None, **kw)
    return b, await run_bisect(b)


def busiest(b, stage=None):
    """Trials of the server that ran the most: the rounds on the critical path
    (each server runs one trial at a time), read from the journal."""
    per: dict[int | None, int] = {}
    for r in b.oracle.history():
        if stage is None or r.stage == stage:
            per[r.server] = per.get(r.server, 0) + 1
    return max(per.values()), set(per)


@pytest.mark.slow
async def test_three_servers_find_the_same_prefix_in_fewer_rounds(tmp_path):
    t = synth(tmp_path, sessions=5, turns=6, context=8_000, rate=50, think=0.0, seed=3)
    opts = BisectOptions(
        stages=("calibrate", "cut", "prefix"), calibrate_matches=2, calibrate_runs=4, confirm=3
    )
    launch = pooled_cmd("exit after=0.2 when request=17")
    one, r1 = await pool_bisect(tmp_path / "one", t, launch, 1, opts)
    three, r3 = await pool_bisect(tmp_path / "three", t, launch, 3, opts)
    assert one.prefix_length == three.prefix_length == 17
    assert r1.best.positions == r3.best.positions
    assert r1.reproduction == r3.reproduction == (3, 3)
    rounds1, servers1 = busiest(one)
    rounds3, servers3 = busiest(three)
    assert servers1 == {0} and servers3 == {0, 1, 2}  # the journal says who ran what
    assert rounds3 < rounds1
    assert r3.trials <= 2 * r1.trials


@pytest.mark.slow
async def test_three_servers_find_a_flaky_trigger_exactly_in_fewer_rounds(tmp_path):
    # five triggers (requests 8-12) at p = 0.5, each server launching with
    # seeds of its own (bench/bisect_launcher.py counts its launches per server)
    fault = "exit after=0.1 when request>=8 and request<=12 p=0.5"
    t = synth(tmp_path, sessions=4, turns=5, context=4_000, rate=20, think=0.0, seed=22)

    def launch(base):
        return shlex.join(
            [sys.executable, str(REPO / "bench" / "bisect_launcher.py"),
             str(tmp_path / f"launches-{base}-{{slot}}"), f"{base}{{slot}}000", "--port",
             "{port}", "--speed", "instant", "--fault", fault]
        )  # fmt: skip

    opts = BisectOptions(
        stages=("calibrate", "cut", "prefix"), calibrate_matches=5, calibrate_runs=12, confirm=6
    )
    one, r1 = await pool_bisect(tmp_path / "one", t, launch(1), 1, opts)
    three, r3 = await pool_bisect(tmp_path / "three", t, launch(2), 3, opts)
    for b, res in ((one, r1), (three, r3)):
        assert res.status == "complete" and b.prefix_length == 8
        assert res.reproduction[1] == 6 and res.reproduction[0] > 0
    rounds1, servers1 = busiest(one)
    rounds3, servers3 = busiest(three)
    assert servers1 == {0} and servers3 == {0, 1, 2}
    assert rounds3 < rounds1


@pytest.mark.slow
async def test_a_three_server_bisect_resumes_on_one_server(tmp_path):
    t = synth(tmp_path, sessions=5, turns=6, context=8_000, rate=50, think=0.0, seed=3)
    launch = pooled_cmd("exit after=0.2 when request=17")
    stages = ("calibrate", "cut", "prefix")
    out = tmp_path / "b"
    cut_short = BisectOptions(
        stages=stages, calibrate_matches=2, calibrate_runs=4, confirm=2, max_trials=7
    )
    b, res = await pool_bisect(out, t, launch, 3, cut_short)
    assert res.status != "complete"
    before = {r.trial: r.key for r in b.oracle.history()}
    assert len({r.server for r in b.oracle.history()}) > 1
    opts = BisectOptions(stages=stages, calibrate_matches=2, calibrate_runs=4, confirm=2)
    again, res = await pool_bisect(out, t, launch, 1, opts)
    assert res.status == "complete" and again.prefix_length == 17
    after = [(r.trial, r.key) for r in again.oracle.history()]
    # every trial of the three-server run kept, none run again: new numbers only
    assert {n: k for n, k in after if n in before} == before
    assert len({n for n, _ in after}) == len(after)
    new = [r for r in again.oracle.history() if r.trial not in before]
    assert new and {r.server for r in new} == {0}
