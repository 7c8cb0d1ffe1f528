"""How long the command line takes to say what it does: ``replayer --help``
and ``replayer VERB --help`` against ``python -c pass`` in the same run.

``python -m bench cli_start [-- --rounds N]``

Each command is run N times (default 15) in a fresh interpreter, with
``-X importtime`` off and the bytecode cache warm (one unmeasured run
first); the figure is the median wall time, and the ratio is over the bare
interpreter's median measured in the same rounds, interleaved, so a busy
machine moves both. The target is 0.15 s for ``--help``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from typing import Any

TARGET_S = 0.15
COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "replayer --help": [sys.executable, "-m", "replayer", "--help"],
    "replayer bisect --help": [sys.executable, "-m", "replayer", "bisect", "--help"],
    "replayer replay --help": [sys.executable, "-m", "replayer", "replay", "--help"],
    "replayer import --help": [sys.executable, "-m", "replayer", "import", "--help"],
}


def _once(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main(argv: list[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench cli_start")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    for cmd in COMMANDS.values():
        _once(cmd)  # warm the bytecode cache
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, cmd in COMMANDS.items():
            times[name].append(_once(cmd))
    base = statistics.median(times["python -c pass"])
    out: dict[str, Any] = {"rounds": args.rounds, "target_s": TARGET_S}
    print(f"{'command':28s} {'median':>8s} {'max':>8s} {'- python':>9s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        out[name] = {"median_s": round(med, 4), "max_s": round(max(ts), 4)}
        print(f"{name:28s} {med:8.3f} {max(ts):8.3f} {med - base:9.3f}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
