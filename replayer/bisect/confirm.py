"""The last word on a result: N runs of it on the target (k/N with an
interval), and N on the control platform if there is one, so a reader can
tell "this crashes here" from "this crashes everywhere"."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING

import orjson

from replayer._files import append_records, read_jsonl
from replayer.bisect.oracle import Outcome
from replayer.bisect.runner import observed
from replayer.bisect.search import race, width_of
from replayer.bisect.stats import repeats_for

if TYPE_CHECKING:
    from replayer.bisect.state import Search


async def confirm(b: Search) -> None:
    """``opts.confirm`` runs of the best (journaled ones count) on the
    target's servers, beside as many on the control's."""
    n = b.opts.confirm

    async def target() -> None:
        for _ in range(n + b.oracle.infra_retries + 1):  # bounded: INFRA runs do not count
            left = n - confirm_counts(b)[1]
            if left <= 0:
                return
            await b.oracle.run_many(b.best, min(left, b.oracle.width), "confirm")

    if b.control is None:
        await target()
        return
    await asyncio.gather(target(), control_runs(b, n))


REVISIT_MAX = 64
"""Requests a revisit tries to drop at most (latest first)."""


async def revisit(b: Search) -> bool:
    """A flaky result may still hold requests the search dropped nothing for:
    a sub-candidate dismissed after quiet runs its own rate made likely (at
    p = 0.5 one quiet run dismisses a crashing candidate half the time).
    Once the confirm runs have measured the result's own rate, each request
    but the crashing last is left out in turn, latest first, and kept out
    if the rest crashes within the runs that rate needs (95%). A
    deterministic result (every confirm run crashed) is final as it is.
    True when the result got smaller."""
    k, n = confirm_counts(b)
    if n == 0 or k in (0, n):
        return False
    runs = repeats_for(k / n)
    kept = list(b.best.positions)
    changed = False
    order = list(reversed(kept[:-1]))[:REVISIT_MAX]
    for i, p in enumerate(order):
        b.revisit_left = (len(order) - i, runs)
        without = b.candidate([q for q in kept if q != p])
        # as many at once as there are servers; the first crash stops the rest
        recs = await b.oracle.run_many(
            without, runs, "revisit", until=lambda r: r.outcome is Outcome.MATCH
        )
        if any(r.outcome is Outcome.MATCH for r in recs):
            kept = list(without.positions)
            b.improve(without, "revisit")
            changed = True
    b.revisit_left = (0, 0)
    if changed:
        b.say(f"== revisit: {len(kept):,} requests (each left out {runs} run(s) at most)")
    return changed


def confirm_counts(b: Search) -> tuple[int, int]:
    ok = b.stage_runs(b.best, "confirm")
    return sum(r.outcome is Outcome.MATCH for r in ok), len(ok)


async def control_runs(b: Search, n: int) -> None:
    """Runs on the control until it has ``n`` (``control.jsonl``, resumable),
    as many at once as the control has servers. They are outside the oracle:
    the control's crashes must not steer the search."""
    assert b.control is not None and b.control_runner is not None
    runner, control = b.control_runner, b.control
    done_path = b.out / "control.jsonl"
    done = read_jsonl(done_path)

    async def one(i: int) -> None:
        trial = b.trial(b.best, i + 1, "control", b.out / f"control/{i + 1:03d}", replace(b.chase))
        obs = observed(await runner.run(trial))
        entry = {"run": i + 1, "outcome": obs.outcome.value, "failure_class": obs.failure_class}
        append_records(done_path, [orjson.dumps(entry) + b"\n"])
        b.say(f"control {control.name} {i + 1}/{n}: {obs.outcome.value}")

    await race(list(range(len(done), n)), one, limit=width_of(runner))


def control_counts(b: Search) -> tuple[int, int] | None:
    """(crashes, runs) on the control: any failure counts, the chased one or not."""
    path = b.out / "control.jsonl"
    if b.control is None or not path.exists():
        return None
    rows = read_jsonl(path)
    ok = [r for r in rows if r["outcome"] != "INFRA"]
    return sum(r["outcome"] in ("MATCH", "OTHER_FAILURE") for r in ok), len(ok)
