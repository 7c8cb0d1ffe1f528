"""A whole bisect in-process: every stage against a fake runner.

``python -m bench bisect_fake [-- --repeats N]``

The scenario of ``tests/bisect/test_runner.py::test_every_stage_with_a_fake_runner``
(30 requests, a planted pair that crashes at 4x or slower; calibrate, cut,
prefix, sessions, turns, timing, confirm and a control): what the search,
the journal (fsynced per trial) and the bundle cost with no server at all.
The limit it is measured against is the issue's: under a second.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from replayer.bisect.pipeline import Control, run_bisect
from tests.helpers.bisect import PlantedPair, bisect, write_trace

LIMIT_S = 1.0


async def _once(d: Path) -> tuple[float, float, int]:
    trace = write_trace(d)
    b = bisect(trace, d / "b", PlantedPair(), control=Control("clean", PlantedPair(pair=("x",))))
    t0, c0 = time.perf_counter(), time.process_time()
    res = await run_bisect(b)
    return time.perf_counter() - t0, time.process_time() - c0, res.trials


def main(argv: list[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="bench bisect_fake")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    walls, cpus, trials = [], [], 0
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            wall, cpu, trials = asyncio.run(_once(Path(d)))
        walls.append(wall)
        cpus.append(cpu)
    med_wall, med_cpu = statistics.median(walls), statistics.median(cpus)
    print("| figure | value |\n|---|---|")
    print(f"| trials per bisect | {trials} |")
    print(f"| wall, median of {args.repeats} (min-max) | {med_wall:.3f} s "
          f"({min(walls):.3f}-{max(walls):.3f}) |")  # fmt: skip
    print(f"| CPU, median (min-max) | {med_cpu:.3f} s ({min(cpus):.3f}-{max(cpus):.3f}) |")
    print(f"| CPU / limit ({LIMIT_S:g} s) | {med_cpu / LIMIT_S:.2f} |")
    return {"trials": trials, "wall_s": walls, "cpu_s": cpus, "limit_s": LIMIT_S}
