"""The search engines against planted culprits: exactness at p = 1, trial
bounds, and the one-sided-noise invariant (the result holds every culprit)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayer.bisect.oracle import Budget, BudgetExhausted, Candidate, Oracle, Outcome
from replayer.bisect.search import bisect_reduce, points, race, shortest_prefix
from replayer.testing.fakes import FakeRunner
from tests.helpers.bisect import (
    calibrate,
    make_oracle,
    prefix_stage,
    prefixes,
    probes_of_binary_search,
)

pytestmark = pytest.mark.inprocess


def as_test(oracle):
    async def test(items):
        return await oracle.test(Candidate(tuple(sorted(items))))

    return test


@settings(max_examples=60, deadline=None)
@given(n=st.integers(min_value=1, max_value=1200), data=st.data())
async def test_shortest_prefix_is_exact_in_ceil_log2_trials(tmp_path_factory, n, data):
    h_star = data.draw(st.integers(min_value=1, max_value=n))
    oracle, runner = make_oracle(tmp_path_factory.mktemp("p"), {h_star - 1})
    await calibrate(oracle, runner, range(n))
    h = await shortest_prefix(list(range(n)), (), as_test(oracle))
    assert h == h_star
    assert len(runner.calls) <= math.ceil(math.log2(n))  # 0 for n == 1


@settings(max_examples=60, deadline=None)
@given(n=st.integers(min_value=2, max_value=300), data=st.data())
async def test_bisect_reduce_finds_exactly_the_culprits(tmp_path_factory, n, data):
    m = data.draw(st.integers(min_value=1, max_value=min(4, n)))
    culprits = set(data.draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m, unique=True)))
    oracle, runner = make_oracle(tmp_path_factory.mktemp("b"), culprits)
    items = list(range(n))
    await calibrate(oracle, runner, items)
    got = await bisect_reduce(items, (), as_test(oracle))
    assert set(got) == culprits
    assert list(got) == sorted(got)
    # m pins of ceil(log2 n) probes each, plus a check of each pinned set
    assert len(runner.calls) <= len(culprits) * math.ceil(math.log2(n)) + len(culprits) + 1


async def test_pinned_alone_costs_one_probe(tmp_path):
    oracle, runner = make_oracle(tmp_path, {7})
    await calibrate(oracle, runner, range(1, 8))
    got = await bisect_reduce([1, 2, 3, 4, 5, 6], (7,), as_test(oracle))
    assert got == () and len(runner.calls) == 1


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), p=st.sampled_from([0.3, 0.5, 0.8]), data=st.data())
async def test_one_sided_noise_never_loses_a_culprit(tmp_path_factory, seed, p, data):
    n = data.draw(st.integers(min_value=4, max_value=60))
    culprits = set(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True)))
    oracle, runner = make_oracle(tmp_path_factory.mktemp("n"), culprits, p=p, seed=seed)
    items = tuple(range(n))
    if not await calibrate(oracle, runner, items):
        return  # never reproduced: the pipeline stops here
    got = await bisect_reduce(list(items), (), as_test(oracle))
    assert culprits <= set(got)


async def test_bayesian_prefix_is_exact_and_cheaper_than_repeats_under_a_coin_flip_crash(
    tmp_path,
):
    """MINIMIZE.md §4.1: at p = 0.5 the posterior search finds the exact
    prefix on at least 19 of 20 seeds, never a too-short one, and spends
    fewer runs than binary search with r quiet repeats per dismissal."""
    n, exact, bayes, repeats, searches = 1000, 0, 0, 0, 0
    for seed in range(40):
        if searches == 20:
            break
        culprit = random.Random(seed).randrange(n)
        oracle, runner = make_oracle(tmp_path / "b", {culprit}, p=0.5, seed=seed)
        assert await calibrate(oracle, runner, range(n))
        if oracle.repeats() == 1:
            continue  # five straight crashes (1 in 32): taken as deterministic
        searches += 1
        h = await oracle.flaky_prefix(n, prefixes)
        assert h >= culprit + 1
        exact += h == culprit + 1
        bayes += len(runner.calls)
        oracle, runner = make_oracle(tmp_path / "r", {culprit}, p=0.5, seed=seed)
        await calibrate(oracle, runner, range(n))
        await shortest_prefix(list(range(n)), (), as_test(oracle))
        repeats += len(runner.calls)
    assert searches == 20 and exact >= 19
    assert bayes < repeats
    assert bayes / 20 <= 6 * math.ceil(math.log2(n))


async def test_bayesian_prefix_proves_the_whole_candidate_is_needed(tmp_path):
    """After the cut, the culprit is often the last request: every shorter
    prefix must be shown quiet, with no crash ever seen below n."""
    n, searches = 40, 0
    for seed in range(20):
        oracle, runner = make_oracle(tmp_path / "w", {n - 1}, p=0.5, seed=seed)
        assert await calibrate(oracle, runner, range(n))
        if oracle.repeats() == 1:
            continue
        searches += 1
        assert await oracle.flaky_prefix(n, prefixes) == n
    assert searches >= 15


async def test_bayesian_prefix_resumes_on_the_same_path(tmp_path):
    j = tmp_path / "j.jsonl"
    first = FakeRunner(frozenset({37}), p=0.5, seed=3)
    o = Oracle(first, j, budget=Budget(max_trials=20))
    await calibrate(o, first, range(100))
    with pytest.raises(BudgetExhausted):
        await o.flaky_prefix(100, prefixes)  # killed mid-search
    done = o.trials
    again = FakeRunner(frozenset({37}), p=0.5, seed=4)
    o2 = Oracle(again, j)
    assert await o2.flaky_prefix(100, prefixes) == 38
    assert [r.trial for r in o2.history()][:done] == list(range(1, done + 1))
    assert len(again.calls) == o2.trials - done  # no journaled run was repeated
    idle = FakeRunner(frozenset({37}), p=0.0)
    o3 = Oracle(idle, j)  # a finished search replays from the journal alone
    assert await o3.flaky_prefix(100, prefixes) == 38 and idle.calls == []


# -- per-trigger flakiness (issue 16) ---------------------------------------------------------


async def test_five_flaky_triggers_exact_where_the_steady_binary_search_overshot(tmp_path):
    """Requests 40-44 each crash with p = 0.5: the full trace crashes 97% of
    runs, so calibration mostly looks steady, and a binary search with one
    quiet run per dismissal overshot (the issue's 3 in 10). The re-check of
    the longest quiet prefix catches the flakiness and the posterior search
    (rates from the runs near each hypothesis; a crash counts at its failure
    point, two requests past the trigger that fired) finds 40."""
    n, triggers = 60, frozenset(range(39, 44))
    exact_now = exact_before = 0
    for seed in range(40):
        o, r = make_oracle(tmp_path / "now", set(), p=0.5, seed=seed, triggers=triggers, lag=2)
        assert await calibrate(o, r, range(n))
        h = await prefix_stage(o, n)
        assert h >= 40  # a crash is never overruled
        exact_now += h == 40
        o, r = make_oracle(tmp_path / "before", set(), p=0.5, seed=seed, triggers=triggers, lag=2)
        await calibrate(o, r, range(n))
        k, runs = o.crash_rate()
        if k == runs >= 5:  # the old rule: every run crashed, wherever it struck
            h = await shortest_prefix(list(range(n)), (), as_test(o))
        else:
            h = await o.flaky_prefix(n, prefixes)
        exact_before += h == 40
    # measured on these seeds: 40 of 40 (38 before the crash's scatter counted
    # against taking it as deterministic); the old rule's 19 of 40 cannot be
    # rerun with today's oracle, whose dismissals follow the scatter too
    assert exact_now >= 38, (exact_now, exact_before)


@pytest.mark.parametrize("n", [108, 1000])
async def test_a_deterministic_crash_pays_the_recheck_and_nothing_more(tmp_path, n):
    culprit = random.Random(n).randrange(n // 2, n)
    o, r = make_oracle(tmp_path, {culprit})
    assert await calibrate(o, r, range(n))
    assert await prefix_stage(o, n) == culprit + 1
    assert len(r.calls) == probes_of_binary_search(n, culprit + 1) + 2
    assert {c.positions[-1] + 1 for c in r.calls[-2:]} == {culprit}  # the longest quiet prefix


async def test_shrinking_lowers_the_rate_dismissals_use(tmp_path):
    """Pooled over everything that holds the culprits, 9 of 14 runs crashed
    (lower bound 0.39: 7 quiet runs dismiss); the candidate being reduced
    crashed 5 of its 10 (0.24): inside it, a dismissal needs 12. With fewer
    than 10 runs of its own, its bound is not trusted."""
    o, _ = make_oracle(tmp_path, set())
    big, small = Candidate(tuple(range(10))), Candidate(tuple(range(5)))
    for cand, crashed in [(big, True)] * 4 + [(small, True)] * 5 + [(small, False)]:
        o._account(cand, record(cand, crashed, o))
    assert o.crash_rate() == (9, 10) and o.crash_rate(within=small) == (5, 6)
    assert o.repeats() == o.repeats(within=small) == 4  # six runs: too few of its own
    for _ in range(4):
        o._account(small, record(small, False, o))
    assert o.crash_rate() == (9, 14) and o.crash_rate(within=small) == (5, 10)
    assert (o.repeats(), o.repeats(within=big), o.repeats(within=small)) == (7, 7, 12)


def record(cand, crashed, oracle):
    from replayer.bisect.oracle import TrialRecord

    return TrialRecord(
        trial=oracle.trials + 1,
        key=cand.key(),
        size=len(cand.positions),
        stage="test",
        outcome=Outcome.MATCH if crashed else Outcome.PASS,
    )


# -- k servers: a (k+1)-ary search, moot probes cancelled --------------------------------


def test_points_spread_a_round_evenly():
    assert points(0, 100, 1) == [50]
    assert points(0, 100, 3) == [25, 50, 75]
    assert points(10, 14, 8) == [11, 12, 13]  # never more probes than lengths left
    assert points(4, 5, 3) == []


@given(n=st.integers(2, 300), data=st.data())
@settings(max_examples=40, deadline=None)
async def test_a_wide_prefix_search_is_exact_in_fewer_rounds(n, data):
    h = data.draw(st.integers(1, n))
    width = data.draw(st.integers(1, 8))
    probes: list[int] = []

    async def crashes(prefix):
        probes.append(len(prefix))
        return len(prefix) >= h

    assert await shortest_prefix(list(range(n)), (), crashes, width=width) == h
    # at most `width` probes a round, and log(n)/log(width+1) rounds (+1: the floors)
    rounds = math.ceil(math.log(n) / math.log(width + 1)) + 1
    assert len(probes) <= width * rounds
    if width == 1:
        assert len(probes) <= math.ceil(math.log2(n))


async def test_race_cancels_a_probe_another_made_moot():
    import asyncio

    from replayer.testing import VirtualClock

    clock = VirtualClock()
    finished: list[int] = []
    cancelled: list[int] = []

    async def run(m):
        try:
            await clock.sleep(m)  # a longer prefix takes longer
        except asyncio.CancelledError:
            cancelled.append(m)
            raise
        finished.append(m)
        return m >= 20  # the crash is at 20

    got = await race(
        [10, 20, 30, 40],
        run,
        lambda m, crashed, other: other > m if crashed else other < m,
    )
    # 20 crashed at t=20: 30 and 40 could only crash too, so they were stopped
    assert got == [(10, False), (20, True)] and finished == [10, 20]
    assert sorted(cancelled) == [30, 40] and clock.now() == 20


async def test_race_with_a_limit_runs_at_most_that_many_at_once():
    import asyncio

    running, peak = 0, 0

    async def run(x):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1
        return x

    got = await race(list(range(7)), run, limit=3)
    assert sorted(x for x, _ in got) == list(range(7)) and peak == 3


async def test_a_wide_bisect_reduce_finds_the_same_culprits():
    culprits = {3, 41, 77}

    async def crashes(subset):
        return culprits <= set(subset)

    for width in (1, 2, 4, 8):
        assert await bisect_reduce(list(range(100)), (), crashes, width=width) == (3, 41, 77)
