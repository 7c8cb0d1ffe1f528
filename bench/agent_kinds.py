"""Storage of agent-native sessions: one 200-turn session whose last request
carries a 100K-token context, in each API (``replayer synth --api``).

``python -m bench agent_kinds``

The peer is what a tool that stores whole bodies writes: the JSONL of every
request's full body (AIPerf's ``inputs.json`` and raw payloads, and replayer's
own ``raw`` kind before schema v3), measured on the same session; and the
same bodies stored as ``raw`` rows (how replayer kept Messages and Responses
bodies before v3: whole, zstd-compressed). The target (issue 15) is a trace
at least 50x smaller than that JSONL for Messages.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from replayer.options.trace import SynthApi
from replayer.trace.model import TraceMeta
from replayer.trace.reader import Trace
from replayer.trace.schema import Kind
from replayer.trace.synth import APIS, SynthOptions, write_trace
from replayer.trace.writer import TraceWriter

TARGET = 50.0
REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("REPLAYER_SHARED_DATA", REPO.parent / "shared" / "data"))
REAL = DATA / "tau2_bench" / "telecom_gpt-4o_agent_gpt-4o_user_2025-08-10.json.gz"
"""Real text (synth's filler compresses far better than prose): the τ²-bench
sessions, chat rows against the same bodies as raw rows."""


def as_raw(t: Trace, out: Path) -> int:
    """Bytes of ``t``'s bodies written whole, one raw row each."""
    with TraceWriter(out, TraceMeta(source="bench"), form="file") as w:
        for row in t.order:
            rec = t.record(row, None)
            w.add(dataclasses.replace(rec, kind=Kind.RAW, params=t.body(row), content=None))
    return out.stat().st_size


def real_text(tmp: Path) -> dict[str, Any] | None:
    if not REAL.exists():
        print(f"real text: {REAL} not found, skipped")
        return None
    path = tmp / "tau2.arrow"
    cmd = [sys.executable, "-m", "replayer", "import", "tau2-bench", str(REAL), "-o", str(path)]
    subprocess.run(cmd, check=True, capture_output=True)
    t = Trace.open(path)
    jsonl = sum(len(body) + 1 for _, body in t.iter_json())
    delta, raw = path.stat().st_size, as_raw(t, tmp / "tau2-raw.arrow")
    return {
        "source": REAL.name,
        "requests": len(t),
        "sessions": len(set(t.column("session_id"))),
        "trace_bytes": delta,
        "jsonl_bytes": jsonl,
        "ratio": round(jsonl / delta, 1),
        "raw_rows_bytes": raw,
        "ratio_vs_raw_rows": round(raw / delta, 1),
    }


def measure(api: str, tmp: Path) -> dict[str, Any]:
    o = SynthOptions(sessions=1, turns=200, context=100_000, api=SynthApi(api), seed=1)
    path = tmp / f"{api}.arrow"
    t0 = time.perf_counter()
    write_trace(path, o)
    wrote = time.perf_counter() - t0
    t = Trace.open(path)
    t0 = time.perf_counter()
    jsonl = sum(len(body) + 1 for _, body in t.iter_json())
    read = time.perf_counter() - t0
    trace_bytes = path.stat().st_size
    raw_bytes = as_raw(t, tmp / f"{api}-raw.arrow")
    return {
        "requests": len(t),
        "final_context_tokens": t.column("input_tokens")[t.order[-1]],
        "trace_bytes": trace_bytes,
        "jsonl_bytes": jsonl,
        "ratio": round(jsonl / trace_bytes, 1),
        "raw_rows_bytes": raw_bytes,
        "ratio_vs_raw_rows": round(raw_bytes / trace_bytes, 1),
        "write_s": round(wrote, 3),
        "read_all_bodies_s": round(read, 3),
    }


def main(argv: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"target_ratio": TARGET}
    with tempfile.TemporaryDirectory() as d:
        for api in APIS:
            m = measure(api, Path(d))
            out[api] = m
            print(
                f"{api:9s}  {m['requests']} requests, last {m['final_context_tokens']:,} tokens: "
                f"trace {m['trace_bytes'] / 1e6:.2f} MB vs JSONL {m['jsonl_bytes'] / 1e6:.1f} MB "
                f"= {m['ratio']}x smaller (target {TARGET:g}x); as raw rows "
                f"{m['raw_rows_bytes'] / 1e6:.2f} MB ({m['ratio_vs_raw_rows']}x); "
                f"write {m['write_s']} s, read {m['read_all_bodies_s']} s"
            )
        r = real_text(Path(d))
        if r is not None:
            out["real_text_chat"] = r
            print(
                f"real text  {r['requests']} requests in {r['sessions']} τ²-bench sessions: "
                f"trace {r['trace_bytes'] / 1e6:.2f} MB vs JSONL {r['jsonl_bytes'] / 1e6:.1f} MB "
                f"= {r['ratio']}x; as raw rows {r['raw_rows_bytes'] / 1e6:.2f} MB "
                f"({r['ratio_vs_raw_rows']}x)"
            )
    return out
