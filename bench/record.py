"""Recorder overhead (issue 7): what ``replayer record`` adds between an agent
and the server, measured in the same run as a direct connection.

Setup: one emulator (``--speed instant``: the server costs as little as it
can, so the proxy's share is as large as it can be), one ``replayer record``
subprocess in front of it recording everything into a trace, and an aiohttp
client in this process.

* **Latency** (concurrency 1, direct and proxied requests interleaved one by
  one so drift hits both alike): a non-streaming chat request (1 KB prompt,
  16 tokens) from send to last byte, and a streaming one (64 tokens, one SSE
  event per token) with the arrival time of every event since send. *Added*
  is the percentile of the proxied distribution minus the same percentile of
  the direct one, per request and per SSE chunk (send -> that chunk);
  "per-chunk relay" is the extra spacing between a stream's first and last
  event divided by its events.
* **Throughput** (closed loop, ``--concurrency`` workers for ``--duration``
  s, direct and proxied phases alternated ``--rounds`` times): requests/s
  (unary) and SSE events/s (streams), proxied relative to direct; once with
  all processes sharing the CPUs, once with the recorder pinned to a core of
  its own (emulator and client on another), as on a GPU host with cores to
  spare.
* **Recorder CPU** per proxied request (from ``/proc/PID/stat``), the figure
  that says what the proxy costs wherever it runs.
* **Before/after** (``--baseline DIR``): a second recorder run from another
  source tree (``DIR`` on ``PYTHONPATH``: a checkout of the version to
  compare with) in front of the same emulator, its requests interleaved
  with the others one by one, so both versions meet the same drift. The
  latency table gains its column; the trace bytes per row of each say what
  the batching costs on disk.

Run: ``python -m bench record`` (``-- --duration 1 --requests 200`` for a
shorter run; ``-- --baseline /path/to/old/checkout`` to compare). The
machine's other load shows up in every path alike, but not evenly: run it
on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from replayer.testing.emulator import EmulatorProcess, poll_until

ARGS = ["--speed", "instant", "--disable-uvicorn-access-log", "--stats-interval", "0"]
MODEL = "moonshotai/Kimi-K3"
UNARY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "x" * 1000}],
    "max_tokens": 16,
}
STREAM = UNARY | {"max_tokens": 64, "ignore_eos": True, "stream": True}


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Recorder:
    def __init__(self, upstream: str, out: Path, source: Path | None = None) -> None:
        """``source``: run the recorder of that source tree (``PYTHONPATH``)."""
        self.port_file = out.with_suffix(".port")
        cmd = [sys.executable, "-m", "replayer", "record", "--upstream", upstream]
        cmd += ["--listen", "127.0.0.1:0", "--port-file", str(self.port_file), "-o", str(out)]
        cmd += ["--progress", "0"]
        env = None
        if source is not None:  # first on sys.path: it runs from there, in there
            env = {**os.environ, "PYTHONPATH": str(source.resolve())}
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env, cwd=source)
        poll_until(
            lambda: self.port_file.exists() and self.port_file.read_text().endswith("\n"),
            30,
            what="the recorder's port",
        )
        self.url = f"http://127.0.0.1:{int(self.port_file.read_text())}"

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        return err


async def one(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[float]:
    """Send one request; [done] for JSON, event arrival times for SSE (s since send)."""
    t0 = time.perf_counter()
    marks: list[float] = []
    async with s.post(f"{url}/v1/chat/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}")
        if body.get("stream"):
            buf = b""
            async for data in r.content.iter_any():
                now = time.perf_counter() - t0
                buf += data
                n = buf.count(b"\n\n")
                if n:
                    marks += [now] * n
                    buf = buf[buf.rfind(b"\n\n") + 2 :]
        else:
            await r.read()
            marks.append(time.perf_counter() - t0)
    return marks


async def latency(urls: dict[str, str], n: int) -> dict[str, Any]:
    """Per kind, per path (``direct``, ``proxied``, maybe ``before``): the
    marks of ``n`` requests, the paths taking turns request by request."""
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as s:
        for url in urls.values():  # warm every connection
            for body in (UNARY, STREAM):
                await one(s, url, body)
        for name, body, count in (("unary", UNARY, n), ("stream", STREAM, max(20, n // 2))):
            runs: dict[str, list[list[float]]] = {path: [] for path in urls}
            for _ in range(count):
                for path, url in urls.items():
                    runs[path].append(await one(s, url, body))
            out[name] = runs
    return out


async def load(
    url: str, body: dict[str, Any], concurrency: int, duration: float
) -> dict[str, float]:
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as s:
        for _ in range(concurrency):
            await one(s, url, body)
        done = [0, 0]
        deadline = time.monotonic() + duration

        async def worker() -> None:
            while time.monotonic() < deadline:
                marks = await one(s, url, body)
                done[0] += 1
                done[1] += len(marks)

        t0 = time.monotonic()
        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(worker())
        wall = time.monotonic() - t0
    return {"requests_per_s": done[0] / wall, "chunks_per_s": done[1] / wall, "requests": done[0]}


def summarize(runs: dict[str, list[list[float]]], via: str = "proxied") -> dict[str, float]:
    """Path ``via`` against the direct one."""
    runs = {"direct": runs["direct"], "proxied": runs[via]}
    ms = 1000.0
    d = [r[-1] for r in runs["direct"]]
    p = [r[-1] for r in runs["proxied"]]
    f: dict[str, float] = {
        "direct_p50_ms": pct(d, 50) * ms,
        "direct_p99_ms": pct(d, 99) * ms,
        "proxied_p50_ms": pct(p, 50) * ms,
        "proxied_p99_ms": pct(p, 99) * ms,
    }
    f["added_p50_ms"] = f["proxied_p50_ms"] - f["direct_p50_ms"]
    f["added_p99_ms"] = f["proxied_p99_ms"] - f["direct_p99_ms"]
    if len(runs["direct"][0]) > 1:
        dc = [t for r in runs["direct"] for t in r]
        pc = [t for r in runs["proxied"] for t in r]
        f["chunk_added_p50_ms"] = (pct(pc, 50) - pct(dc, 50)) * ms
        f["chunk_added_p99_ms"] = (pct(pc, 99) - pct(dc, 99)) * ms
        first_d = [r[0] for r in runs["direct"]]
        first_p = [r[0] for r in runs["proxied"]]
        f["first_chunk_added_p50_ms"] = (pct(first_p, 50) - pct(first_d, 50)) * ms
        spread_d = statistics.median((r[-1] - r[0]) / (len(r) - 1) for r in runs["direct"])
        spread_p = statistics.median((r[-1] - r[0]) / (len(r) - 1) for r in runs["proxied"])
        f["relay_added_per_chunk_us"] = (spread_p - spread_d) * 1e6
        f["events_per_stream"] = statistics.median(len(r) for r in runs["direct"])
    return f


def pin(pid: int, cpus: set[int]) -> bool:
    try:
        os.sched_setaffinity(pid, cpus)
        return True
    except (AttributeError, OSError):
        return False


def own_cpu_seconds() -> float:
    """CPU seconds of this process (the client)."""
    t = os.times()
    return t.user + t.system


CpuTally = dict[str, dict[str, dict[str, float]]]
"""kind -> path -> {"requests", "client", "emulator", "recorder"} (CPU seconds)."""


def throughput(
    direct: str, rec: Recorder, emu_pid: int, args: argparse.Namespace
) -> tuple[dict[str, dict[str, list[float]]], CpuTally]:
    """Closed-loop phases, direct and proxied alternated ``rounds`` times per
    kind (ABBA order, so neither path always runs first); the CPU each
    process spent in each phase."""
    thr: dict[str, dict[str, list[float]]] = {}
    cpu: CpuTally = {}
    procs: dict[str, Callable[[], float]] = {
        "client": own_cpu_seconds,
        "emulator": lambda: cpu_seconds(emu_pid),
        "recorder": lambda: cpu_seconds(rec.proc.pid),
    }
    for kind, body in (("unary", UNARY), ("stream", STREAM)):
        thr[kind] = {"direct": [], "proxied": []}
        cpu[kind] = {p: dict.fromkeys(("requests", *procs), 0.0) for p in ("direct", "proxied")}
        key = "requests_per_s" if kind == "unary" else "chunks_per_s"
        for i in range(args.rounds):
            order = [("direct", direct), ("proxied", rec.url)]
            for path, url in order[:: -1 if i % 2 else 1]:
                c0 = {name: f() for name, f in procs.items()}
                r = asyncio.run(load(url, body, args.concurrency, args.duration))
                thr[kind][path].append(r[key])
                tally = cpu[kind][path]
                tally["requests"] += r["requests"]
                for name, f in procs.items():
                    tally[name] += f() - c0[name]
    return thr, cpu


def cpu_per_request(cpu: CpuTally) -> dict[str, dict[str, dict[str, float]]]:
    """CPU µs per request, per kind, path and process."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind, paths in cpu.items():
        out[kind] = {}
        for path, t in paths.items():
            n = max(1.0, t["requests"])
            out[kind][path] = {k: v / n * 1e6 for k, v in t.items() if k != "requests"}
    return out


def cpu_ceiling(per: dict[str, dict[str, float]]) -> float:
    """The proxied/direct throughput ratio the CPU allows when every core is busy:
    direct costs client + emulator per request, proxied that plus the recorder."""
    d, p = per["direct"], per["proxied"]
    return (d["client"] + d["emulator"]) / (p["client"] + p["emulator"] + p["recorder"])


def ratios(t: dict[str, dict[str, list[float]]]) -> dict[str, float]:
    return {k: statistics.mean(v["proxied"]) / statistics.mean(v["direct"]) for k, v in t.items()}


def means(t: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    return {k: {p: statistics.mean(v) for p, v in d.items()} for k, d in t.items()}


def main(argv: list[str]) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench record")
    p.add_argument("--requests", type=int, default=400, help="latency samples per kind and path")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per throughput phase")
    p.add_argument("--rounds", type=int, default=3, help="direct/proxied alternations per kind")
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="also measure the recorder of this source tree (latency, trace bytes per row)",
    )
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="replayer-bench-record-"))
    emu = EmulatorProcess(ARGS, request_log=False).start()
    trace = tmp / "bench.arrow"
    rec = Recorder(emu.url, trace)
    before: Recorder | None = None
    before_trace = tmp / "before.arrow"
    try:
        urls = {"direct": emu.url, "proxied": rec.url}
        if args.baseline is not None:
            before = Recorder(emu.url, before_trace, args.baseline)
            urls["before"] = before.url
        lat = asyncio.run(latency(urls, args.requests))
        unary, stream = summarize(lat["unary"]), summarize(lat["stream"])
        old: dict[str, dict[str, float]] = {}
        thr, cpu = throughput(emu.url, rec, emu.pid, args)
        old_thr: dict[str, dict[str, list[float]]] = {}
        old_cpu: CpuTally = {}
        if before is not None:
            old = {k: summarize(lat[k], "before") for k in ("unary", "stream")}
            # its own direct phases: each ratio is against the drift it met
            old_thr, old_cpu = throughput(emu.url, before, emu.pid, args)
            before.stop()
        own: dict[str, dict[str, list[float]]] = {}
        ncpu = os.cpu_count() or 1
        if ncpu >= 2 and pin(emu.pid, {0}) and pin(0, {0}) and pin(rec.proc.pid, {1}):
            # the recorder on a core of its own: what it costs a pipeline that
            # is not short of CPU (a GPU server has cores to spare). NOT like
            # for like: direct runs on one core here, proxied on two.
            own, _ = throughput(emu.url, rec, emu.pid, args)
            for pid in (emu.pid, 0, rec.proc.pid):
                pin(pid, set(range(ncpu)))
        err = rec.stop()
    finally:
        for live in (rec, before):
            if live is not None and live.proc.poll() is None:
                live.proc.kill()
        emu.stop()
    size = trace.stat().st_size
    from replayer.trace.reader import Trace

    rows = len(Trace.open(trace))
    before_rows = len(Trace.open(before_trace)) if before is not None else 0
    before_size = before_trace.stat().st_size if before is not None else 0
    ratio = ratios(thr)
    per = cpu_per_request(cpu)
    proxied_requests = sum(t["proxied"]["requests"] for t in cpu.values())
    rec_s = sum(t["proxied"]["recorder"] for t in cpu.values())
    figures: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "unary": unary,
        "stream": stream,
        "throughput": means(thr),
        "throughput_ratio": ratio,
        "throughput_recorder_own_core": means(own) if own else None,
        "throughput_ratio_recorder_own_core": ratios(own) if own else None,
        "recorder_cpu_s": rec_s,
        "recorder_cpu_us_per_request": rec_s / max(1, proxied_requests) * 1e6,
        "cpu_us_per_request": per,
        "cpu_ceiling_ratio": {kind: cpu_ceiling(p) for kind, p in per.items()},
        "trace_rows": rows,
        "trace_bytes": size,
        "before": {
            "source": str(args.baseline),
            "unary": old["unary"],
            "stream": old["stream"],
            "throughput": means(old_thr),
            "throughput_ratio": ratios(old_thr),
            "cpu_us_per_request": cpu_per_request(old_cpu),
            "trace_rows": before_rows,
            "trace_bytes": before_size,
        }
        if before is not None
        else None,
        "recorder_stderr_tail": err.strip().splitlines()[-1:] if err else [],
    }
    if old:
        print(
            f"| concurrency 1, {args.requests} requests each | direct | via recorder "
            "| added | via the baseline recorder | added |"
        )
        print("|---|---|---|---|---|---|")
    else:
        print(f"| concurrency 1, {args.requests} requests each | direct | via recorder | added |")
        print("|---|---|---|---|")
    for label, f, kind, o in (
        ("non-streaming", unary, "request", old.get("unary")),
        ("streaming, to the last event", stream, "request", old.get("stream")),
    ):
        for q in ("p50", "p99"):
            line = (
                f"| {kind} latency {q}, {label} | {f[f'direct_{q}_ms']:.2f} ms "
                f"| {f[f'proxied_{q}_ms']:.2f} ms | {f[f'added_{q}_ms']:+.2f} ms |"
            )
            if o is not None:
                line += f" {o[f'proxied_{q}_ms']:.2f} ms | {o[f'added_{q}_ms']:+.2f} ms |"
            print(line)
    print(
        f"| per SSE chunk (send to that chunk), p50 / p99 | | | "
        f"{stream['chunk_added_p50_ms']:+.2f} / {stream['chunk_added_p99_ms']:+.2f} ms |"
    )
    print(
        f"| first SSE chunk p50 / relay spacing per chunk | | | "
        f"{stream['first_chunk_added_p50_ms']:+.2f} ms / "
        f"{stream['relay_added_per_chunk_us']:+.1f} µs |"
    )
    print()
    head = f"closed loop, c={args.concurrency}, {args.duration:g} s x {args.rounds}"
    print(f"| {head} | direct | via recorder | ratio |\n|---|---|---|---|")
    phases = [("all processes share the CPUs", thr)]
    if own:
        # direct gets one core, proxied two: how the recorder does with spare
        # CPU, not a like-for-like comparison
        phases.append(("recorder on a core of its own, direct on one core: not like for like", own))
    if old_thr:
        phases.append(("the baseline recorder, all processes share the CPUs", old_thr))
    for where, t in phases:
        m, r = means(t), ratios(t)
        print(
            f"| non-streaming requests/s ({where}) | {m['unary']['direct']:,.0f} "
            f"| {m['unary']['proxied']:,.0f} | {r['unary']:.0%} |"
        )
        print(
            f"| streaming SSE events/s ({where}) | {m['stream']['direct']:,.0f} "
            f"| {m['stream']['proxied']:,.0f} | {r['stream']:.0%} |"
        )
    print()
    print("| CPU µs per request (processes sharing the CPUs) | client | emulator | recorder |")
    print("|---|---|---|---|")
    for kind, paths in per.items():
        for path, us in paths.items():
            rec_us = f"{us['recorder']:,.0f}" if path == "proxied" else "-"
            print(f"| {kind}, {path} | {us['client']:,.0f} | {us['emulator']:,.0f} | {rec_us} |")
    for kind, paths in cpu_per_request(old_cpu).items():
        us = paths["proxied"]
        print(
            f"| {kind}, via the baseline recorder | {us['client']:,.0f} "
            f"| {us['emulator']:,.0f} | {us['recorder']:,.0f} |"
        )
    print()
    print("| throughput ratio the CPU allows (every core busy) | value |\n|---|---|")
    for kind, paths in per.items():
        print(
            f"| {kind}: (client + emulator) direct / (client + emulator + recorder) proxied "
            f"| {cpu_ceiling(paths):.0%} |"
        )
    print()
    cpu_us = figures["recorder_cpu_us_per_request"]
    print("| recorder | value |\n|---|---|")
    print(f"| CPU per proxied request (non-streaming and 64-event streams) | {cpu_us:,.0f} µs |")
    per_row = size / max(1, rows)
    print(f"| rows recorded / trace bytes | {rows:,} / {size:,} ({per_row:,.0f} a row) |")
    if before is not None:
        print(
            f"| baseline recorder: rows / trace bytes | {before_rows:,} / {before_size:,} "
            f"({before_size / max(1, before_rows):,.0f} a row) |"
        )
    print(f"| CPUs on this machine | {os.cpu_count()} |")
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
