"""How reliable a reproducer is, stated the way syzkaller states it.

A bundle is handed to someone who will run it a handful of times, so its
rate matters as much as its size. This module holds the three judgements
the pipeline makes about rates:

* the **floor** (``--min-rate``, 0.15 as syzkaller's): a result whose
  confirm runs crash less often is reported, with its own exit code, and is
  never called a reproducer;
* the **shrink guard**: a cut inside the requests is kept only if it does not
  make the crash significantly rarer (Fisher's exact test, one-sided, on the
  runs before and after; shrinking can trade a reliable crash for a rare one,
  and "it still crashed once" says nothing about how often);
* the **reliable alternative**: where the minimal result crashes rarely, the
  smallest candidate the search saw crash that crashes at least
  ``--reliable-rate`` of its runs, both measured, with which to hand over.

And the list of every signature the bisect met, each with the fraction of
runs it ended.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from replayer.bisect.oracle import Candidate, Outcome, TrialRecord
from replayer.bisect.stats import describe_rate, fisher_one_sided, rate_dict

if TYPE_CHECKING:
    from replayer.bisect.state import Search

GUARD_RUNS = 8
"""Runs of each side before a cut is refused: at 8 against 8, a rate that
falls from 1.0 to 0.3 is refused 94% of the time (4 or fewer crashes of 8
against 8 of 8 is significant at 0.05). Fewer are run when the runs so far
already settle it."""

RELIABLE_CANDIDATES = 3
"""Larger candidates measured, at most, when looking for a reliable one."""


def _runs(b: Search, cand: Candidate) -> list[TrialRecord]:
    return [r for r in b.oracle.records.get(cand.key(), []) if r.outcome is not Outcome.INFRA]


def _tally(recs: list[TrialRecord]) -> tuple[int, int]:
    return sum(r.outcome is Outcome.MATCH for r in recs), len(recs)


async def keeps_rate(b: Search, before: Candidate, after: Candidate) -> tuple[bool, str]:
    """Is ``after`` (a cut of ``before`` that crashed at least once) not
    significantly rarer than ``before``? Runs are added one at a time, to
    the side with fewer, only while the answer is open: it is "keep" as soon
    as no outcome of the runs left (``before`` crashing on all, ``after`` on
    none) could make the difference significant, and "refuse" once both
    sides have :data:`GUARD_RUNS` and the difference is. A crash that struck
    on every run so far first asks ``after`` for that many crashes
    in a row (``--shrink-rate-runs``, 3: a 30 % crash does so 2.7 % of the
    time), which a rarer crash seldom gives; the first quiet run sends it to
    the full comparison instead."""
    stage = "shrink-rate"
    kb, nb = _tally(_runs(b, before))
    ka, na = _tally(_runs(b, after))
    steady = b.opts.shrink_rate_runs
    if nb > 0 and kb == nb and b.oracle.repeats() == 1:
        for _ in range(steady + b.oracle.infra_retries + 1):
            ka, na = _tally(_runs(b, after))
            if ka < na or na >= steady:
                break
            await b.oracle.run_many(
                after,
                min(steady - na, b.oracle.width),
                stage,
                until=lambda r: r.outcome not in (Outcome.MATCH, Outcome.INFRA),
            )
        if na and ka == na:
            return True, f"crashed {ka}/{na}"
    g = GUARD_RUNS
    for _ in range(2 * g + 2 * b.oracle.infra_retries + 2):  # bounded: one run a pass
        kb, nb = _tally(_runs(b, before))
        ka, na = _tally(_runs(b, after))
        # the most significant the comparison could still become
        could = fisher_one_sided(kb + max(0, g - nb), max(g, nb), ka, max(g, na))
        if could is None or could >= b.opts.alpha:
            break
        if nb >= g and na >= g:
            break
        await b.oracle.run_once(before if nb < g and nb <= na else after, stage)
    kb, nb = _tally(_runs(b, before))
    ka, na = _tally(_runs(b, after))
    # one-sided: P(before shows >= kb crashes if both crashed at one rate)
    p = fisher_one_sided(kb, nb, ka, na)
    text = f"{ka}/{na} after the cut against {kb}/{nb} before"
    if p is not None and p < b.opts.alpha and nb >= g and na >= g:
        return False, f"{text} (significantly rarer, p = {p:.3f})"
    return True, text + (f" (p = {p:.2f})" if p is not None else "")


def signatures_seen(b: Search) -> list[dict[str, Any]]:
    """Every failure signature the bisect met, the chased one first, each
    with how many runs it ended: over the whole search and over the confirm
    runs (the validation runs, where a fraction is a rate)."""
    hist = [r for r in b.oracle.history() if r.outcome is not Outcome.INFRA]
    confirm = [r for r in hist if r.stage == "confirm" and r.key == b.best.key()]
    seen: dict[tuple[str | None, str | None], dict[str, Any]] = {}
    for r in hist:
        if r.outcome not in (Outcome.MATCH, Outcome.OTHER_FAILURE):
            continue
        key = (r.failure_class, r.signature)
        e = seen.setdefault(
            key,
            {
                "signature": r.signature,
                "class": r.failure_class,
                "chased": r.outcome is Outcome.MATCH,
                "message": (str(r.message or "").strip().splitlines() or [""])[0][:200],
                "first_trial": r.trial,
                "runs": 0,
            },
        )
        e["runs"] += 1
    counts = Counter((r.failure_class, r.signature) for r in confirm)
    out = []
    for key, e in seen.items():
        e["of"] = len(hist)
        e["fraction"] = round(e["runs"] / len(hist), 4) if hist else 0.0
        if confirm:
            e["confirm"] = {"runs": counts.get(key, 0), "of": len(confirm)}
        out.append(e)
    out.sort(key=lambda e: (not e["chased"], -e["runs"]))
    return out


async def reliable_alternative(b: Search) -> dict[str, Any] | None:
    """Where the result's confirm rate is under ``reliable_rate``: the
    smallest superset of the result's requests that the search saw crash
    (replayed with the result's timing and edits) that crashes at least
    that often over ``confirm`` runs of its own (5 at least). At most
    :data:`RELIABLE_CANDIDATES` are measured, smallest first."""
    from replayer.bisect.confirm import confirm_counts

    k, n = confirm_counts(b)
    if not n or k / n >= b.opts.reliable_rate:
        return None
    best = b.best
    # positions the search saw crash, under the result's own timing and edit
    sets = {c.positions for c in b.oracle.matched if best.members < c.members}
    bigger = [replace(best, positions=ps) for ps in sorted(sets, key=len)]
    runs = max(b.opts.confirm, 5)
    for cand in bigger[:RELIABLE_CANDIDATES]:
        kc, nc = _tally(_runs(b, cand))
        for _ in range(runs + b.oracle.infra_retries + 1):  # bounded: one run a pass
            if nc >= runs or kc + (runs - nc) < b.opts.reliable_rate * runs:
                break  # measured, or it can no longer reach the rate: the next one
            await b.oracle.run_once(cand, "reliable")
            kc, nc = _tally(_runs(b, cand))
        if nc >= runs and kc / nc >= b.opts.reliable_rate:
            return {
                "positions": list(cand.positions),
                "requests": [b.ids[b.rows[p]] for p in cand.positions],
                "size": len(cand.positions),
                "reproduction": rate_dict(kc, nc),
            }
    return None


def hand_over(minimal: tuple[int, int], reliable: dict[str, Any] | None, floor: float) -> str:
    """Which bundle a kernel engineer should get, in one sentence."""
    k, n = minimal
    if reliable is None:
        if n and k / n < floor:
            return (
                f"the result {describe_rate(k, n)}, below the floor of {floor:.0%}: "
                "it is not a reproducer; rerun the bisect with more --calibrate runs"
            )
        return "the minimal requests"
    r = reliable["reproduction"]
    return (
        f"the reliable candidate ({reliable['size']} requests, {r['text']}): the minimal one "
        f"{describe_rate(k, n)} and would take many runs to show the crash once"
    )
