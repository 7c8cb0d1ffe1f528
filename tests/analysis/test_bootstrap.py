"""The exact quantile bootstrap draws from the same distribution as resampling
does; intervals are seeded, cover 1 for equal samples and exclude it for a
real shift; the verdict honours the minimum effect."""

from __future__ import annotations

import random

import pytest

from replayer.analysis.bootstrap import judge, percentile_ratio, quantile_draws
from replayer.trace.stats import percentile

pytestmark = pytest.mark.inprocess


def test_exact_draws_match_resampling():
    rng = random.Random(3)
    values = sorted(rng.lognormvariate(0, 1) for _ in range(40))
    n, draws = len(values), 20_000
    for p in (50, 90, 99):
        exact = sorted(quantile_draws(values, p, draws, random.Random(1)))
        naive = sorted(percentile(sorted(rng.choices(values, k=n)), p) for _ in range(draws))
        # the two empirical CDFs agree at every order statistic (KS distance)
        worst = max(
            abs(
                sum(v <= x for v in exact[::10]) / (draws / 10)
                - sum(v <= x for v in naive[::10]) / (draws / 10)
            )
            for x in values
        )
        assert worst < 0.03, (p, worst)


def test_intervals():
    rng = random.Random(5)
    a = [rng.gammavariate(2, 50) for _ in range(2000)]
    same = [rng.gammavariate(2, 50) for _ in range(2000)]
    slow = [3 * rng.gammavariate(2, 50) for _ in range(2000)]
    for p in (50, 90, 99):
        eq = percentile_ratio(a, same, p, seed=1)
        assert eq.low <= 1 <= eq.high and eq.verdict == "same"
        up = percentile_ratio(a, slow, p, seed=1)
        assert 2 < up.low < up.ratio < up.high < 4.5 and up.verdict == "higher"
        down = percentile_ratio(slow, a, p, seed=1)
        assert down.verdict == "lower" and down.high < 1
        # seeded: the same interval every time
        assert percentile_ratio(a, slow, p, seed=1) == up
    assert percentile_ratio([], a, 50).verdict == "n/a"


def test_extreme_percentiles_of_few_values_are_not_judged():
    rng = random.Random(9)
    a = [rng.random() for _ in range(999)]
    b = [3 * v for v in a]
    few = percentile_ratio(a, b, 99)  # 9 values beyond p99: not enough
    assert (few.verdict, few.low, few.high) == ("too few", None, None)
    assert few.ratio == 3.0
    assert percentile_ratio(a + [0.5], b + [1.5], 99).verdict == "higher"  # 10 beyond
    assert percentile_ratio(a[:19], b[:19], 50).verdict == "too few"
    assert percentile_ratio(a[:20], b[:20], 50).verdict == "higher"


def test_point_ratio_is_the_ratio_of_nearest_rank_percentiles():
    a = [float(v) for v in range(1, 41)]
    b = [2 * v for v in a]
    r = percentile_ratio(a, b, 50)
    assert r.ratio == 2.0  # 40/20 over 20: nearest rank 20 on both sides
    assert r.low <= 2.0 <= r.high


def test_min_effect_band():
    assert judge(1.01, 1.2) == "higher"
    assert judge(1.01, 1.2, min_effect=0.05) == "same"
    assert judge(1.06, 1.2, min_effect=0.05) == "higher"
    assert judge(0.5, 0.94, min_effect=0.05) == "lower"
    assert judge(0.5, 0.96, min_effect=0.05) == "same"
    assert judge(0.9, 1.1) == "same"
