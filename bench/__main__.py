"""``python -m bench [NAME ...] [-- ARGS]``: run benchmarks (all by default)."""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

BENCHES = (
    "trace_storage", "emulator", "record", "replay", "bisect", "serve", "realvllm", "wire",
    "integrity", "bisect_fake", "agent_kinds", "wire_speed", "cli_start", "pool_sim",
    "idle_conns",
)  # fmt: skip
ON_REQUEST = ("loaded", "aiperf_inputs", "install_size")
"""Run only when named: they take the whole machine for most of an hour, or
(``install_size``) download the dependencies from the package index."""
OUT = Path(__file__).resolve().parent / "out"


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    names = argv or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES + ON_REQUEST]
    if unknown:
        print(
            f"bench: unknown benchmark(s) {', '.join(unknown)}; "
            f"have {', '.join(BENCHES + ON_REQUEST)}",
            file=sys.stderr,
        )
        return 2
    OUT.mkdir(exist_ok=True)
    for name in names:
        t0 = time.monotonic()
        print(f"## {name}\n", flush=True)
        figures = importlib.import_module(f"bench.{name}").main(extra)
        figures["_seconds"] = round(time.monotonic() - t0, 1)
        (OUT / f"{name}.json").write_text(json.dumps(figures, indent=2) + "\n")
        print(flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
