"""The last word on a result: N runs of it on the target (k/N with an
interval), and N on the control platform if there is one, so a reader can
tell "this crashes here" from "this crashes everywhere"."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import orjson

from replayer._files import read_jsonl
from replayer.bisect.oracle import Outcome
from replayer.bisect.runner import observed

if TYPE_CHECKING:
    from replayer.bisect.pipeline import Bisect


async def confirm(b: Bisect) -> None:
    """``opts.confirm`` runs of the best (journaled ones count), then the control's."""
    n = b.opts.confirm
    for _ in range(max(0, n - confirm_counts(b)[1])):
        await b.oracle.run_once(b.best, "confirm")
    if b.control is not None:
        await control_runs(b, n)


def confirm_counts(b: Bisect) -> tuple[int, int]:
    ok = b.stage_runs(b.best, "confirm")
    return sum(r.outcome is Outcome.MATCH for r in ok), len(ok)


async def control_runs(b: Bisect, n: int) -> None:
    """Runs on the control until it has ``n`` (``control.jsonl``, resumable).
    They are outside the oracle: the control's crashes must not steer the search."""
    assert b.control is not None and b.control_runner is not None
    done_path = b.out / "control.jsonl"
    done = read_jsonl(done_path)
    for i in range(len(done), n):
        trial = b.trial(b.best, i + 1, "control", b.out / f"control/{i + 1:03d}", replace(b.chase))
        obs = observed(await b.control_runner.run(trial))
        entry = {"run": i + 1, "outcome": obs.outcome.value, "failure_class": obs.failure_class}
        with done_path.open("ab") as f:
            f.write(orjson.dumps(entry) + b"\n")
        done.append(entry)
        b.say(f"control {b.control.name} {i + 1}/{n}: {obs.outcome.value}")


def control_counts(b: Bisect) -> tuple[int, int] | None:
    """(crashes, runs) on the control: any failure counts, the chased one or not."""
    path = b.out / "control.jsonl"
    if b.control is None or not path.exists():
        return None
    rows = read_jsonl(path)
    ok = [r for r in rows if r["outcome"] != "INFRA"]
    return sum(r["outcome"] in ("MATCH", "OTHER_FAILURE") for r in ok), len(ok)
