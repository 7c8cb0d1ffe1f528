"""Bootstrap confidence intervals for ratios of latency percentiles.

``compare`` must not call a 3% wobble a regression, nor miss a 3x slowdown:
every percentile ratio (B's p99 TTFT over A's, say) comes with a bootstrap
percentile interval, and a difference is called only when that interval
excludes 1 (and, with ``min_effect``, the whole band of differences too small
to matter).

**The exact bootstrap of a quantile, without resampling.** Resampling 50,000
latencies 2,000 times in pure Python is minutes of work, and numpy is not a
dependency. It is also unnecessary: for the nearest-rank ``p``-quantile of a
resample of size ``n`` (rank ``r = ceil(p n)``), the number of resampled
values at or below the ``j``-th order statistic is Binomial(n, j/n), so

    P(Q* <= x_(j)) = P(Binomial(n, j/n) >= r) = P(Beta(r, n - r + 1) <= j/n)

(the binomial-beta identity). Drawing ``B ~ Beta(r, n - r + 1)`` and taking
``x_(ceil(n B))`` therefore draws *exactly* from the ordinary bootstrap
distribution of the sample quantile, in O(1) per draw
(``random.betavariate``). The two samples are independent (two runs, or two
targets), so a draw of the ratio is the ratio of independent draws; the
interval is the percentile interval of ``draws`` of them.

Seeded (``random.Random(f"{seed}/{label}")``): the same inputs give the same
intervals, run after run. Bounded: ``draws`` (default 2,000) per interval.

**Extreme percentiles need a tail.** The bootstrap of a quantile is only as
good as the number of observations beyond it: the p99 of 48 requests is
their maximum, whose bootstrap interval is the gap between the top two
values, far narrower than the run-to-run spread of a maximum. So an interval
is computed only when at least ``min_tail`` (default 10) requests of each
side lie above the percentile's rank (p99 needs 1,000 requests, p90 100,
p50 20); otherwise the verdict is ``too few``.

What it does not capture: run-to-run variation that is not request-to-request
variation (a noisy neighbour, a warm cache). ``min_effect`` is the guard: with
``min_effect=0.10`` (``compare``'s default) a ratio is called only when its
whole interval lies outside [1/1.10, 1.10]. Repeat runs to measure that noise
when it matters.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


def quantile_draws(
    sorted_values: Sequence[float], p: float, draws: int, rng: random.Random
) -> list[float]:
    """``draws`` samples of the bootstrap distribution of the nearest-rank
    ``p``-th percentile (0 < p <= 100) of ``sorted_values`` (ascending)."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("no values")
    r = max(1, math.ceil(p / 100 * n))
    out = []
    for _ in range(draws):
        j = math.ceil(n * rng.betavariate(r, n - r + 1))
        out.append(sorted_values[min(n, max(1, j)) - 1])
    return out


def _ratio(b: float, a: float) -> float:
    if a == 0:
        return 1.0 if b == 0 else math.inf
    return b / a


@dataclass(frozen=True)
class RatioCI:
    """B's statistic over A's, with its interval and verdict."""

    ratio: float | None
    low: float | None
    high: float | None
    verdict: str
    """``higher`` (B above A), ``lower``, ``same`` (the interval allows no
    difference), ``too few`` (fewer than ``min_tail`` values beyond the
    percentile on a side: no interval) or ``n/a`` (a side has no values)."""

    def to_dict(self) -> dict[str, object]:
        def r(v: float | None) -> float | None:
            return None if v is None or not math.isfinite(v) else round(v, 4)

        return {"ratio": r(self.ratio), "low": r(self.low), "high": r(self.high),
                "verdict": self.verdict}  # fmt: skip


def judge(low: float, high: float, min_effect: float = 0.0) -> str:
    """``higher``/``lower`` only when [low, high] lies wholly outside
    [1/(1+min_effect), 1+min_effect] (with 0: excludes 1), else ``same``."""
    if low > 1 + min_effect:
        return "higher"
    if high < 1 / (1 + min_effect):
        return "lower"
    return "same"


def percentile_ratio(
    a: Sequence[float],
    b: Sequence[float],
    p: float,
    *,
    draws: int = 2000,
    level: float = 0.95,
    seed: int | str = 0,
    label: str = "",
    min_effect: float = 0.0,
    min_tail: int = 10,
) -> RatioCI:
    """Ratio of the ``p``-th percentiles of ``b`` and ``a``, with a
    ``level`` bootstrap percentile interval (see the module docstring)."""
    if not a or not b:
        return RatioCI(None, None, None, "n/a")
    sa, sb = sorted(a), sorted(b)
    ra = max(1, math.ceil(p / 100 * len(sa)))
    rb = max(1, math.ceil(p / 100 * len(sb)))
    point = _ratio(sb[rb - 1], sa[ra - 1])
    if min(len(sa) - ra, len(sb) - rb) < min_tail:
        return RatioCI(point, None, None, "too few")
    rng = random.Random(f"{seed}/{label}/{p}")
    da = quantile_draws(sa, p, draws, rng)
    db = quantile_draws(sb, p, draws, rng)
    ratios = sorted(_ratio(y, x) for x, y in zip(da, db, strict=True))
    tail = (1 - level) / 2
    low = ratios[max(0, math.floor(tail * draws))]
    high = ratios[min(draws - 1, math.ceil((1 - tail) * draws) - 1)]
    return RatioCI(point, low, high, judge(low, high, min_effect))
