"""What a bisect's passes share (:class:`~replayer.bisect.state.Search`): the
best candidate under the policy, positions and rows, the trial a candidate
becomes, a journaled test that pins the first crash, another crash never
taken for it, an improvement said and bundled, and the chase restored on
resume. In-process, with a function as the runner."""

from __future__ import annotations

import pytest

from replayer.bisect.oracle import Candidate, Outcome
from replayer.bisect.runner import FunctionRunner, Observation, Trial
from replayer.bisect.state import Search
from replayer.replay.policy import ReplayPolicy, Timing
from tests.helpers.bisect import write_trace

pytestmark = pytest.mark.inprocess

POLICY = ReplayPolicy(timing=Timing.ASAP, speed=2.0)


def search(tmp_path, fn, said=None) -> Search:
    """Over rows 6.. of a trace of 6 sessions x 5 turns (row i: session i % 6,
    turn i // 6): position p is row p + 6."""
    trace = write_trace(tmp_path)
    assert trace.order == list(range(30))
    return Search(
        trace,
        trace.order[6:],
        FunctionRunner(fn),
        tmp_path / "bisect",
        policy=POLICY,
        say=(said if said is not None else []).append,
    )


def never(trial: Trial) -> Outcome:
    raise AssertionError("no trial expected")


def test_the_best_starts_as_the_whole_selection_under_the_policy(tmp_path):
    s = search(tmp_path, never)
    assert s.best == Candidate(tuple(range(24)), "asap", 2.0)
    assert s.candidate([5, 1]) == Candidate((1, 5), "asap", 2.0)
    assert (s.session(0), s.session(7)) == ("s0", "s1")
    assert s.positions_of([6, 29, 0]) == [0, 23]  # row 0 is not in the selection
    assert (s.reached([6, 9, 7]), s.reached([0]), s.reached([])) == (4, None, None)


def test_a_trial_is_the_candidates_rows_with_its_timing_and_speed(tmp_path):
    s = search(tmp_path, never)
    cand = Candidate((0, 2), "recorded", 4.0)
    trial = s.trial(cand, 7, "prefix", tmp_path / "t7", s.chase)
    assert (trial.rows, trial.number, trial.stage) == ((6, 8), 7, "prefix")
    assert (trial.timing, trial.speed) == (Timing.RECORDED, 4.0)
    assert trial.request_ids() == ["s0-1", "s2-1"]
    assert trial.out.is_dir()
    assert s.source_rows(s.trace, [8, 6]) == [8, 6]


async def test_a_match_is_journaled_and_pins_the_chase(tmp_path):
    trials: list[Trial] = []

    def crash(trial: Trial) -> Observation:
        trials.append(trial)
        return Observation(
            Outcome.MATCH, failure_class="process_exit", signature="planted", sent=trial.rows[:2]
        )

    s = search(tmp_path, crash)
    assert not s.chase.pinned
    assert await s.test([0, 1, 2], "prefix")
    assert [t.rows for t in trials] == [(6, 7, 8)]
    assert (s.chase.failure_class, s.chase.signature) == ("process_exit", "planted")
    [rec] = s.oracle.history()
    assert (rec.trial, rec.outcome, rec.size, rec.stage) == (1, Outcome.MATCH, 3, "prefix")
    assert (rec.signature, rec.run, rec.reached) == ("planted", "trials/0001", 2)
    assert (tmp_path / "bisect" / "trials" / "0001").is_dir()
    # a verdict is final: asked again, nothing runs
    assert await s.test([0, 1, 2], "prefix")
    assert len(trials) == 1
    # resumed from its journal, a new search chases the same crash
    again = search(tmp_path, never)
    assert (again.chase.failure_class, again.chase.signature) == ("process_exit", "planted")


async def test_a_match_labelled_as_another_crash_is_never_taken_for_it(tmp_path):
    labels = iter(["planted"] + ["another"] * 50)

    def crash(trial: Trial) -> Observation:
        return Observation(Outcome.MATCH, failure_class="process_exit", signature=next(labels))

    s = search(tmp_path, crash)
    assert await s.test(range(24), "calibrate")
    assert not await s.test([0, 1], "prefix")
    outcomes = {r.outcome for r in s.oracle.records[s.candidate([0, 1]).key()]}
    assert outcomes == {Outcome.OTHER_FAILURE}
    assert s.chase.signature == "planted"


def test_an_improvement_is_said_and_bundled_and_the_same_best_is_not(tmp_path):
    said: list[str] = []
    bundles: list[str] = []
    s = search(tmp_path, never, said)
    s.bundle_writer = lambda search, status: bundles.append(status)
    s.improve(s.best, "prefix")
    assert (said, bundles) == ([], [])
    s.improve(s.candidate([3, 4]), "sessions")
    assert s.best == Candidate((3, 4), "asap", 2.0)
    assert said == ["== sessions: best repro now 2 requests (asap, speed 2)"]
    assert bundles == ["in_progress"]
