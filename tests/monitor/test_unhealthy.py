"""UNHEALTHY: a server that keeps a faulted engine (vLLM's fault tolerance)
is its own failure class. The classifier's rule and the status parsing in
process; then the emulator's ``unhealthy`` fault against a replay (exit 1,
class ``unhealthy``, the server still up and ``/health`` still 200), and the
bisect's chase treating it as a crash with its own signature."""

from __future__ import annotations

import httpx
import pytest

from replayer.monitor.classify import Evidence, FailureClass, classify
from replayer.monitor.health import Probe, engine_state
from replayer.monitor.signature import matches, signature_from_log
from replayer.monitor.watch import WatchConfig
from replayer.replay.client import Endpoint
from replayer.replay.plan import select
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.replay.run import replay_to_dir
from replayer.session import Chase
from replayer.trace import Trace
from replayer.trace.synth import SynthOptions, write_trace

MODEL = "moonshotai/Kimi-K3"
FAST = WatchConfig(
    health_interval=0.2, scrape_interval=0.2, stall_timeout=5.0, settle=2.0, grace=1.0
)


def probe(t: float, status: int | None = 200, engine: str | None = None, **kw: object) -> Probe:
    return Probe(t=t, status=status, latency=0.001, engine=engine, **kw)  # type: ignore[arg-type]


@pytest.mark.inprocess
def test_engine_state_reads_vllm_fault_tolerance_status():
    body = {
        "schema_version": 1,
        "total_engines": 2,
        "engines": [
            {"id": 0, "status": "healthy"},
            {"id": 1, "status": "unhealthy", "fault_info": "RuntimeError"},
        ],
    }
    assert engine_state(body) == ("unhealthy", "RuntimeError")
    assert engine_state({"engines": [{"id": 0, "status": "dead"}]}) == ("dead", None)
    assert engine_state({"engines": [{"id": 0, "status": "healthy"}]}) == ("healthy", None)
    assert engine_state({"detail": "Not Found"}) == (None, None)
    assert engine_state([1, 2]) == (None, None)


@pytest.mark.inprocess
def test_unhealthy_is_its_own_crash_class():
    sick = [probe(1.0, engine="unhealthy", fault="RuntimeError"), probe(1.2, engine="unhealthy")]
    ev = Evidence(error_class="stream_error", http_status=200, message="x", probes_after=sick)
    assert classify(ev) is FailureClass.UNHEALTHY
    assert FailureClass.UNHEALTHY.is_crash
    # the stall that follows (requests held for recovery) is not a hang
    assert classify(Evidence(None, None, "stall", probes_after=sick, hang=True)) == "unhealthy"
    # gone after all (the recovery timeout passed): the process exit wins
    exited = Evidence(None, None, "x", probes_after=sick, process_exited=True)
    assert classify(exited) is FailureClass.PROCESS_EXIT
    refused = [*sick, Probe(t=2.0, status=None, latency=0.0, error="refused")]
    assert classify(Evidence(None, None, "x", probes_after=refused)) == "process_exit"
    dead = [*sick, probe(2.0, 503, engine="dead")]
    assert classify(Evidence(None, None, "x", probes_after=dead)) == "engine_dead"
    # healthy engines, or a server without fault tolerance: the old rules
    fine = [probe(1.0, engine="healthy"), probe(1.2)]
    assert classify(Evidence("stream_cut", 200, "x", probes_after=fine)) == "stream_cut"


@pytest.mark.inprocess
def test_probe_dict_names_the_engine_state_only_when_known():
    assert "engine" not in probe(0.5).to_dict()
    d = probe(0.5, engine="unhealthy", fault="RuntimeError").to_dict()
    assert (d["engine"], d["fault"]) == ("unhealthy", "RuntimeError")


def one_session(tmp_path, turns=8):
    p = tmp_path / "t.arrow"
    write_trace(
        p, SynthOptions(sessions=1, turns=turns, context=8_000, max_tokens=8, model=MODEL, seed=11)
    )
    return Trace.open(p)


async def replay(trace, emu, tmp_path):
    out = tmp_path / "run"
    outcome = await replay_to_dir(
        trace,
        select(trace),
        ReplayPolicy(timing=Timing.ASAP, request_timeout=20),
        [Endpoint("e", emu.url)],
        out,
        command=["test"],
        progress=False,
        watch=FAST,
        processes={"e": emu},
    )
    return outcome, outcome.summary["targets"]["e"]


async def test_replay_against_an_unhealthy_emulator(emulator_factory, tmp_path):
    emu = emulator_factory(
        [
            *("--speed", "20", "--enable-fault-tolerance"),
            *("--fault", "unhealthy gpu=cuda when request=3"),
        ]
    )
    assert emu.health("/fault_tolerance/status") == 200
    outcome, s = await replay(one_session(tmp_path), emu, tmp_path)
    assert outcome.exit_code == 1
    f = s["failure"]
    assert f["class"] == "unhealthy"
    assert f["request_id"] == "synth-00000-t002"  # the third request, failed by the fault
    assert emu.returncode is None  # nothing exited
    assert emu.health() == 200  # vLLM 0.32: /health says 200 for an UNHEALTHY engine
    assert any(p.get("engine") == "unhealthy" for p in f["health"])
    log = emu.wait_log("status -> UNHEALTHY")
    sig = signature_from_log(log, failure_class="unhealthy")
    assert (sig.failure_class, sig.exception) == ("unhealthy", "RuntimeError")
    assert "illegal memory access" in sig.message
    # the bisect's chase: a crash, matched by its own signature, never by another class's
    chase = Chase(failure_class="unhealthy")
    assert chase.matches(sig, "unhealthy") and not chase.matches(sig, "engine_dead")
    chase.pin("unhealthy", sig)
    assert chase.matches(sig, "unhealthy")
    dead = signature_from_log(log, failure_class="engine_dead")
    assert not matches(sig, dead) and not chase.matches(dead, "engine_dead")


async def test_without_fault_tolerance_the_fault_kills_the_engine(emulator_factory, tmp_path):
    emu = emulator_factory(["--speed", "20", "--fault", "unhealthy when request=3"])
    assert emu.health("/fault_tolerance/status") == 404  # as vLLM without the flag
    outcome, s = await replay(one_session(tmp_path), emu, tmp_path)
    assert outcome.exit_code == 1
    assert s["failure"]["class"] == "process_exit"
    assert emu.wait_exit(10) == 0


async def test_unhealthy_turns_dead_after_the_recovery_timeout(emulator_factory):
    emu = emulator_factory(
        [
            *("--speed", "instant", "--enable-fault-tolerance"),
            *("--fault", "unhealthy timeout=0.5 when request=1"),
        ]
    )
    async with httpx.AsyncClient(base_url=emu.url, timeout=10) as c:
        r = await c.post(
            "/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 4}
        )
        assert r.status_code == 500  # the in-flight request fails
        status = (await c.get("/fault_tolerance/status")).json()
        assert status["engines"][0]["status"] in ("unhealthy", "dead")
    assert emu.wait_exit(15) == 0
    assert "[FT] No recovery within 0.5s timeout." in emu.wait_log("No recovery")
