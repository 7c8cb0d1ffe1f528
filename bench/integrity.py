"""What reading a trace before replaying it costs: ``Trace.verify``.

``python -m bench integrity``

Every command that replays a trace first reads the selection (decode, match
digests, rebuild each body) so that nothing is sent from a damaged file. The
peer is the replay's own read: every body of the trace built once, in trace
order, as ``export`` and a replay do (``Trace.iter_json``). Measured on the
kv-cache-tester Claude Code corpus (49k requests, imported here to v2) and
on the sample trace.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from replayer.trace.reader import Trace

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("REPLAYER_SHARED_DATA", REPO.parent / "shared" / "data")) / (
    "kv_cache_tester_claude_code"
)


def _time(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(path: Path) -> dict[str, Any]:
    t = Trace.open(path)
    opened = _time(lambda: Trace.open(path))
    batches = _time(lambda: Trace.open(path).verify(bodies=False))
    full = _time(lambda: Trace.open(path).verify())
    read = _time(lambda: sum(len(b) for _, b in Trace.open(path).iter_json()))
    return {
        "requests": len(t),
        "bytes": path.stat().st_size,
        "open_s": round(opened, 3),
        "verify_batches_s": round(batches, 3),
        "verify_bodies_s": round(full, 3),
        "read_all_bodies_s": round(read, 3),
        "verify_over_read": round(full / read, 2) if read else None,
    }


def main(argv: list[str]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        traces = {"agents-8x10 (sample, v1)": REPO / "traces" / "agents-8x10.arrow"}
        if CORPUS.exists():
            kv = Path(d) / "kv.arrow"
            subprocess.run(
                [sys.executable, "-m", "replayer", "import", "kv-cache-tester", str(CORPUS),
                 "-o", str(kv)],
                check=True, capture_output=True,
            )  # fmt: skip
            traces["kv-cache-tester (v2)"] = kv
        print("| trace | requests | open | verify batches | verify + bodies | read every body "
              "(peer) | verify / read |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for name, path in traces.items():
            f = measure(path)
            figures[name] = f
            print(
                f"| {name} | {f['requests']:,} | {f['open_s']:.2f} s | "
                f"{f['verify_batches_s']:.2f} s | {f['verify_bodies_s']:.2f} s | "
                f"{f['read_all_bodies_s']:.2f} s | {f['verify_over_read']}x |"
            )
    return figures
