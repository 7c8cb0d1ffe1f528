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


async def bayes_prefix(
    n: int,
    probe: Callable[[int], Awaitable[bool]],
    p: Callable[[], float],
    *,
    confidence: float = 0.95,
    max_probes: int = 1000,
) -> int:
    """The shortest crashing prefix under a flaky crash (Turner's Bayesian
    bisection for one-sided noise, MINIMIZE.md §4.1).

    A posterior over h* (the minimal prefix length, 1..n; prefix n is known to
    crash) is kept. ``probe(j)`` runs prefix j once: a crash rules out every
    h* > j; a quiet run multiplies the weight of every h* <= j by ``1 - p``
    (it would have crashed with probability p). Each probe goes to the
    posterior median; the search ends when one length holds ``confidence``
    of the mass. An under-estimated p costs probes, never accuracy."""
    w = [0.0] + [1.0] * n
    for _ in range(max_probes):
        total = sum(w)
        best = max(range(1, n + 1), key=w.__getitem__)
        if w[best] / total >= confidence:
            return best
        # probe where the posterior CDF is nearest 1/2: the median or just below it
        acc, j, below = 0.0, n, 0.0
        for h in range(1, n + 1):
            prev = acc
            acc += w[h]
            if acc / total >= 0.5:
                j, below = h, prev / total
                break
        if j > 1 and 0.5 - below < acc / total - 0.5:
            j -= 1
        if await probe(j):
            for h in range(j + 1, n + 1):
                w[h] = 0.0
        else:
            q = 1.0 - p()
            for h in range(1, j + 1):
                w[h] *= q
    return max(range(1, n + 1), key=w.__getitem__)
