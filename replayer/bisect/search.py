"""Search engines over a monotone, expensive predicate (MINIMIZE.md §2.7).

``test(subset)`` says whether a candidate still shows the chased crash. The
engines assume monotonicity (a superset of a crashing candidate crashes),
which holds only roughly for a server, and one-sided noise (a candidate that
does not contain the culprits never shows the chased signature): so an
answer of True is trusted, and a false False only makes the result larger,
never wrong.

* :func:`shortest_prefix`: binary search, ``ceil(log2 n)`` probes.
* :func:`bisect_reduce`: pin the last element of the shortest interesting
  prefix, drop the tail, repeat (QuickXplain / Cox's bisect-reduce):
  ``m * ceil(log2 n)`` probes for m culprits, against ddmin's ``O(n^2)``.
  The order of ``items`` is the search's prior: likely culprits first make
  the prefixes short.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
Test = Callable[[tuple[T, ...]], Awaitable[bool]]


async def shortest_prefix(items: Sequence[T], pinned: tuple[T, ...], test: Test[T]) -> int:
    """Smallest h >= 1 such that ``test(pinned + items[:h])``, given that
    ``pinned + items`` passes and ``pinned`` alone does not (or is not worth
    a trial). Binary search: ``ceil(log2 len(items))`` probes."""
    lo, hi = 0, len(items)  # test(prefix hi) holds; prefix lo is taken to fail
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await test(pinned + tuple(items[:mid])):
            hi = mid
        else:
            lo = mid
    return hi


async def binary_prefix(n: int, run: Callable[[int], Awaitable[int | None]]) -> tuple[int, int]:
    """:func:`shortest_prefix` for a search of one run per probe that learns
    from a crash where it struck: ``run(j)`` says the prefix length the run
    showed crashing (at most j), or None when it was quiet. Returns (lo, hi):
    prefix hi crashed, lo is the longest seen quiet (0: none)."""
    lo, hi = 0, n
    for _ in range(2 * n.bit_length() + 2):  # each probe halves or better
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        at = await run(mid)
        if at is None:
            lo = mid
        else:
            hi = max(at, lo + 1)
    return lo, hi


async def bisect_reduce(items: Sequence[T], pinned: tuple[T, ...], test: Test[T]) -> tuple[T, ...]:
    """A small subset S of ``items`` with ``test(pinned + S)``, in the order
    of ``items``; ``test(pinned + items)`` is known to hold.

    Each round first tries what is already pinned on its own, so a single
    culprit costs one probe once it is pinned."""
    kept: list[T] = []
    remaining = list(items)
    for _ in range(len(items) + 1):  # each round pins one element or stops
        base = pinned + tuple(kept)
        if not remaining or await test(base):
            break
        h = await shortest_prefix(remaining, base, test)
        kept.append(remaining[h - 1])
        remaining = remaining[: h - 1]
    order = {x: i for i, x in enumerate(items)}
    return tuple(sorted(kept, key=order.__getitem__))


FAR = 0.5
"""Weight of a run longer than the shortest crash seen in the crash-rate
estimate. A longer prefix can hold more triggers and crash more often (five
triggers at p = 0.5 crash 97% of runs, one 50%): at full weight, its crashes
made quiet runs of the one-trigger prefix look conclusive (exact 17 of 50 on
the fake runner); the less weight, the more probes a steady crash pays to be
sure (bench/RESULTS.md, "Bisect for real crashes")."""


def _lbeta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


class _Posterior:
    """P(h* = h | runs) for the shortest crashing prefix h* in 1..n, with the
    crash rate p integrated out under a Beta(prior) (Beta-binomial marginal).

    Under h* = h, a run of prefix j >= h crashes with probability p and a run
    of j < h never does. So h's weight is B(a + c_h, b + q_h), c_h and q_h
    the crashes and quiet runs at j >= h, and zero below any crash. h only
    enters through which runs it is at most, so the weights are constant
    between probed lengths: the posterior is a list of segments."""

    def __init__(self, n: int, a: float, b: float, runs: list[tuple[int, bool]]) -> None:
        top = min((j for j, crashed in runs if crashed), default=n)
        cuts = sorted({j for j, _ in runs if j < top} | {top})
        self.segments: list[tuple[int, int, float]] = []  # (lo, hi]: log weight of each h
        self.rates: list[float] = []
        """Per segment, the posterior mean crash rate under its h."""
        lo = 0
        for hi in cuts:
            c = q = 0.0
            for j, crashed in runs:
                if j >= hi:
                    w = 1.0 if j <= top else FAR
                    c, q = (c + w, q) if crashed else (c, q + w)
            self.segments.append((lo, hi, _lbeta(a + c, b + q)))
            self.rates.append((a + c) / (a + b + c + q))
            lo = hi
        m = max(w for _, _, w in self.segments)
        self.log_z = m + math.log(sum((hi - lo) * math.exp(w - m) for lo, hi, w in self.segments))

    def prob(self, w: float) -> float:
        return math.exp(w - self.log_z)

    def mode(self) -> tuple[int, float]:
        lo, hi, w = max(self.segments, key=lambda s: (s[2], -s[0]))
        return hi if hi - lo == 1 else lo + 1, self.prob(w)

    def quantile(self, f: float) -> int:
        acc = 0.0
        for lo, hi, w in self.segments:
            mass = (hi - lo) * self.prob(w)
            if acc + mass >= f:
                return min(hi, lo + max(1, math.ceil((f - acc) / self.prob(w))))
            acc += mass
        return self.segments[-1][1]

    def p_crash(self, j: int) -> float:
        """P(a run of prefix j crashes): over h <= j, its rate."""
        return sum(
            max(0, min(hi, j) - lo) * self.prob(w) * rate
            for (lo, hi, w), rate in zip(self.segments, self.rates, strict=True)
        )

    def entropy(self) -> float:
        return -sum((hi - lo) * self.prob(w) * (w - self.log_z) for lo, hi, w in self.segments)


def _expected_entropy(
    n: int, a: float, b: float, runs: list[tuple[int, bool]], j: int, post: _Posterior
) -> float:
    """The posterior's entropy after one more run of prefix j, in expectation
    (P(crash) from the current posterior: the runs a hypothesis weighs depend
    on the shortest crash, so evidences of two outcomes do not compare)."""
    crash = _Posterior(n, a, b, [*runs, (j, True)])
    quiet = _Posterior(n, a, b, [*runs, (j, False)])
    pc = post.p_crash(j)
    return pc * crash.entropy() + (1.0 - pc) * quiet.entropy()


EQUAL_INFORMATION = 0.05
"""Probes whose expected information is within this fraction of the best
count as equal: among them, the one likeliest to pass is run."""


def _pick(
    n: int,
    a: float,
    b: float,
    runs: list[tuple[int, bool]],
    choices: list[int],
    post: _Posterior,
    crash_cost: float,
) -> int:
    """The probe removing the most entropy in expectation; with
    ``crash_cost`` > 1 (a crash costs the next trial a server restart),
    among probes of about equal information the one least likely to crash."""
    h = post.entropy()
    gain = {j: h - _expected_entropy(n, a, b, runs, j, post) for j in choices}
    top = max(gain.values())
    if crash_cost <= 1.0 or top <= 0:
        return max(choices, key=gain.__getitem__)
    equal = [j for j in choices if gain[j] >= (1 - EQUAL_INFORMATION) * top]
    return min(equal, key=post.p_crash)


async def bayes_prefix(
    n: int,
    probe: Callable[[int], Awaitable[int | None]],
    seen: Sequence[tuple[int, bool]] = (),
    *,
    confidence: float = 0.99,
    max_probes: int = 1000,
    crash_cost: float = 1.0,
) -> int:
    """The shortest crashing prefix under a flaky crash: Bayesian bisection
    for one-sided noise (MINIMIZE.md §4.1), with the crash rate unknown.

    ``probe(j)`` runs prefix j once (prefix n is known to crash) and says
    the prefix length that run showed crashing (j, or less when the failure
    came before the rest was sent), or None when it was quiet; ``seen``
    are runs already made, as (length, crashed): the calibration's at n, a
    binary search's. The crash rate under each h is estimated from the runs
    between h and the shortest crash, with longer ones down-weighted
    (:data:`FAR`): a longer prefix may hold more triggers and crash more
    often, and must not make quiet runs of a shorter one look conclusive.
    Each probe goes where the expected entropy of the posterior after it is
    lowest, among the quartiles, the points just below them and the
    shortest crashing length (a run there only measures p, which is worth it
    when p is the doubt); with ``crash_cost`` > 1 (a crash costs the next
    trial a server restart), among probes of about equal information the one
    likelier to pass wins (:data:`EQUAL_INFORMATION`). The search ends
    when one length holds ``confidence`` of the mass; a crash is never
    overruled, so the answer is never shorter than h*."""
    a = b = 1.0
    runs: list[tuple[int, bool]] = [(min(j, n), c) for j, c in seen]
    for _ in range(max_probes):
        post = _Posterior(n, a, b, runs)
        best, mass = post.mode()
        if mass >= confidence:
            return best
        choices = {post.segments[-1][1]}
        for f in (0.25, 0.5, 0.75):
            j = post.quantile(f)
            choices |= {j, max(1, j - 1)}

        j = _pick(n, a, b, runs, sorted(choices), post, crash_cost)
        at = await probe(j)
        runs.append((j, False) if at is None else (min(at, j), True))
    return _Posterior(n, a, b, runs).mode()[0]
