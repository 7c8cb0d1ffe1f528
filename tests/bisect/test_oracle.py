"""The oracle: verdicts from outcomes, repeats from the measured crash rate,
the journal that makes a killed bisect resume without repeating trials."""

from __future__ import annotations

import pytest

from replayer.bisect.oracle import Budget, BudgetExhausted, Candidate, Oracle, Outcome
from replayer.testing.fakes import FakeRunner

pytestmark = pytest.mark.inprocess

FULL = Candidate(tuple(range(10)))


async def test_match_is_accepted_at_once_and_cached(tmp_path):
    runner = FakeRunner(frozenset({3}))
    o = Oracle(runner, tmp_path / "j.jsonl")
    assert await o.test(FULL)
    assert await o.test(FULL)
    assert len(runner.calls) == 1


async def test_deterministic_after_five_straight_matches(tmp_path):
    o = Oracle(FakeRunner(frozenset({3})), tmp_path / "j.jsonl")
    assert o.repeats() == 59  # nothing known: the floor p = 0.05 decides
    for _ in range(4):
        await o.run_once(FULL, "calibrate")
    assert o.crash_rate() == (4, 4) and o.repeats() > 1
    await o.run_once(FULL, "calibrate")
    assert o.repeats() == 1
    runner = o.runner
    assert not await o.test(Candidate((0, 1, 2)))  # one quiet run dismisses it
    assert len(runner.calls) == 6


async def test_flaky_crash_needs_wilson_repeats(tmp_path):
    # p = 0.5: calibration sees quiet runs, so dismissal takes several
    o = Oracle(FakeRunner(frozenset({3}), p=0.5, seed=1), tmp_path / "j.jsonl")
    for _ in range(12):
        await o.run_once(FULL, "calibrate")
    k, n = o.crash_rate()
    assert n == 12 and 0 < k < 12
    assert o.repeats() >= 5
    before = len(o.runner.calls)
    assert not await o.test(Candidate((0, 1, 2)))
    assert len(o.runner.calls) - before == o.repeats()


async def test_other_failure_is_a_new_bug_never_accepted(tmp_path):
    runner = FakeRunner(frozenset({8}), other=frozenset({2}))
    o = Oracle(runner, tmp_path / "j.jsonl")
    for _ in range(5):
        await o.run_once(FULL, "calibrate")
    assert not await o.test(Candidate((0, 1, 2, 3)))
    assert set(o.bugs) == {"other"}
    assert o.bugs["other"].outcome is Outcome.OTHER_FAILURE


async def test_infra_is_retried_then_unresolved(tmp_path):
    runner = FakeRunner(frozenset({3}), infra=2)
    o = Oracle(runner, tmp_path / "j.jsonl")
    assert await o.test(FULL)  # two launch failures, then the match
    assert [r.outcome for r in o.history()] == [Outcome.INFRA, Outcome.INFRA, Outcome.MATCH]
    stuck = Oracle(FakeRunner(frozenset({3}), infra=99), tmp_path / "k.jsonl")
    assert not await stuck.test(FULL)
    assert len(stuck.runner.calls) == 3  # the first try and two retries


async def test_resume_from_the_journal_repeats_no_trial(tmp_path):
    j = tmp_path / "j.jsonl"
    first = FakeRunner(frozenset({3}))
    o = Oracle(first, j)
    for _ in range(5):
        await o.run_once(FULL, "calibrate")
    assert not await o.test(Candidate((0, 1)))
    assert await o.test(Candidate((3, 4)))
    again = FakeRunner(frozenset({3}))
    o2 = Oracle(again, j)  # the same journal, a fresh process
    assert o2.trials == 7
    assert not await o2.test(Candidate((0, 1)))
    assert await o2.test(Candidate((3, 4)))
    assert again.calls == []
    assert await o2.test(Candidate((3,)))  # new work continues the numbering
    assert o2.history()[-1].trial == 8


async def test_a_torn_journal_line_is_ignored(tmp_path):
    j = tmp_path / "j.jsonl"
    o = Oracle(FakeRunner(frozenset({3})), j)
    await o.run_once(FULL, "calibrate")
    with j.open("ab") as f:
        f.write(b'{"event": "trial", "positions": [1')  # killed mid-write
    o2 = Oracle(FakeRunner(frozenset({3})), j)
    assert o2.trials == 1
    await o2.run_once(FULL, "calibrate")  # appended after the torn line, it is not lost
    assert Oracle(FakeRunner(frozenset({3})), j).trials == 2


async def test_budget(tmp_path):
    o = Oracle(FakeRunner(frozenset({3})), tmp_path / "j.jsonl", budget=Budget(max_trials=2))
    await o.run_once(FULL, "x")
    await o.run_once(FULL, "x")
    with pytest.raises(BudgetExhausted, match="trial budget of 2 used"):
        await o.run_once(FULL, "x")


def test_candidate_identity():
    a = Candidate((1, 2, 3))
    assert a.key() == Candidate((1, 2, 3)).key()
    assert a.key() != Candidate((1, 2, 3), timing="asap").key()
    assert a.covers(Candidate((1, 3))) and not Candidate((1, 3)).covers(a)
    assert not Candidate((1, 2, 3), speed=2.0).covers(Candidate((1, 3)))


def test_expected_wall_time_weighs_restarts_by_the_crash_rate(tmp_path):
    """A trial after a crash restarts the server (the model load): 70 s and
    60 s here; after a pass 5 s and 7 s. Three crashes in five runs: the next
    trial follows a crash with 0.6, so 10 more cost 10 * (0.6 * 65 + 0.4 * 6)."""
    from replayer.bisect.oracle import TrialRecord
    from replayer.bisect.pipeline import _duration, expected_seconds

    o = Oracle(FakeRunner(frozenset()), tmp_path / "j.jsonl")
    cand = Candidate((0, 1, 2))
    assert expected_seconds(o, 10) is None  # nothing measured yet
    runs = [(True, 10.0), (True, 70.0), (False, 60.0), (False, 5.0), (True, 7.0)]
    for i, (crashed, secs) in enumerate(runs, 1):
        outcome = Outcome.MATCH if crashed else Outcome.PASS
        o._account(cand, TrialRecord(i, cand.key(), 3, "s", outcome, duration_s=secs))
    assert o.crash_rate() == (3, 5)
    assert expected_seconds(o, 10) == pytest.approx(414.0)
    assert (_duration(414.0), _duration(40), _duration(3 * 3600)) == ("7 min", "40 s", "3.0 h")
