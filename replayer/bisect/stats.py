"""The statistics of flaky crashes (MINIMIZE.md §4.3-4.4), standard library only.

A candidate that contains the culprits crashes with probability p per run;
one that does not never shows the chased signature (one-sided noise). So a
candidate is accepted on its first matching crash and rejected only after
``r = ceil(ln a / ln(1 - p_lo))`` quiet runs, with ``p_lo`` a Wilson lower
bound on p: under-estimating p costs trials, never correctness.
"""

from __future__ import annotations

import math
from typing import Any

Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (95% by default)."""
    if n <= 0:
        return (0.0, 1.0)
    phat = k / n
    denom = 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def zero_upper(n: int, alpha: float = 0.05) -> float:
    """Exact one-sided upper bound on p after 0 events in n runs: 1 - a^(1/n)."""
    if n <= 0:
        return 1.0
    return float(1 - alpha ** (1 / n))


def repeats_for(p_lo: float, alpha: float = 0.05, cap: int = 60) -> int:
    """Quiet runs needed before rejecting: smallest r with (1 - p_lo)^r <= a."""
    if p_lo >= 1.0:
        return 1
    if p_lo <= 0.0:
        return cap
    return max(1, min(cap, math.ceil(math.log(alpha) / math.log(1 - p_lo))))


def describe_rate(k: int, n: int) -> str:
    """``crashed 18/20 (90%, 95% CI 70-97%)`` or the zero-event bound."""
    if n == 0:
        return "not run"
    if k == 0:
        return f"crashed 0/{n} (95% upper bound {zero_upper(n):.0%})"
    lo, hi = wilson(k, n)
    return f"crashed {k}/{n} ({k / n:.0%}, 95% CI {lo:.0%}-{hi:.0%})"


def rate_dict(k: int, n: int) -> dict[str, Any]:
    """k/N with its interval, as a bundle's manifest states it."""
    lo, hi = wilson(k, n) if n else (0.0, 1.0)
    if n and k == 0:
        hi = zero_upper(n)
    return {
        "crashes": k,
        "runs": n,
        "low": round(lo, 4),
        "high": round(hi, 4),
        "text": describe_rate(k, n),
    }


def fisher_one_sided(k1: int, n1: int, k2: int, n2: int) -> float | None:
    """P(target shows >= k1 crashes if both platforms crashed at one rate):
    Fisher's exact test, one-sided, on the 2x2 table of crashes and runs."""
    if not n1 or not n2:
        return None
    total, crashes = n1 + n2, k1 + k2
    denom = math.comb(total, crashes)
    p = (
        sum(math.comb(n1, i) * math.comb(n2, crashes - i) for i in range(k1, min(n1, crashes) + 1))
        / denom
    )
    return round(p, 6)
