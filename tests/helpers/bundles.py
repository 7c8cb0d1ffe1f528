"""A small repro bundle made by code."""

from __future__ import annotations

import subprocess
import sys

from replayer.bundle.export import write_bundle
from replayer.trace import Trace
from replayer.trace.synth import SynthOptions, write_trace

MODEL = "moonshotai/Kimi-K3"


def make_bundle(tmp_path, policy=None):
    p = tmp_path / "t.arrow"
    write_trace(
        p, SynthOptions(sessions=2, turns=3, context=5_000, max_tokens=4, model=MODEL, seed=9)
    )
    t = Trace.open(p)
    return write_bundle(
        tmp_path / "bundle",
        trace=t,
        trace_sha256="x" * 64,
        rows=t.order,
        manifest={
            "policy": policy or {"timing": "asap", "speed": 1.0},
            "signature": None,
            "prefix_length": 6,
        },
        trials=[{"trial": 1}],
    )


def run_repro(bundle, url, *args):
    """A bundle's ``repro.py`` as a stranger runs it: ``-I -S`` (isolated, no
    site-packages: the standard library alone), from ``/``."""
    return subprocess.run(
        [sys.executable, "-I", "-S", str(bundle / "repro.py"), "--url", url, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
