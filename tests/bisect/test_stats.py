"""Wilson intervals, the zero-event bound and the repeat rule (MINIMIZE.md §4)."""

from __future__ import annotations

import pytest

from replayer.bisect.stats import (
    describe_rate,
    fisher_one_sided,
    rate_dict,
    repeats_for,
    wilson,
    zero_upper,
)

pytestmark = pytest.mark.inprocess


@pytest.mark.parametrize(
    "k,n,lo,hi",
    [
        (10, 10, 0.72, 1.00),
        (20, 20, 0.84, 1.00),
        (9, 10, 0.60, 0.98),
        (5, 10, 0.24, 0.76),
        (1, 10, 0.02, 0.40),
        (3, 20, 0.05, 0.36),
    ],
)
def test_wilson_matches_the_published_table(k, n, lo, hi):
    got = wilson(k, n)
    assert round(got[0], 2) == lo and round(got[1], 2) == hi


def test_zero_event_upper_bound():
    assert round(zero_upper(10), 3) == 0.259
    assert round(zero_upper(20), 3) == 0.139
    assert round(zero_upper(30), 3) == 0.095
    assert zero_upper(0) == 1.0


@pytest.mark.parametrize(
    "p,r05,r01", [(0.9, 2, 2), (0.8, 2, 3), (0.5, 5, 7), (0.3, 9, 13), (0.2, 14, 21), (0.1, 29, 44)]
)
def test_repeat_rule_table(p, r05, r01):
    assert repeats_for(p, 0.05) == r05
    assert repeats_for(p, 0.01) == r01


def test_repeat_rule_edges():
    assert repeats_for(1.0) == 1
    assert repeats_for(0.0) == 60
    assert repeats_for(0.001, cap=10) == 10


def test_describe_rate():
    assert describe_rate(18, 20) == "crashed 18/20 (90%, 95% CI 70%-97%)"
    assert describe_rate(0, 10) == "crashed 0/10 (95% upper bound 26%)"
    assert describe_rate(0, 0) == "not run"


def test_fisher_one_sided():
    # 4/4 on the target, 0/4 on the control: one table in C(8, 4) is as extreme
    assert fisher_one_sided(4, 4, 0, 4) == round(1 / 70, 6)
    assert fisher_one_sided(2, 4, 2, 4) > 0.5  # the same rate: no evidence
    assert fisher_one_sided(3, 3, 0, 0) is None


def test_rate_dict_uses_the_zero_event_bound():
    assert rate_dict(0, 10)["high"] == round(zero_upper(10), 4)
    assert rate_dict(0, 0) | {"text": ""} == {
        "crashes": 0, "runs": 0, "low": 0.0, "high": 1.0, "text": ""
    }  # fmt: skip
