"""Trace format figures (issue 2): storage against naive and ideal encodings,
import cost, and open/reconstruction speed on a multi-GB synthetic trace.

* bytes on disk for the whole kv-cache-tester corpus imported, against
  (a) JSONL of full request bodies (one compact body per line: exactly
  ``sum(body_bytes) + rows``; checked on a sample by expanding bodies) and
  (b) zstd of the unique content: per request, its source record with
  ``hash_ids`` cut to the ids it adds to the previous request of its session
  (what no encoding can avoid storing), compressed at the trace's level (3)
  and at level 19;
* wall time and peak RSS of ``replayer import kv-cache-tester`` (a child
  process, measured with ``wait4``);
* a >= 2 GB synthetic chat trace: time from ``Trace.open`` to the first
  reconstructed body, and reconstruction throughput in trace order.

Run: ``python -m bench trace_storage`` (``-- --quick`` for a 200 MB trace).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
CORPUS = Path(os.environ.get("REPLAYER_SHARED_DATA", REPO.parent / "shared" / "data")) / (
    "kv_cache_tester_claude_code"
)


def run_child(args: list[str]) -> tuple[float, int, str]:
    """Run a child; return (wall seconds, peak RSS bytes, stdout)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"bench child failed ({proc.returncode}): {' '.join(args)}\n{err}")
    return time.monotonic() - t0, usage.ru_maxrss * 1024, out


def unique_content() -> bytes:
    """JSONL of every source request with hash_ids cut to what it adds."""
    lines: list[bytes] = []

    def walk(reqs: list[dict[str, Any]]) -> None:
        prev: list[int] = []
        for r in reqs:
            if r.get("type") == "subagent":
                sub = {k: v for k, v in r.items() if k != "requests"}
                lines.append(orjson.dumps(sub))
                walk(r["requests"])
                continue
            ids = r["hash_ids"]
            n = len(prev) if ids[: len(prev)] == prev else 0
            rec = dict(r)
            rec["hash_ids"] = ids[n:]
            rec["keep"] = n
            lines.append(orjson.dumps(rec))
            prev = ids

    for path in sorted(CORPUS.iterdir()):
        with gzip.open(path) as f:
            doc = orjson.loads(f.read())
        head = {k: v for k, v in doc.items() if k != "requests"}
        lines.append(orjson.dumps(head))
        walk(doc["requests"])
    return b"\n".join(lines) + b"\n"


def zstd(data: bytes, level: int) -> int:
    return int(pa.Codec("zstd", level).compress(data).size)


def bench_kv(trace_path: Path) -> dict[str, Any]:
    trace_path.unlink(missing_ok=True)
    wall, rss, _ = run_child(
        [
            sys.executable,
            "-m",
            "replayer",
            "import",
            "kv-cache-tester",
            str(CORPUS),
            "-o",
            str(trace_path),
        ]
    )
    from replayer.trace import Trace

    t = Trace.open(trace_path)
    disk = trace_path.stat().st_size
    full_jsonl = sum(t.column("body_bytes")) + len(t)
    # spot-check the size column against real expansion
    for r in range(0, len(t), 4999):
        assert len(t.body_json(r)) == t.column("body_bytes")[r]
    uniq = unique_content()
    source_gz = sum(p.stat().st_size for p in CORPUS.iterdir())
    z3, z19 = zstd(uniq, 3), zstd(uniq, 19)
    return {
        "requests": len(t),
        "trace_bytes": disk,
        "full_body_jsonl_bytes": full_jsonl,
        "ratio_full_jsonl_over_trace": full_jsonl / disk,
        "unique_content_bytes": len(uniq),
        "zstd3_unique_bytes": z3,
        "zstd19_unique_bytes": z19,
        "ratio_trace_over_zstd3_unique": disk / z3,
        "ratio_trace_over_zstd19_unique": disk / z19,
        "source_gzip_bytes": source_gz,
        "import_seconds": wall,
        "import_peak_rss_bytes": rss,
    }


_RECONSTRUCT = """
import json, resource, sys, time
t0 = time.perf_counter()
from replayer.trace import Trace
t = Trace.open(sys.argv[1])
it = t.iter_json()
row, first = next(it)
t_first = time.perf_counter() - t0
limit, budget = int(sys.argv[2]), float(sys.argv[3])
n, nbytes, t1 = 1, len(first), time.perf_counter()
for row, body in it:
    n += 1
    nbytes += len(body)
    if n >= limit or time.perf_counter() - t1 > budget:
        break
dt = time.perf_counter() - t1
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
kb = lambda k: int(status[k].split()[0]) * 1024 if k in status else None
print(json.dumps({"open_to_first_body_s": t_first, "requests": n, "seconds": dt,
                  "bytes": nbytes, "rows_in_trace": len(t),
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "rss_anon": kb("RssAnon"), "rss_file": kb("RssFile")}))
"""


def bench_big(path: Path, quick: bool) -> dict[str, Any]:
    sessions = 1_400 if quick else 14_000
    if not path.exists():
        t0 = time.monotonic()
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        run_child(
            [
                sys.executable,
                "-m",
                "replayer",
                "synth",
                "--sessions",
                str(sessions),
                "--turns",
                "40",
                "--context",
                "200000",
                "--tools",
                "16",
                "--rate",
                "0.2",
                "--seed",
                "1",
                "-o",
                str(tmp),
            ]
        )
        tmp.rename(path)
        gen = time.monotonic() - t0
    else:
        gen = None
    from replayer.trace import Trace

    t = Trace.open(path)
    expanded = sum(t.column("body_bytes"))
    wall, rss, out = run_child([sys.executable, "-c", _RECONSTRUCT, str(path), "100000", "60"])
    r = json.loads(out)
    return {
        "trace_bytes": path.stat().st_size,
        "requests": len(t),
        "sessions": sessions,
        "expanded_bytes": expanded,
        "generate_seconds": gen,
        "open_to_first_body_ms": r["open_to_first_body_s"] * 1000,
        "reconstructed_requests": r["requests"],
        "reconstruct_requests_per_s": r["requests"] / r["seconds"],
        "reconstruct_mb_per_s": r["bytes"] / r["seconds"] / 1e6,
        "reconstruct_peak_rss_bytes": rss,
        "reconstruct_end_rss_anon_bytes": r["rss_anon"],
        "reconstruct_end_rss_file_bytes": r["rss_file"],
    }


def main(argv: list[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="bench trace_storage")
    ap.add_argument("--quick", action="store_true", help="200 MB synthetic trace instead of 2 GB")
    ap.add_argument("--skip-big", action="store_true")
    opts = ap.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    kv = bench_kv(OUT / "kv-cache-tester.arrow")
    mb = 1e6
    print("| kv-cache-tester corpus | value |\n|---|---|")
    print(f"| requests | {kv['requests']:,} |")
    print(f"| trace bytes | {kv['trace_bytes'] / mb:,.2f} MB |")
    print(
        f"| (a) full-body JSONL | {kv['full_body_jsonl_bytes'] / mb:,.0f} MB "
        f"(**{kv['ratio_full_jsonl_over_trace']:,.0f}x** the trace) |"
    )
    print(
        f"| (b) zstd-3 of unique content | {kv['zstd3_unique_bytes'] / mb:,.2f} MB "
        f"(trace is **{kv['ratio_trace_over_zstd3_unique']:.2f}x**) |"
    )
    print(
        f"| zstd-19 of unique content | {kv['zstd19_unique_bytes'] / mb:,.2f} MB "
        f"(trace is {kv['ratio_trace_over_zstd19_unique']:.2f}x) |"
    )
    print(f"| source .json.gz files | {kv['source_gzip_bytes'] / mb:,.2f} MB |")
    print(f"| import wall time | {kv['import_seconds']:.1f} s |")
    print(f"| import peak RSS | {kv['import_peak_rss_bytes'] / mb:,.0f} MB |")
    figures: dict[str, Any] = {"kv_cache_tester": kv}
    if not opts.skip_big:
        big = bench_big(
            OUT / ("synth-200mb.arrow" if opts.quick else "synth-2gb.arrow"), opts.quick
        )
        figures["synthetic"] = big
        print("\n| synthetic chat trace | value |\n|---|---|")
        print(
            f"| trace bytes | {big['trace_bytes'] / 1e9:,.2f} GB ({big['requests']:,} "
            f"requests, {big['sessions']:,} sessions) |"
        )
        print(f"| expanded bodies | {big['expanded_bytes'] / 1e9:,.0f} GB |")
        if big["generate_seconds"] is not None:
            print(f"| synth time | {big['generate_seconds']:.0f} s |")
        print(f"| open -> first reconstructed body | {big['open_to_first_body_ms']:.0f} ms |")
        print(
            f"| reconstruction | {big['reconstruct_requests_per_s']:,.0f} req/s, "
            f"{big['reconstruct_mb_per_s']:,.0f} MB/s of bodies |"
        )
        print(
            f"| reconstruction peak RSS | {big['reconstruct_peak_rss_bytes'] / 1e6:,.0f} MB "
            f"(at the end: {big['reconstruct_end_rss_anon_bytes'] / 1e6:,.0f} MB heap, "
            f"{big['reconstruct_end_rss_file_bytes'] / 1e6:,.0f} MB mapped trace pages) |"
        )
    return figures
