"""Every emulator fault mode maps to its class, against real subprocesses;
slow-but-alive and long prefills are not hangs; metrics.arrow holds the
series around the failure."""

from __future__ import annotations

import orjson
import pytest

from replayer.monitor.metrics import read_metrics, series
from replayer.monitor.watch import WatchConfig
from replayer.replay.client import Target
from replayer.replay.plan import select
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.replay.results import read_results
from replayer.replay.run import replay_to_dir
from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace.synth import SynthOptions, write_trace

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
        [Target("e", emu.url)],
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
    assert (hung["status"], hung["error_class"]) == ("timeout", "hang")
    # well before the 20 s request timeout: the watchdog, not the backstop
    assert hung["done_us"] - hung["dispatched_us"] < 6_000_000
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
    assert at - t_last < 1.0  # the last scrape before the crash
    assert 0 < v_last <= 1  # sessions of 20K-token contexts hold KV blocks
    running = series(rows, "vllm:num_requests_running")
    assert max(v for _, v in running) >= 1
    snap = tmp_path / "run" / s["failure"]["metrics_snapshot"]
    assert "vllm:kv_cache_usage_perc" in snap.read_text()
    run_json = orjson.loads((tmp_path / "run" / "run.json").read_bytes())
    assert run_json["watch"]["stall_timeout"] == 1.0
