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
