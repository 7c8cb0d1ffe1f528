"""``replayer demo``: the main job on the embedded default (``make demo``).

Until the replay engine lands this synthesizes a small agent trace and
inspects it; later stages grow it into the full crash-bisect story."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the end-to-end demo on the built-in emulator")
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="where to write")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from replayer.trace import synth
    from replayer.trace.reader import Trace
    from replayer.trace.stats import inspect_trace, render_text

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "trace.arrow"
    opts = synth.SynthOptions(sessions=6, turns=8, context=24_000, seed=7)
    n = synth.write_trace(path, opts)
    print(f"synthesized {n} requests of {opts.sessions} agent sessions into {path}\n")
    print(render_text(inspect_trace(Trace.open(path))))
    return 0
