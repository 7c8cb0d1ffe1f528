"""Every emulator fault mode maps to its class, against real subprocesses;
slow-but-alive and long prefills are not hangs; metrics.arrow holds the
series around the failure. Then the watchdog's rules on a virtual clock,
where the instant each fires is exact."""

from __future__ import annotations

import orjson
import pytest

from replayer.monitor.metrics import read_metrics, series
from replayer.monitor.watch import InFlight, TargetWatch, WatchConfig
from replayer.replay.client import Endpoint
from replayer.replay.plan import select
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.replay.results import read_results
from replayer.replay.run import replay_to_dir
from replayer.testing import FakeHealth, VirtualClock
from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace.synth import SynthOptions, write_trace
from replayer.wire import Reply

MODEL = "moonshotai/Kimi-K3"
# the emulator exits 1 s after engine death (vLLM: up to 5 s; the default settle is 10)
FAST = WatchConfig(
    health_interval=0.2, scrape_interval=0.2, stall_timeout=1.0, settle=3.0, grace=1.0
)


def one_session(tmp_path, turns=8):
    p = tmp_path / "t.arrow"
    write_trace(
        p, SynthOptions(sessions=1, turns=turns, context=8_000, max_tokens=8, model=MODEL, seed=11)
    )
    return Trace.open(p)


async def run(trace, emu, tmp_path, *, watch=FAST, policy=None):
    out = tmp_path / "run"
    outcome = await replay_to_dir(
        trace,
        select(trace),
        policy or ReplayPolicy(timing=Timing.ASAP, request_timeout=20),
        [Endpoint("e", emu.url)],
        out,
        command=["test"],
        progress=False,
        watch=watch,
        processes={"e": emu},
    )
    return outcome, outcome.summary["targets"]["e"], read_results(out / "results.arrow")


@pytest.mark.parametrize(
    "fault,cls,exit_code",
    [
        ("exit when request=3", "process_exit", 0),
        ("exit code=134 when request=3", "process_exit", 134),
        ("dead when request=3", "engine_dead", None),
        ("cut when request=3", "stream_cut", None),
        ("cut kill=1 when request=3", "process_exit", -9),
        ("error when request=3", "http_5xx_other", None),
    ],
    ids=["exit0", "exit134", "dead", "cut", "cut-kill", "error"],
)
async def test_fault_maps_to_its_class(emulator_factory, tmp_path, fault, cls, exit_code):
    emu = emulator_factory(["--speed", "20", "--fault", fault])
    outcome, s, results = await run(one_session(tmp_path), emu, tmp_path)
    assert outcome.exit_code == 1
    f = s["failure"]
    assert f["class"] == cls
    assert f["request_id"] == "synth-00000-t002"  # the third request
    assert f["recent"] == ["synth-00000-t000", "synth-00000-t001"]
    assert len(results) == 8
    assert [r["status"] for r in results if r["turn"] < 2] == ["ok", "ok"]
    if exit_code is not None:
        assert emu.wait_exit(10) == exit_code
    else:
        assert emu.returncode is None  # still up
    assert f["health"], "the health timeline around the failure is kept"


async def test_hang_is_caught_by_progress_and_aborts_in_flight(emulator_factory, tmp_path):
    emu = emulator_factory(["--speed", "20", "--fault", "hang when request=3"])
    outcome, s, results = await run(one_session(tmp_path), emu, tmp_path)
    f = s["failure"]
    assert (f["class"], f["kind"]) == ("hang", "hang")
    hung = [r for r in results if r["request_id"] == "synth-00000-t002"][0]
    # aborted by the watchdog (the 20 s request timeout would say "timeout");
    # when exactly is asserted on the virtual clock below
    assert (hung["status"], hung["error_class"]) == ("timeout", "hang")
    assert all(p["status"] == 200 for p in f["health"])  # a hung vLLM still answers /health


async def test_slow_but_alive_is_not_a_hang(emulator_factory, tmp_path):
    # each token 4x slower (~4 ms at speed 20): far below the 1 s stall timeout
    emu = emulator_factory(["--speed", "20", "--fault", "slow factor=4 when request>=2"])
    outcome, s, results = await run(one_session(tmp_path), emu, tmp_path)
    assert outcome.exit_code == 0 and s["failure"] is None
    assert {r["status"] for r in results} == {"ok"}


async def test_long_prefill_within_its_allowance_is_not_a_hang(emulator_factory, tmp_path):
    p = tmp_path / "long.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        # 8,000-token prompt at 4,000 tokens/s: 2 s of silence, twice the stall timeout
        w.add(
            RequestRecord.from_body(
                {"model": MODEL, "prompt": "x" * 32_000, "max_tokens": 2},
                request_id="long",
                session_id="s",
                turn=0,
                start_us=0,
            )
        )
    emu = emulator_factory(["--prefill-rate", "4000", "--decode-time", "0.01"])
    outcome, s, results = await run(Trace.open(p), emu, tmp_path)
    assert outcome.exit_code == 0 and s["failure"] is None
    (r,) = results
    assert r["status"] == "ok"
    assert r["first_token_us"] - r["dispatched_us"] > 1_500_000  # the prefill really was long


async def test_metrics_hold_the_series_before_the_crash(emulator_factory, tmp_path):
    p = tmp_path / "t.arrow"
    write_trace(
        p,
        SynthOptions(
            sessions=6,
            turns=6,
            context=20_000,
            max_tokens=64,
            model=MODEL,
            rate=20,
            think=0.05,
            seed=2,
        ),
    )
    emu = emulator_factory(["--speed", "5", "--fault", "exit when request=25"])
    outcome, s, _ = await run(
        Trace.open(p), emu, tmp_path, policy=ReplayPolicy(speed=4, request_timeout=20)
    )
    at = s["failure"]["at_s"]
    rows = read_metrics(tmp_path / "run" / "metrics.arrow")
    kv = [(t, v) for t, v in series(rows, "vllm:kv_cache_usage_perc", model_name=MODEL) if t < at]
    assert len(kv) >= 3
    t_last, v_last = kv[-1]
    assert 0 < v_last <= 1  # sessions of 20K-token contexts hold KV blocks
    running = series(rows, "vllm:num_requests_running")
    assert max(v for _, v in running) >= 1
    # the report's snapshot is that same last scrape before the crash
    snap = (tmp_path / "run" / s["failure"]["metrics_snapshot"]).read_text()
    assert f"/metrics at t={t_last:.3f}s\n" in snap
    assert "vllm:kv_cache_usage_perc" in snap
    run_json = orjson.loads((tmp_path / "run" / "run.json").read_bytes())
    assert run_json["watch"]["stall_timeout"] == 1.0


# -- on the virtual clock: the watchdog's rules, exactly -------------------------------


class Process:
    """A launched server that exits at a given clock time."""

    def __init__(self, clock, exits_at=None):
        self.clock, self.exits_at = clock, exits_at

    def exited(self):
        return self.exits_at is not None and self.clock.now() >= self.exits_at


def watch_on(clock, *, answer=lambda t: 200, process=None, probe_timeout=None, **config):
    """A started TargetWatch on ``clock`` (T0 = 0) with a scripted /health,
    and the failures it declared as (clock time, kind)."""
    failures = []
    aborted = []

    def on_failure(kind, message):  # what the engine does: Replay._make_watch
        failures.append((clock.now(), kind))
        w.failure_message = message
        w.mark_failed(clock.now())

    w = TargetWatch(
        name="e",
        url="http://e",
        config=WatchConfig(scrape_target=False, **config),
        inflight={},
        on_failure=on_failure,
        abort=lambda: aborted.append(clock.now()),
        process=process,
        clock=clock,
        prober=FakeHealth(clock, answer, latency=0.0, timeout=probe_timeout),
    )
    w.start(0.0)
    return w, failures, aborted


def streaming(index, dispatched, *, tokens_at=(), input_tokens=100):
    stats = Reply()
    for t in tokens_at:
        stats.output(t)
    return InFlight(index, f"r{index}", dispatched, input_tokens, stats)


@pytest.mark.inprocess
async def test_the_watchdog_fires_exactly_at_the_stall_timeout():
    clock = VirtualClock(autojump=False)  # time moves on advance()
    w, failures, aborted = watch_on(clock, stall_timeout=2.0)
    # a stream whose last token came at 0.37 s: a hang at 2.37 s, not at a tick
    w.inflight[0] = streaming(0, 0.1, tokens_at=(0.2, 0.37))
    await clock.advance(2.37 - 1e-9)
    assert failures == []
    await clock.advance(1e-9)
    assert failures == [(2.37, "hang")] and aborted == [2.37] and w.hang
    await w.stop()


@pytest.mark.inprocess
async def test_new_progress_moves_the_deadline():
    clock = VirtualClock(autojump=False)  # time moves on advance()
    w, failures, _ = watch_on(clock, stall_timeout=2.0)
    f = streaming(0, 0.0, tokens_at=(0.5,))
    w.inflight[0] = f
    await clock.advance(2.0)
    f.stats.output(clock.now())  # a token at 2.0 s
    await clock.advance(1.999)
    assert failures == []
    await clock.advance(0.001)
    assert failures == [(4.0, "hang")]
    await w.stop()


@pytest.mark.inprocess
async def test_a_prefill_has_its_allowance_before_it_counts_as_silent():
    clock = VirtualClock(autojump=False)  # time moves on advance()
    # 8,000 input tokens at 1,000 tokens/s: 8 s allowed on top of the 1 s stall timeout
    w, failures, _ = watch_on(clock, stall_timeout=1.0, min_prefill_rate=1000.0)
    w.inflight[0] = streaming(0, 0.25, input_tokens=8_000)
    await clock.advance(9.25 - 1e-9)
    assert failures == []
    await clock.advance(1e-9)
    assert failures == [(9.25, "hang")]
    await w.stop()


@pytest.mark.inprocess
@pytest.mark.parametrize("answer", [503, "refused"])
async def test_no_hang_while_health_says_dead_or_gone(answer):
    clock = VirtualClock(autojump=False)  # time moves on advance()
    # a server whose /health fails is dying, not hung: the health rule decides
    # (here it needs more failures in a row than 30 s of probes give)
    w, failures, _ = watch_on(
        clock, answer=lambda t: 200 if t < 1.0 else answer, stall_timeout=2.0, health_failures=99
    )
    w.inflight[0] = streaming(0, 0.0, tokens_at=(0.1,))
    await clock.advance(30.0)
    assert failures == [] and not w.hang
    await w.stop()


def stuck_from_1s(clock, stall_timeout):
    """The API server's loop is stuck from 1 s: each probe waits out its 2 s
    bound; probes start at 0 (200), 1 (timed out at 3), 4 (at 6), 7 (at 9)..."""
    return watch_on(
        clock,
        answer=lambda t: 200 if t < 1.0 else "timeout",
        probe_timeout=2.0,
        stall_timeout=stall_timeout,
        health_interval=1.0,
        health_failures=2,
    )


def hang_report(w):
    return w.report(kind="hang", message=w.failure_message, request_id="r0", seq=0,
                    error_class=None, http_status=None, inflight=["r0"])  # fmt: skip


@pytest.mark.inprocess
async def test_a_hang_with_health_stalled_fires_at_the_stall_timeout():
    clock = VirtualClock(autojump=False)  # time moves on advance()
    # due at 8.1 s; by then the probes of 1 and 4 s have timed out in a row
    w, failures, aborted = stuck_from_1s(clock, stall_timeout=8.0)
    w.inflight[0] = streaming(0, 0.0, tokens_at=(0.1,))
    await clock.advance(8.1 - 1e-6)
    assert failures == []
    await clock.advance(2e-6)
    assert failures == [(pytest.approx(8.1), "hang")] and aborted == [pytest.approx(8.1)]
    assert w.hang and w.health_stalled
    assert [(p.t, p.error) for p in w.health.timeline] == [(0.0, None), (1.0, "timeout"),
                                                           (4.0, "timeout")]  # fmt: skip
    d = hang_report(w).to_dict()
    assert d["class"] == "hang" and d["health_stalled"] is True
    assert d["message"] == (
        "no token progress on 1 in-flight request(s) for 8 s while /health stopped answering "
        "too (probes time out after 2 s)"
    )
    await w.stop()


@pytest.mark.inprocess
async def test_a_hang_called_on_the_last_200_reports_health_stalled_from_what_followed():
    clock = VirtualClock(autojump=False)  # time moves on advance()
    # due at 2.1 s, while the probe of 1 s is still waiting: its last answer
    # was 200, so the hang is called then; the probes after it all time out
    w, failures, _ = stuck_from_1s(clock, stall_timeout=2.0)
    w.inflight[0] = streaming(0, 0.0, tokens_at=(0.1,))
    await clock.advance(2.1)
    assert failures == [(pytest.approx(2.1), "hang")] and not w.health_stalled
    await clock.advance(10.0)  # the settle window
    d = hang_report(w).to_dict()
    assert d["class"] == "hang" and d["health_stalled"] is True
    assert "while /health stopped answering too" in d["message"]
    await w.stop()


@pytest.mark.inprocess
async def test_one_timed_out_probe_is_a_busy_server_not_a_stalled_api():
    clock = VirtualClock(autojump=False)  # time moves on advance()
    # probes at 0, 1, 2 (timed out at 4), 5 (200), ...; due at 4.1: a lone
    # timeout is no verdict, the 200 at 5 s is, at the next tick
    w, failures, _ = watch_on(
        clock,
        answer=lambda t: "timeout" if 1.5 < t < 2.5 else 200,
        probe_timeout=2.0,
        stall_timeout=4.0,
        health_failures=2,
    )
    w.inflight[0] = streaming(0, 0.0, tokens_at=(0.1,))
    await clock.advance(5.0)
    assert failures == []
    await clock.advance(0.1 + 1e-6)
    assert failures == [(pytest.approx(5.1), "hang")] and not w.health_stalled
    await clock.advance(10.0)
    assert "health_stalled" not in hang_report(w).to_dict()
    await w.stop()


@pytest.mark.inprocess
async def test_health_failures_in_a_row_fail_the_target_at_the_probe_that_counts():
    clock = VirtualClock(autojump=False)  # time moves on advance()
    # probes every 1 s; the engine dies at 2.5 s: 503 at 3 s and at 4 s
    w, failures, _ = watch_on(
        clock, answer=lambda t: 200 if t < 2.5 else 503, health_interval=1.0, health_failures=2
    )
    await clock.advance(10.0)
    assert failures == [(4.0, "health")]
    assert [(p.t, p.status) for p in w.health.timeline[:5]] == [
        (0.0, 200),
        (1.0, 200),
        (2.0, 200),
        (3.0, 503),
        (4.0, 503),
    ]
    await w.stop()


@pytest.mark.inprocess
async def test_the_grace_period_is_exact_and_catches_a_late_exit():
    clock = VirtualClock(limit=3600)
    w, failures, _ = watch_on(clock, grace=3.0, process=Process(clock))
    await clock.sleep(1.0)
    await w.grace_period()
    assert clock.now() == 4.0 and failures == []
    await w.stop()

    clock = VirtualClock(limit=3600)
    w, failures, _ = watch_on(clock, grace=3.0, process=Process(clock, exits_at=1.23))
    await w.grace_period()
    assert failures == [(pytest.approx(1.25), "exit")]  # the first 50 ms poll after it
    await w.stop()


@pytest.mark.inprocess
async def test_settle_waits_out_its_window_unless_the_server_is_gone():
    clock = VirtualClock(limit=3600)
    w, _, _ = watch_on(clock, settle=4.0, health_interval=0.5)
    await clock.sleep(1.0)
    w.mark_failed(1.0)
    await w.settle()
    assert clock.now() == 5.0  # failed at 1 s, 4 s of settle
    await w.stop()

    clock = VirtualClock(limit=3600)
    # probes every 250 ms; the API server is gone from 1.6 s: refused at 1.75 s
    w, _, _ = watch_on(
        clock, answer=lambda t: 200 if t < 1.6 else "refused", settle=4.0, health_interval=0.25
    )
    await clock.sleep(1.0)
    w.mark_failed(1.0)
    await w.settle()
    assert clock.now() == pytest.approx(1.8)  # settle's first 100 ms poll after that probe
    await w.stop()
