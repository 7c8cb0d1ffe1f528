"""The chased crash is exit-aware (issue 16): pinned on a crash that ended
with code 0, the same log ending with SIGABRT is another bug, an exit not
caught yet is the same one; a bare hash from an older bundle matches on the
log. Unit checks of :class:`Chase`, then a fake-runner bisect (no server) that
pins, downgrades and resumes."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from replayer.bisect.oracle import Outcome
from replayer.bisect.pipeline import Bisect, BisectOptions, run_bisect
from replayer.bisect.runner import FunctionRunner, Observation, Trial
from replayer.monitor.signature import Signature, signature_from_log
from replayer.replay.plan import select
from replayer.session import Chase
from tests.helpers.bisect import write_trace
from tests.helpers.vllm_logs import ROCM_FAULT, ROCM_HIP

pytestmark = pytest.mark.inprocess

LOG, OTHER_LOG = ROCM_FAULT, ROCM_HIP
"""A ROCm HSA hard fault (the worker dies, a wrapper traceback), a HIP Triton error."""


def sig(code: int | None, log: str = LOG, cls: str = "process_exit") -> Signature:
    return signature_from_log(log, failure_class=cls, exit_code=code)


ZERO, ABORT, UNKNOWN = sig(0), sig(-6), sig(None)


def pinned(s: Signature) -> Chase:
    c = Chase()
    c.pin(s.failure_class, s)
    return c


def test_the_fixture_is_one_log_three_exits():
    assert ZERO.gpu_errors and ZERO.events  # evidence besides the exit
    assert len({ZERO.hash, ABORT.hash, UNKNOWN.hash}) == 3
    assert ZERO.log_hash == ABORT.log_hash == UNKNOWN.log_hash == UNKNOWN.hash


def test_pinned_on_code_0():
    c = pinned(ZERO)
    assert (c.failure_class, c.signature, c.log_hash, c.exit) == (
        "process_exit",
        ZERO.hash,
        ZERO.log_hash,
        "code 0",
    )
    assert c.matches(sig(0), "process_exit")
    assert not c.matches(ABORT, "process_exit")  # the same log, another ending
    assert c.matches(UNKNOWN, "process_exit")  # not exited yet: no evidence against
    assert not c.matches(sig(0, OTHER_LOG), "process_exit")
    assert not c.matches(sig(0, cls="engine_dead"), "engine_dead")
    assert c.matches(None, "process_exit") and not c.matches(None, "engine_dead")
    assert c.to_dict() == {
        "class": "process_exit",
        "signature": ZERO.hash,
        "log_hash": ZERO.log_hash,
        "exit": "code 0",
        "regex": None,
    }
    assert replace(c) == c  # what a control trial gets


def test_pinned_on_an_unknown_exit_matches_any():
    c = pinned(UNKNOWN)
    assert all(c.matches(s, "process_exit") for s in (ZERO, ABORT, UNKNOWN))
    assert not c.matches(sig(None, OTHER_LOG), "process_exit")


def test_a_bare_hash():
    # a bundle written before the exit counted: its manifest's hash is a log hash
    old = Chase(failure_class="process_exit", signature=ZERO.log_hash)
    assert all(old.matches(s, "process_exit") for s in (ZERO, ABORT, UNKNOWN))
    assert not old.matches(sig(0, OTHER_LOG), "process_exit")
    # a version-2 hash given alone (--expect-signature, a new manifest) names its exit;
    # without the log hash behind it, an unknown exit cannot be told apart
    new = Chase(failure_class="process_exit", signature=ZERO.hash)
    assert new.matches(ZERO, "process_exit")
    assert not new.matches(ABORT, "process_exit") and not new.matches(UNKNOWN, "process_exit")
    # a version-1 signature.json read back matches on its log too
    v1 = {k: v for k, v in ZERO.to_dict().items() if k != "log_hash"}
    c = pinned(Signature.from_dict({**v1, "version": 1, "hash": ZERO.log_hash}))
    assert c.matches(ABORT, "process_exit") and c.matches(UNKNOWN, "process_exit")


def test_is_other():
    c = pinned(ZERO)
    assert c.is_other(ABORT) and c.is_other(sig(0, OTHER_LOG)) and c.is_other("label")
    assert not c.is_other(ZERO) and not c.is_other(UNKNOWN) and not c.is_other(None)
    assert not c.is_other(ZERO.hash) and not c.is_other(ZERO.log_hash)
    assert not Chase().is_other(ABORT)  # nothing pinned yet
    labelled = Chase(signature="planted")
    assert labelled.is_other("other") and not labelled.is_other("planted")


OPTS = BisectOptions(
    stages=("calibrate",), calibrate_matches=3, calibrate_runs=4, confirm=0, bundle=False
)


def exits_runner(exits: list[int | None]) -> FunctionRunner:
    """Crashes on every trial with the same log, the exit taken in turn from
    ``exits``; calls every crash a MATCH, as a runner may."""
    calls: list[Trial] = []

    def run(trial: Trial) -> Observation:
        s = sig(exits[len(calls) % len(exits)])
        calls.append(trial)
        return Observation(Outcome.MATCH, failure_class=s.failure_class, signature=s)

    return FunctionRunner(run)


async def test_bisect_pins_the_first_crash_with_its_exit(tmp_path):
    t = write_trace(tmp_path)
    out = tmp_path / "b"
    b = Bisect(t, select(t), exits_runner([0, -6, None, 0]), out, OPTS, say=lambda m: None)
    await run_bisect(b)
    got = [(r.outcome, r.signature) for r in b.oracle.history()]
    assert got == [
        (Outcome.MATCH, ZERO.hash),
        (Outcome.OTHER_FAILURE, ABORT.hash),  # a known other exit: another bug
        (Outcome.MATCH, UNKNOWN.hash),  # not exited yet: the same crash
        (Outcome.MATCH, ZERO.hash),
    ]
    assert (b.chase.signature, b.chase.log_hash, b.chase.exit) == (
        ZERO.hash,
        ZERO.log_hash,
        "code 0",
    )
    assert set(b.oracle.bugs) == {ABORT.hash}

    # resumed from the journal (which holds the hash only), the chase is as exit-aware
    again = Bisect(t, select(t), exits_runner([-6]), out, OPTS, say=lambda m: None)
    assert (again.chase.signature, again.chase.log_hash, again.chase.exit) == (
        ZERO.hash,
        ZERO.log_hash,
        "code 0",
    )
    assert again.signature == ZERO
    assert again.chase.matches(UNKNOWN, "process_exit")
    assert not again.chase.matches(ABORT, "process_exit")


async def test_bisect_resumes_a_label_chase_without_signature_json(tmp_path):
    t = write_trace(tmp_path)
    out = tmp_path / "b"

    def run(trial: Trial) -> Observation:
        return Observation(Outcome.MATCH, failure_class="engine_dead", signature="planted")

    b = Bisect(t, select(t), FunctionRunner(run), out, OPTS, say=lambda m: None)
    await run_bisect(b)
    assert not (out / "trials" / "0001" / "signature.json").exists()
    again = Bisect(t, select(t), FunctionRunner(run), out, OPTS, say=lambda m: None)
    assert (again.chase.signature, again.chase.log_hash, again.chase.exit) == (
        "planted",
        None,
        None,
    )
    entries = [orjson.loads(x) for x in (out / "journal.jsonl").read_bytes().splitlines()]
    assert all(e["record"]["signature"] == "planted" for e in entries if e["event"] == "trial")
