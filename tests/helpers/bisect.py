"""What the bisect tests share: a small trace of sessions arriving in
rounds, the probes a binary search spends, and an emulator launch command
on a free port."""

from __future__ import annotations

import shlex
import sys

from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter
from tests.helpers.net import free_port

SESSIONS, TURNS = 6, 5


def write_trace(tmp_path) -> Trace:
    p = tmp_path / "t.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for t in range(TURNS):
            for s in range(SESSIONS):
                i = t * SESSIONS + s
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": f"s{s} turn {t}"}],
                    "max_tokens": 2,
                }
                w.add(
                    RequestRecord.from_body(
                        body,
                        request_id=f"s{s}-{t}",
                        session_id=f"s{s}",
                        turn=t,
                        start_us=i * 10_000,
                        end_us=i * 10_000 + 5_000,
                    )
                )
    return Trace.open(p)


def probes_of_binary_search(n: int, h_star: int) -> int:
    """The probes :func:`shortest_prefix` spends on n items when h* is the answer."""
    lo, hi, probes = 0, n, 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probes += 1
        lo, hi = (lo, mid) if mid >= h_star else (mid, hi)
    return probes


def emulator_cmd(*faults, extra=()):
    args = [
        sys.executable,
        "-m",
        "replayer.emulator",
        "--port",
        str(free_port()),
        "--speed",
        "instant",
        *extra,
    ]
    for f in faults:
        args += ["--fault", f]
    return shlex.join(args)
