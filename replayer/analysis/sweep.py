"""``replayer sweep``: one trace at several concurrency limits, one compare table.

The A/B questions of one platform (fp8 KV cache on or off, model runner V1
against V2, speculative decoding) are asked at concurrency 1 to 16. A sweep
replays the same selection with ``--max-inflight`` set to each value in
turn, each into its own run directory ``OUT/inflight-N`` (complete run
directories: ``replayer report`` works on each), then compares them all
against the first value (:mod:`replayer.analysis.compare`), written to
``OUT/compare.json``.

The points run one after another against the same server(s): the prefix
cache carries over from one point to the next, as it would in production
traffic; restart the server between sweeps for cold-cache numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from replayer.analysis.compare import CompareOptions, compare_runs
from replayer.replay.run import EXIT_UNREACHABLE
from replayer.session import Session


def point_dir(out: Path, n: int) -> Path:
    return out / f"inflight-{n}"


async def sweep(
    session: Session,
    values: Sequence[int],
    out: Path,
    *,
    progress: bool = False,
    command: list[str] | None = None,
    opts: CompareOptions | None = None,
    say: Any = None,
) -> dict[str, Any]:
    """Replay the session's selection against its endpoints at each
    ``max_inflight`` value, then compare (baseline: the first)."""
    runs: list[Path] = []
    for n in values:
        run_dir = point_dir(out, n)
        run_dir.mkdir(parents=True, exist_ok=False)
        res = await session.replay(
            run_dir,
            policy=replace(session.policy, max_inflight=n),
            progress=progress,
            command=command,
        )
        if say is not None:
            say(f"sweep: max-inflight {n}: exit {res.exit_code} -> {run_dir}")
        if res.exit_code == EXIT_UNREACHABLE:
            return {"runs": [str(r) for r in runs], "groups": [], "unreachable": str(
                res.summary.get("unreachable"))}  # fmt: skip
        runs.append(run_dir)
    result = compare_runs(runs, labels=[f"inflight={n}" for n in values[: len(runs)]], opts=opts)
    result["sweep"] = {"max_inflight": list(values[: len(runs)])}
    tmp = out / ".compare.json.tmp"
    tmp.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    tmp.replace(out / "compare.json")
    return result
