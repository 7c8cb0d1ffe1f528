"""The passes of a bisect, each over the best candidate so far (the pipeline's doc
lists them). A pass only asks the oracle and calls :meth:`Search.improve`:
it never runs a trial itself, so every pass is journaled, cached and
resumable the same way, whoever the runner is."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from replayer.bisect.oracle import Candidate, Outcome, TrialRecord
from replayer.bisect.runner import failure_rows, run_failure
from replayer.bisect.search import bisect_reduce, race
from replayer.bisect.stats import describe_rate, zero_upper
from replayer.replay.policy import Timing

if TYPE_CHECKING:
    from replayer.bisect.state import Search


class NotReproducible(Exception):
    """Calibration saw no crash of the full trace."""


async def calibrate(b: Search) -> None:
    """Replay the full selection until ``calibrate_matches`` matches or
    ``calibrate_runs`` runs (a round of runs on every free server): the
    first crash pins the chase, the rate sets how many quiet runs dismiss a
    candidate."""
    full = b.best
    o = b.opts
    for _ in range(o.calibrate_runs + o.calibrate_matches):
        c = b.oracle.counts(full)
        runs = c[Outcome.MATCH] + c[Outcome.PASS] + c[Outcome.OTHER_FAILURE] + c[Outcome.INVALID]
        if c[Outcome.MATCH] >= o.calibrate_matches or runs >= o.calibrate_runs:
            break
        if c[Outcome.INFRA] > 3:
            raise NotReproducible(
                "the target failed to launch or could not be reached repeatedly (see trials/)"
            )
        room, width = o.calibrate_runs - runs, b.oracle.width
        # on a pool a round runs on all servers but one (kept ready for the
        # next stage's first trial): the same rounds, and more runs before a
        # flaky crash can pass for certain (5/5 at p = 0.5 is 1 in 32, 7/7
        # 1 in 128)
        need = o.calibrate_matches - c[Outcome.MATCH]
        want = min(room, need if width == 1 else width if width == 2 else width - 1)
        await b.oracle.run_many(full, max(1, min(want, width)), "calibrate")
    c = b.oracle.counts(full)
    if not c[Outcome.MATCH]:
        runs = sum(c.values()) - c[Outcome.INFRA]
        others = f"; {len(b.oracle.bugs)} other failure(s) recorded" if b.oracle.bugs else ""
        raise NotReproducible(
            f"the full trace did not crash in {runs} run(s) (95% upper bound on the crash "
            f"rate {zero_upper(runs):.0%}){others}"
        )
    k, n = b.oracle.crash_rate()
    chased = " ".join(x for x in (b.chase.failure_class, b.chase.signature) if x)
    b.say(f"== calibrate: {describe_rate(k, n)}; chasing {chased or 'the first crash'}")


def first_match(b: Search) -> TrialRecord | None:
    """The first matching run of the current best (or of anything)."""
    for rec in b.oracle.history():
        if rec.outcome is Outcome.MATCH and rec.key == b.best.key():
            return rec
    return next((r for r in b.oracle.history() if r.outcome is Outcome.MATCH), None)


def failure_point(b: Search) -> tuple[int | None, list[int]]:
    """(1 + the last position sent by the failure, positions in flight then),
    from the first matching run of the current best."""
    rec = first_match(b)
    if rec is None:
        return None, []
    if rec.reached is None and rec.run:
        # journaled before failure points were: the run directory has them
        f = run_failure(b.out / rec.run)
        if f is not None:
            sent, inflight = failure_rows(b.out / rec.run, f)
            return b.reached(sent), b.positions_of(inflight)
    return rec.reached, rec.inflight


async def cut(b: Search) -> None:
    """Drop every request sent after the failure (one trial, no search)."""
    end, _ = failure_point(b)
    positions = b.best.positions
    if end is None:
        return
    kept = [p for p in positions if p < end]
    if not kept or len(kept) == len(positions):
        return
    cand = b.candidate(kept)
    if await b.oracle.test(cand, stage="cut"):
        b.improve(cand, "cut")


async def prefix(b: Search) -> None:
    """The shortest crashing prefix in trace order (the crash may come after
    its trigger, so the failure point is only an upper bound)."""
    items = list(b.best.positions)
    # One run per probe either way. Flaky: weighed by a posterior, which beats
    # r runs per probe. Deterministic so far: a binary search, re-checked where
    # it would have gone wrong had the crash been flaky at shorter lengths.
    steady = b.oracle.repeats(upto=b.oracle.mark("prefix")) == 1
    h = await b.oracle.flaky_prefix(
        len(items),
        lambda j: b.candidate(items[:j]),
        stage="prefix",
        binary_first=steady,
        recheck=b.opts.prefix_recheck,
        length_of=lambda reached: bisect_left(items, reached),
    )
    b.prefix_length = h
    b.improve(b.candidate(items[:h]), "prefix")


def session_order(b: Search, positions: Sequence[int], pinned: str) -> list[str]:
    """Other sessions, likely culprits first: named in the crash dump, in
    flight at the crash, then by how recently they sent a request."""
    last_seen: dict[str, int] = {}
    for p in positions:
        last_seen[b.session(p)] = p
    rank: dict[str, tuple[int, int]] = {
        s: (2, -last) for s, last in last_seen.items() if s != pinned
    }
    _, inflight = failure_point(b)
    for p in inflight:
        s = b.session(p)
        if s in rank:
            rank[s] = (1, rank[s][1])
    if b.signature is not None:
        suspects: Sequence[str] = b.signature.suspects
    else:
        rec = first_match(b)
        suspects = rec.suspects if rec else []
    ids = {b.ids[b.rows[p]]: p for p in positions}
    for rid in suspects:
        if rid in ids:
            s = b.session(ids[rid])
            if s in rank:
                rank[s] = (0, rank[s][1])
    return sorted(rank, key=rank.__getitem__)


async def sessions(b: Search) -> None:
    """The fewest sessions that still crash, the last request's pinned."""
    positions = list(b.best.positions)
    pinned = b.session(positions[-1])
    order = session_order(b, positions, pinned)
    by_session: dict[str, list[int]] = {}
    for p in positions:
        by_session.setdefault(b.session(p), []).append(p)

    async def probe(group: tuple[str, ...]) -> bool:
        return await b.test([p for s in group for p in by_session[s]], "sessions")

    kept = await bisect_reduce(order, (pinned,), probe, width=b.oracle.width)
    keep = {pinned, *kept}
    b.improve(b.candidate([p for p in positions if b.session(p) in keep]), "sessions")


async def turns(b: Search) -> None:
    """The fewest requests of those sessions, the last one pinned, newest first."""
    positions = list(b.best.positions)
    last = positions[-1]
    items = sorted(positions[:-1], reverse=True)

    async def probe(group: tuple[int, ...]) -> bool:
        return await b.test(group, "turns")

    kept = await bisect_reduce(items, (last,), probe, width=b.oracle.width)
    b.improve(b.candidate([last, *kept]), "turns")


async def timing(b: Search) -> None:
    """Faster replay (each speed-up, then ``asap``), kept only while the
    crash survives, and only if it then crashes on every run: every later
    run of the bundle is cheaper."""
    base = b.best
    if base.timing == Timing.ASAP.value:
        return  # nothing left to compress
    faster = [replace(base, speed=base.speed * f) for f in b.opts.speedups]
    # each speed-up at once on free servers; a speed-up that goes quiet makes
    # the faster ones moot (a crash that needs time to form stays gone)
    got = dict(
        await race(
            list(range(len(faster))),
            lambda i: b.oracle.test(faster[i], stage="timing"),
            lambda i, crashed, j: not crashed and j > i,
            limit=b.oracle.width,
        )
    )
    for i, cand in enumerate(faster):
        if not got.get(i):
            break
        b.improve(cand, "timing")
    if b.opts.try_asap and b.best.timing != Timing.ASAP.value:
        cand = replace(b.best, timing=Timing.ASAP.value)
        if await b.oracle.test(cand, stage="timing"):
            b.improve(cand, "timing")
    if b.best != base and not await reproduces(b, b.best, "timing"):
        # a faster replay changes the races a crash may need: one crash
        # does not trade away the timing that reproduced reliably
        b.say(
            f"== timing: {b.best.timing} at {b.best.speed:g}x did not crash on every "
            f"run; keeping {base.timing} at {base.speed:g}x"
        )
        b.best = base
        b.write_bundle("in_progress")


async def reproduces(b: Search, cand: Candidate, stage: str) -> bool:
    """``cand`` crashed on each of ``calibrate_matches`` (at least 2) runs of
    ``stage``; journaled runs count first, so a resumed bisect repeats none."""
    need = max(2, b.opts.calibrate_matches)
    for _ in range(2 * need):  # bounded: infrastructure failures do not count
        recs = b.stage_runs(cand, stage)
        if any(r.outcome is not Outcome.MATCH for r in recs):
            return False
        if len(recs) >= need:
            return True
        await b.oracle.run_many(
            cand,
            min(need - len(recs), b.oracle.width),
            stage,
            until=lambda r: r.outcome not in (Outcome.MATCH, Outcome.INFRA),
        )
    return False
