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

With ``width`` k > 1 (k servers free), each round of a prefix search probes
k lengths at once, evenly spread: a (k+1)-ary search of ``log(n)/log(k+1)``
rounds, each as long as its slowest probe. A probe made moot by another's
answer (longer than a crash, shorter than a quiet run) is cancelled: a
stopped trial is evidence of nothing. With k = 1 every engine takes exactly
the serial path.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from replayer._async import spawn

T = TypeVar("T")
X = TypeVar("X")
R = TypeVar("R")
Test = Callable[[tuple[T, ...]], Awaitable[bool]]


async def race(
    items: Sequence[X],
    run: Callable[[X], Awaitable[R]],
    moot: Callable[[X, R, X], bool] | None = None,
    *,
    limit: int | None = None,
) -> list[tuple[X, R]]:
    """``run(x)`` for every item, at most ``limit`` at once (default: all);
    when one finishes with r, every item y not finished with
    ``moot(x, r, y)`` is cancelled (or never started). The finished ones as
    (item, result), in the order they finished. Items may repeat (several
    runs of one candidate); with ``limit`` 1 they run in order, one by one."""
    if len(items) == 1 or limit == 1:
        out: list[tuple[X, R]] = []
        for x in items:
            if moot is not None and any(moot(y, r, x) for y, r in out):
                continue
            out.append((x, await run(x)))
        return out
    gate = asyncio.Semaphore(limit or len(items))

    async def gated(x: X) -> R:
        async with gate:
            return await run(x)

    tasks = {spawn(_call(gated, x), name="bisect-probe"): x for x in items}
    done_in_order: list[tuple[X, R]] = []
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in sorted(done, key=lambda t: list(tasks).index(t)):
                if t.cancelled():
                    continue
                x, r = tasks[t], t.result()
                done_in_order.append((x, r))
                if moot is None:
                    continue
                for other in list(pending):
                    if moot(x, r, tasks[other]):
                        other.cancel()
            if moot is not None:
                cancelled = [t for t in pending if t.cancelled() or t.cancelling()]
                if cancelled:
                    await asyncio.gather(*cancelled, return_exceptions=True)
                    pending -= set(cancelled)
    finally:
        left = [t for t in tasks if not t.done()]
        for t in left:
            t.cancel()
        if left:
            await asyncio.gather(*left, return_exceptions=True)
    return done_in_order


async def _call(run: Callable[[X], Awaitable[R]], x: X) -> R:
    return await run(x)


def width_of(runner: object) -> int:
    """Trials ``runner`` runs at once: its ``width`` (a pool's free servers), else 1."""
    return max(1, int(getattr(runner, "width", 1)))


def points(lo: int, hi: int, width: int) -> list[int]:
    """``width`` lengths evenly inside (lo, hi): the probes of one round of a
    (width+1)-ary search (the midpoint, floor, for width 1)."""
    k = max(1, min(width, hi - lo - 1))
    return sorted({lo + (hi - lo) * (i + 1) // (k + 1) for i in range(k)} - {lo, hi})


async def shortest_prefix(
    items: Sequence[T], pinned: tuple[T, ...], test: Test[T], *, width: int = 1
) -> int:
    """Smallest h >= 1 such that ``test(pinned + items[:h])``, given that
    ``pinned + items`` passes and ``pinned`` alone does not (or is not worth
    a trial). Binary search: ``ceil(log2 len(items))`` probes; with ``width``
    k, ``ceil(log(n) / log(k + 1))`` rounds of k probes at once."""
    lo, hi = 0, len(items)  # test(prefix hi) holds; prefix lo is taken to fail
    while hi - lo > 1:
        got = await race(
            points(lo, hi, width),
            lambda m: test(pinned + tuple(items[:m])),
            lambda m, crashed, other: other > m if crashed else other < m,
        )
        hi = min((m for m, crashed in got if crashed), default=hi)
        lo = max((m for m, crashed in got if not crashed and m < hi), default=lo)
    return hi


async def binary_prefix(
    n: int, run: Callable[[int], Awaitable[int | None]], *, width: int = 1
) -> tuple[int, int]:
    """:func:`shortest_prefix` for a search of one run per probe that learns
    from a crash where it struck: ``run(j)`` says the prefix length the run
    showed crashing (at most j), or None when it was quiet. Returns (lo, hi):
    prefix hi crashed, lo is the longest seen quiet (0: none). Raises
    :class:`Contradicted` when a crash lands at or below ``lo``."""
    lo, hi = 0, n
    for _ in range(2 * n.bit_length() + 2):  # each round halves or better
        if hi - lo <= 1:
            break
        got = await race(
            points(lo, hi, width),
            run,
            lambda m, at, other: other > m if at is not None else other < m,
        )
        crashes = [at for _, at in got if at is not None]
        if any(at <= lo for at in crashes):
            # a crash inside a prefix seen quiet: that quiet run was luck, the
            # crash is flaky, and a binary search's answer would ignore it
            raise Contradicted(min(crashes))
        hi = min([hi, *crashes])
        lo = max((m for m, at in got if at is None and m < hi), default=lo)
    return lo, hi


class Contradicted(Exception):
    """A one-run-per-probe search met a crash shorter than a prefix it had
    seen quiet: the crash is flaky there, and only a search that weighs every
    run (:func:`bayes_prefix`) can use both."""

    def __init__(self, at: int) -> None:
        super().__init__(f"a crash at {at} inside a prefix seen quiet")
        self.at = at


async def bisect_reduce(
    items: Sequence[T], pinned: tuple[T, ...], test: Test[T], *, width: int = 1
) -> tuple[T, ...]:
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
        h = await shortest_prefix(remaining, base, test, width=width)
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


def _gains(
    n: int, a: float, b: float, runs: list[tuple[int, bool]], choices: list[int], post: _Posterior
) -> dict[int, float]:
    """Each probe's expected entropy removed from the posterior."""
    h = post.entropy()
    return {j: h - _expected_entropy(n, a, b, runs, j, post) for j in choices}


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
    gain = _gains(n, a, b, runs, choices, post)
    top = max(gain.values())
    if crash_cost <= 1.0 or top <= 0:
        return max(choices, key=gain.__getitem__)
    equal = [j for j in choices if gain[j] >= (1 - EQUAL_INFORMATION) * top]
    return min(equal, key=post.p_crash)


def _pick_many(
    n: int,
    a: float,
    b: float,
    runs: list[tuple[int, bool]],
    choices: list[int],
    post: _Posterior,
    crash_cost: float,
    width: int,
) -> list[int]:
    """``width`` probes, the most informative first (the serial pick leads,
    so one free server takes the serial path). Near the end few lengths are
    worth a run: rather than leave servers idle, the best ones run twice
    (a flaky trigger's quiet runs are what a second run at its length
    overrules), up to :data:`REPEATS` runs a length a round."""
    first = _pick(n, a, b, runs, choices, post, crash_cost)
    gain = _gains(n, a, b, runs, choices, post)
    rest = sorted((j for j in choices if j != first), key=lambda j: (-gain[j], post.p_crash(j)))
    distinct = [first, *rest[: width - 1]]
    picked = list(distinct)
    for _ in range(REPEATS - 1):
        picked += distinct[: width - len(picked)]
    return picked


REPEATS = 2
"""Runs of one length in one round of a wide Bayesian prefix search."""


async def bayes_prefix(
    n: int,
    probe: Callable[[int], Awaitable[int | None]],
    seen: Sequence[tuple[int, bool]] = (),
    *,
    confidence: float = 0.99,
    max_probes: int = 1000,
    crash_cost: float = 1.0,
    width: int = 1,
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
    overruled, so the answer is never shorter than h*. With ``width`` k, each
    round runs the k most informative distinct probes at once."""
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

        if width <= 1:
            picked = [_pick(n, a, b, runs, sorted(choices), post, crash_cost)]
        else:
            picked = _pick_many(n, a, b, runs, sorted(choices), post, crash_cost, width)
        for j, at in await race(picked, probe):
            runs.append((j, False) if at is None else (min(at, j), True))
    return _Posterior(n, a, b, runs).mode()[0]
