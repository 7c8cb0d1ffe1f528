"""A broken network between replay and a healthy target is not a server
crash: with a fault proxy in front of a real emulator and the monitor
reading the emulator at its own address, each proxy fault ends in the class
``network``; a real crash behind the same proxy keeps its own class; and a
bisect whose only failure is the proxy's ends "not reproducible" with no
bundle, every trial INFRA."""

from __future__ import annotations

import dataclasses

import pytest

from replayer.api import bisect
from replayer.bisect.files import journal_events
from replayer.bisect.runner import Observation, Trial
from replayer.monitor.classify import FailureClass
from replayer.monitor.watch import WatchConfig
from replayer.options import BisectOptions
from replayer.replay.client import Endpoint
from replayer.replay.engine import Replay
from replayer.replay.plan import build_plan, select
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.replay.results import ResultsWriter, Status
from replayer.session import Outcome
from replayer.testing.faultproxy import Fault, FaultKind, FaultProxy
from tests.helpers.net import replay_via
from tests.helpers.replay import synth

pytestmark = pytest.mark.e2e

WATCH = WatchConfig(
    health_interval=0.2, scrape_interval=0.2, stall_timeout=1.0, settle=1.0, grace=0.5
)


def trace(tmp_path, turns=4):
    return synth(tmp_path, sessions=1, turns=turns, context=2_000, max_tokens=32, seed=3)


@pytest.fixture
def emu(emulator_factory):
    return emulator_factory(["--speed", "instant"])


FAULTS = {
    "reset": Fault.reset(after_bytes=150),
    "half_open": Fault.half_open(after_bytes=150),
    "stall": Fault.stall(600, after_bytes=150),
    "refuse": Fault.refuse(600),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
async def test_each_proxy_fault_in_front_of_a_healthy_target_is_network(emu, tmp_path, name):
    t = trace(tmp_path)
    async with FaultProxy(emu.url) as proxy:
        proxy.on(FAULTS[name], method="POST", nth=2)
        replay = await replay_via(proxy.url, emu.url, t, tmp_path / "run", WATCH)
    run = replay.runs["e"]
    report = run.report
    assert report is not None
    assert report.failure_class is FailureClass.NETWORK
    assert not report.failure_class.is_crash
    assert f"network: the target answered /health 200 at {emu.url}" in report.message
    assert all(p.ok for p in report.health)  # the target's own word, all along
    picked = [e for e in proxy.events if e.fault is not FaultKind.PASS]
    assert [e.request for e in picked] == [2]
    second = run.results[1]
    assert second.request_id in {report.request_id, *report.inflight}
    assert second.status in (Status.TRANSPORT_ERROR, Status.TIMEOUT)
    assert run.results[0].status is Status.OK
    assert not emu.exited()


async def test_a_reset_without_the_targets_own_address_stays_a_stream_cut(emu, tmp_path):
    """Seen only through the proxy, a reset cannot be told from the server's
    own cut: the old class stands (the network rule needs the hop known)."""
    t = trace(tmp_path)
    policy = ReplayPolicy(timing=Timing.ASAP, request_timeout=30)
    async with FaultProxy(emu.url) as proxy:
        proxy.on(Fault.reset(after_bytes=150), method="POST", nth=2)
        writer = ResultsWriter(tmp_path / "results.arrow")
        replay = Replay(
            t,
            build_plan(t, select(t), policy),
            policy,
            [Endpoint("e", proxy.url)],
            writer,
            watch=WATCH,
        )
        try:
            await replay.run()
        finally:
            writer.close()
    report = replay.runs["e"].report
    assert report is not None and report.failure_class is FailureClass.STREAM_CUT


@pytest.mark.parametrize(
    "fault,cls",
    [("exit when request=2", FailureClass.PROCESS_EXIT), ("dead when request=2", "engine_dead")],
)
async def test_a_real_crash_behind_the_proxy_keeps_its_class(
    emulator_factory, tmp_path, fault, cls
):
    emu = emulator_factory(["--speed", "instant", "--fault", fault])
    watch = dataclasses.replace(WATCH, settle=3.0)  # the emulator exits 1 s after death
    async with FaultProxy(emu.url) as proxy:
        replay = await replay_via(proxy.url, emu.url, trace(tmp_path), tmp_path / "run", watch)
    report = replay.runs["e"].report
    assert report is not None and report.failure_class == cls
    assert "network" not in report.message


class ProxiedRunner:
    """Each trial replayed through the proxy, monitored at the target's own
    address, judged as a session's trial is: MATCH when the chase matches
    the class, else OTHER_FAILURE."""

    def __init__(self, proxy: FaultProxy, direct: str) -> None:
        self.proxy, self.direct = proxy, direct
        self.classes: list[str] = []

    async def run(self, trial: Trial) -> Observation:
        replay = await replay_via(
            self.proxy.url,
            self.direct,
            trial.trace,
            trial.out,
            WATCH,
            policy=trial.policy,
            rows=trial.rows,
        )
        report = replay.runs["e"].report
        if report is None:
            return Observation(Outcome.PASS)
        cls = report.failure_class.value
        self.classes.append(cls)
        outcome = Outcome.MATCH if trial.chase.matches(None, cls) else Outcome.OTHER_FAILURE
        return Observation(
            outcome, failure_class=cls, message=report.message, failed_request=report.request_id
        )


@pytest.mark.slow
async def test_a_bisect_does_not_chase_a_network_fault(emu, tmp_path):
    """Every trial's second request is reset by the proxy: the bisect calls
    each trial INFRA and stops "not reproducible", with no bundle."""
    t = trace(tmp_path, turns=3)
    async with FaultProxy(emu.url) as proxy:
        proxy.on(Fault.reset(after_bytes=150), method="POST", nth=2, times=1_000)
        runner = ProxiedRunner(proxy, emu.url)
        lines: list[str] = []
        result = await bisect(
            t, runner, tmp_path / "b", BisectOptions(), watch=WATCH, say=lines.append
        )
    assert result.status == "not_reproducible"
    assert result.bundle is None and not (tmp_path / "b" / "bundle").exists()
    assert runner.classes and set(runner.classes) == {"network"}
    assert result.other_failures == []
    journal = journal_events(tmp_path / "b" / "journal.jsonl")
    records = [e["record"] for _, e in journal if e.get("event") == "trial"]
    assert {(r["outcome"], r["failure_class"]) for r in records} == {("INFRA", "network")}
    assert not emu.exited()


async def test_the_command_with_the_targets_own_address_exits_3_network(emu, tmp_path):
    """From the command line: ``--target-health`` names the emulator's own
    address while requests go through the proxy; a reset mid-body ends the
    replay with exit 3 (the way to the target failed), class ``network`` in
    the summary, not exit 1 (a failed target)."""
    import asyncio
    import json
    import sys

    synth(tmp_path, sessions=1, turns=4, context=2_000, max_tokens=32, seed=3)
    async with FaultProxy(emu.url) as proxy:
        proxy.on(Fault.reset(after_bytes=150), method="POST", nth=2)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "replayer", "replay", str(tmp_path / "t.arrow"),
            "--target", proxy.url, "--target-health", emu.url, "--out", str(tmp_path / "run"),
            "--timing", "asap", "--health-interval", "0.2", "--settle", "1",
            "--grace", "0.5", "--quiet",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 3, err.decode()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["exit_code"] == 3
    failure = summary["targets"]["target"]["failure"]
    assert failure["class"] == "network"
    assert f"(network: the target answered /health 200 at {emu.url}" in failure["message"]
    assert not emu.exited()
