"""Replay engine figures (issue 4), side by side with AIPerf 0.13.0, against
the emulator in ``--speed instant``.

1. **Client choice**: the hot path (POST a prebuilt body, read the SSE
   stream, decode it with replayer's own ``SSEDecoder``/``ChatAccumulator``) in
   aiohttp and in httpx, closed loop, each in a child pinned to one core:
   requests/s with 2-token streams, SSE chunks/s with 256-token streams.
2. **Schedule lag** at 200, 1,000 and 3,000 req/s offered (open loop: one
   single-turn session per request, fixed spacing, 2 output tokens, a
   ~3-token prompt). replayer runs the Arrow trace; AIPerf runs the same
   trace exported with ``replayer export --format aiperf`` under
   ``--custom-dataset-type mooncake_trace --fixed-schedule``. Lag is
   computed in several ways (see ``LAG_DEFINITIONS``); the table's is
   *T0-anchored*: ``send_i - (T0 + ts_i)`` with each tool's own schedule zero.
   ``--order session`` runs carry ``--max-inflight 256``: one session per
   request means one connection per in-flight request, and without a bound
   an offered rate above the emulator's ceiling (~2,000 req/s on one core)
   opens connections until the replayer runs out of file descriptors
   ("cannot connect (Too many open files)", reported as a target failure).
   The *first-anchored* form ``(send_i - send_first) - (ts_i - ts_first)``
   assumes the first request left on time; in ``--order session`` it does
   not (one task per session is started, and its first body built, before
   anything is sent: ~0.5-0.7 s for 8,000 sessions), so that column is not shown
   for session order.
3. **Start-up**: wall time from just before spawning the tool to the first
   request line in the emulator's request log (its ``t`` is Unix time).
4. **Max sustained req/s and SSE chunks/s on one core** (``--timing asap``)
   and AIPerf's req/s and chunks/s per core (closed loop, ``--concurrency``;
   chunks = ``len(inter_chunk_latency) + 1`` per record), counting
   the CPU seconds of each tool's whole process tree (``/proc`` sampled
   during the run, ``wait4`` at the end) inside a steady-state window: the
   5th to the 95th percentile of request arrivals at the emulator.
5. **Peak RSS** (``wait4`` ``ru_maxrss``) replaying the imported
   kv-cache-tester corpus with ``--timing asap --max-inflight 64 --limit N
   --on-failure continue``. ``continue``: the replayer keeps idle connections
   for aiohttp's default 15 s and reuses the oldest first, while vLLM (and the
   emulator, ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``) closes them after 5 s; when the
   replayer's loop is busy (building ~0.5 MB bodies) it can POST on a
   connection the server has just closed ("Can not write request body" /
   "Server disconnected"): a replayer-side false failure, not the target's,
   which must not end the memory measurement. Every non-ok request is
   listed with its error.

The emulator is pinned to core 0 and the tool (with all its children) to
core 1. Other engineers share this machine (take ``flock /tmp/cpu.lock`` for a
measurement run), so every run also records the
*foreign* CPU: machine busy time (``/proc/stat``) minus the tool tree, the
emulator and this process. Replayer lag runs are repeated and the run with
the median first-anchored p99 is reported (all runs are in the JSON).

AIPerf is installed into ``bench/.venv-aiperf`` when missing (``pip install
aiperf``) and given a tiny local tokenizer (``bench/aiperf_support/mktok.py``);
``HF_HUB_OFFLINE`` is removed from its environment (with it, a local
tokenizer path fails). If AIPerf cannot be installed or run, its rows say
``AIPerf unavailable: <reason>``.

Run: ``python -m bench replay`` (~13 min; ``-- --quick`` for a short version,
``-- --no-aiperf`` to skip AIPerf). Child modes: ``python -m bench.replay
client {aiohttp|httpx} URL CONCURRENCY SECONDS MAX_TOKENS``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
WORK = OUT / "replay"
AIPERF_VENV = REPO / "bench" / ".venv-aiperf"
MKTOK = REPO / "bench" / "aiperf_support" / "mktok.py"
CORPUS = Path(os.environ.get("REPLAYER_SHARED_DATA", REPO.parent / "shared" / "data")) / (
    "kv_cache_tester_claude_code"
)
MODEL = "moonshotai/Kimi-K3"
EMU_ARGS = ["--speed", "instant", "--disable-uvicorn-access-log", "--stats-interval", "0"]
EMU_CPU, TOOL_CPU = 0, 1
CLK = os.sysconf("SC_CLK_TCK")
TINY_TOKENS = 2
SESSION_INFLIGHT = 256
SESSION_ARGS = ["--order", "session", "--max-inflight", str(SESSION_INFLIGHT)]
LAG_DEFINITIONS = {
    "first_anchored": "(send_i - send_first) - (ts_i - ts_first); first = the trace's first "
    "request; send = replayer dispatched_us / AIPerf request_start_ns. Valid only when the "
    "first request leaves on time; not shown for --order session, whose first request can "
    "itself be late (session tasks are set up as the run starts), which would make every "
    "later request look early (negative lag)",
    "t0_anchored": "(the table's lag) send_i - (T0 + ts_i); T0 = replayer's anchor (results "
    "are relative to it) / AIPerf's profiling-phase start_ns from its log",
    "engine": "replayer's own figure (summary lag_ms): dispatched_us - scheduled_us; "
    "scheduled = trace time / speed, in strict order at least the previous request's",
    "least_late": "AIPerf's own convention (replay_sched_lag): offset_i - min(offset)",
    "arrival": "arrival at the emulator (its request log) minus trace time, relative to the "
    "least-late request (a constant delay is invisible; the spread is what counts)",
}


# -- processes, CPU and machine load ------------------------------------------------


def _pin(cpu: int | None) -> Callable[[], None] | None:
    if cpu is None or (os.cpu_count() or 1) < 2:
        return None

    def pre() -> None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {cpu})

    return pre


def proc_cpu(pid: int) -> float | None:
    """utime+stime+cutime+cstime of a process (s): what it and its reaped
    children used; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw.rsplit(b")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / CLK


def tree_pids(root: int) -> list[int]:
    out, stack = [root], [root]
    for _ in range(10_000):  # bounded walk
        if not stack:
            break
        pid = stack.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            stack.extend(kids)
    return out


def machine_busy() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, steal seconds) from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / CLK, v[7] / CLK


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def busy_share(cpu: int, seconds: float = 0.5) -> float:
    """CPU share a busy thread gets on ``cpu`` right now (1.0 when idle)."""
    old = os.sched_getaffinity(0)
    try:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {cpu})
        t0, c0 = time.monotonic(), time.process_time()
        while time.monotonic() - t0 < seconds:
            pass
        return (time.process_time() - c0) / (time.monotonic() - t0)
    finally:
        os.sched_setaffinity(0, old)


QUIET = {"max_wait": 30.0, "threshold": 0.25}


def wait_quiet(max_wait: float | None = None, threshold: float | None = None) -> float:
    """Wait (bounded) until processes other than this one use less than
    ``threshold`` cores over a second; returns the last figure. Other users
    of the machine come and go; this only skips their busiest moments."""
    max_wait = QUIET["max_wait"] if max_wait is None else max_wait
    threshold = QUIET["threshold"] if threshold is None else threshold
    foreign = 0.0
    for _ in range(int(max_wait) + 1):
        b0, s0, t0 = machine_busy()[0], self_cpu(), time.monotonic()
        time.sleep(1.0)
        dt = time.monotonic() - t0
        foreign = (machine_busy()[0] - b0 - (self_cpu() - s0)) / dt
        if foreign < threshold:
            break
    return foreign


@dataclass
class ChildRun:
    cmd: list[str]
    spawned: float
    """Unix time taken just before spawning."""
    wall: float
    cpu: float
    """CPU seconds of the child and every descendant it reaped (wait4)."""
    maxrss: int
    """Peak RSS in bytes of the largest single process of the tree (wait4)."""
    rc: int
    samples: list[tuple[float, float]] = field(default_factory=list)
    """(Unix time, CPU seconds of the live tree) during the run."""
    max_procs: int = 1
    foreign_cores: float = 0.0
    """Average cores used by processes other than the tool, the emulator and
    this bench while the child ran (other users of the machine)."""
    log: Path | None = None

    def cpu_at(self, t: float) -> float:
        """Tree CPU seconds at Unix time ``t`` (linear between samples)."""
        pts = self.samples
        if not pts:
            return 0.0
        if t <= pts[0][0]:
            return pts[0][1]
        for (ta, ca), (tb, cb) in zip(pts, pts[1:], strict=False):
            if ta <= t <= tb:
                return ca + (cb - ca) * ((t - ta) / (tb - ta) if tb > ta else 0.0)
        return pts[-1][1]

    def log_tail(self, n: int = 2000) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")[-n:]


def run_child(
    cmd: Sequence[str],
    *,
    log: Path,
    timeout: float,
    cpu: int | None = TOOL_CPU,
    env: dict[str, str] | None = None,
    emu_pid: int | None = None,
    sample_every: float = 0.2,
) -> ChildRun:
    """Run a child (its own session, pinned to ``cpu``), sampling the CPU of
    its process tree; bounded by ``timeout`` (then the child's process group
    is killed and RuntimeError raised)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    m0, e0, s0 = machine_busy()[0], proc_cpu(emu_pid) if emu_pid else 0.0, self_cpu()
    spawned = time.time()
    t0 = time.monotonic()
    with log.open("wb") as lf:
        proc = subprocess.Popen(
            list(cmd),
            stdout=lf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_pin(cpu),
        )
    samples: list[tuple[float, float]] = [(spawned, 0.0)]
    last: dict[int, float] = {}
    max_procs = 1
    next_sample = 0.0
    deadline = t0 + timeout
    status, usage = 0, None
    for _ in range(int(timeout / 0.02) + 10):
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        now = time.monotonic()
        if now >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            os.wait4(proc.pid, 0)
            raise RuntimeError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}")
        if now >= next_sample:
            pids = tree_pids(proc.pid)
            max_procs = max(max_procs, len(pids))
            for p in pids:
                c = proc_cpu(p)
                if c is not None:
                    last[p] = c
            alive = set(pids)
            # a dead child's time moves into its reaper's cutime: count the live tree
            samples.append((time.time(), sum(v for p, v in last.items() if p in alive)))
            next_sample = now + sample_every
        time.sleep(0.02)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        os.wait4(proc.pid, 0)
        raise RuntimeError(f"child did not finish: {' '.join(cmd)}")
    wall = time.monotonic() - t0
    assert usage is not None
    total = usage.ru_utime + usage.ru_stime
    samples.append((time.time(), total))
    # leftovers of the child's session (none expected): end them, by group id
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    emu_used = (proc_cpu(emu_pid) or 0.0) - (e0 or 0.0) if emu_pid else 0.0
    foreign = machine_busy()[0] - m0 - total - emu_used - (self_cpu() - s0)
    return ChildRun(
        cmd=list(cmd),
        spawned=spawned,
        wall=wall,
        cpu=total,
        maxrss=usage.ru_maxrss * 1024,
        rc=os.waitstatus_to_exitcode(status),
        samples=samples,
        max_procs=max_procs,
        foreign_cores=max(foreign, 0.0) / wall if wall > 0 else 0.0,
        log=log,
    )


@contextlib.contextmanager
def emulator(extra: Sequence[str] = (), *, request_log: bool = True) -> Iterator[Any]:
    from replayer.testing.emulator import EmulatorProcess

    wait_quiet()
    with EmulatorProcess([*EMU_ARGS, *extra], request_log=request_log) as emu:
        if (os.cpu_count() or 1) > 1:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(emu.pid, {EMU_CPU})
        yield emu


def arrivals(emu: Any) -> list[dict[str, Any]]:
    return [e for e in emu.read_request_log() if e.get("event") == "request"]


# -- statistics ----------------------------------------------------------------------


def pct(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def dist_ms(values_ms: Sequence[float]) -> dict[str, float]:
    v = sorted(values_ms)
    return {
        "n": len(v),
        "p50": pct(v, 0.5),
        "p99": pct(v, 0.99),
        "max": v[-1] if v else float("nan"),
        "min": v[0] if v else float("nan"),
    }


def error_counts(results: Sequence[dict[str, Any]], top: int = 5) -> dict[str, int]:
    """The most frequent ``status: error`` texts of non-ok results."""
    counts: dict[str, int] = {}
    for r in results:
        if r["status"] != "ok":
            key = f"{r['status']}: {(r.get('error') or r.get('error_class') or '')[:120]}"
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:top])


def first_anchored(pairs: Sequence[tuple[float, float]]) -> list[float]:
    """``pairs`` = (send time s, trace time s); lag ms anchored at the trace's
    first request (the earliest-sent one among ties)."""
    if not pairs:
        return []
    s0, ts0 = min(pairs, key=lambda p: (p[1], p[0]))
    return [((s - s0) - (ts - ts0)) * 1e3 for s, ts in pairs]


def least_late(pairs: Sequence[tuple[float, float]]) -> list[float]:
    """Lag ms relative to the least-late request (AIPerf's convention)."""
    offsets = [(s - ts) * 1e3 for s, ts in pairs]
    lo = min(offsets, default=0.0)
    return [o - lo for o in offsets]


def window_rate(
    run: ChildRun, times: Sequence[float], lo: float = 0.05, hi: float = 0.95
) -> dict[str, float]:
    """Requests/s and requests per tree CPU-second between the ``lo`` and
    ``hi`` quantiles of arrival times (Unix seconds)."""
    t = sorted(times)
    if len(t) < 20:
        return {"requests": len(t), "req_per_s": float("nan"), "req_per_cpu_s": float("nan")}
    a, b = t[int(lo * (len(t) - 1))], t[int(hi * (len(t) - 1))]
    n = sum(1 for x in t if a <= x <= b)
    cpu = run.cpu_at(b) - run.cpu_at(a)
    return {
        "requests": n,
        "seconds": b - a,
        "req_per_s": n / (b - a) if b > a else float("nan"),
        "cpu_cores": cpu / (b - a) if b > a else float("nan"),
        "req_per_cpu_s": n / cpu if cpu > 0 else float("nan"),
    }


# -- traces --------------------------------------------------------------------------


def rate_trace(path: Path, rate: float, n: int, *, max_tokens: int = TINY_TOKENS) -> Path:
    """``n`` single-turn sessions, one every ``1/rate`` s, tiny prompts."""
    from replayer.trace.model import RequestRecord, TraceMeta
    from replayer.trace.writer import TraceWriter

    if path.exists():
        path.unlink()
    meta = TraceMeta(source="bench", details={"rate": rate, "requests": n})
    with TraceWriter(path, meta) as w:
        for i in range(n):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"hi {i}"}],
                "max_tokens": max_tokens,
            }
            w.add(
                RequestRecord.from_body(
                    body,
                    request_id=f"r{i}",
                    session_id=f"s{i}",
                    turn=0,
                    start_us=round(i * 1e6 / rate),
                )
            )
    return path


def trace_rows(trace: Path) -> list[int]:
    from replayer.trace.reader import Trace

    return Trace.open(trace).order


def export_aiperf(trace: Path, rows: Path) -> Path:
    rows.unlink(missing_ok=True)
    r = subprocess.run(
        [sys.executable, "-m", "replayer", "export", str(trace), "--format", "aiperf"]
        + ["-o", str(rows)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise RuntimeError(f"replayer export failed ({r.returncode}): {r.stderr.strip()[-300:]}")
    return rows


def trace_times(rows: Path) -> dict[str, float]:
    """session_id -> timestamp (s) of an exported AIPerf rows file."""
    out: dict[str, float] = {}
    with rows.open() as f:
        for line in f:
            r = json.loads(line)
            out[r["session_id"]] = r["timestamp"] / 1e3
    return out


# -- replayer ------------------------------------------------------------------------


def replayer_run(
    trace: Path, emu: Any, out: Path, extra: Sequence[str], *, timeout: float
) -> tuple[ChildRun, list[dict[str, Any]], dict[str, Any]]:
    from replayer.replay.results import read_results

    cmd = [sys.executable, "-m", "replayer", "replay", str(trace), "--target", emu.url]
    cmd += ["--out", str(out), "--force", "--quiet", *extra]
    run = run_child(cmd, log=out.with_suffix(".log"), timeout=timeout, emu_pid=emu.pid)
    # 1 = the target failed: a result (reported), not a broken bench
    if run.rc not in (0, 1) or not (out / "summary.json").exists():
        raise RuntimeError(f"replayer exited {run.rc}: {run.log_tail(600)}")
    summary = json.loads((out / "summary.json").read_text())["targets"]["target"]
    summary["exit_code"] = run.rc
    return run, read_results(out / "results.arrow"), summary


# -- AIPerf --------------------------------------------------------------------------


@dataclass
class AIPerf:
    ok: bool
    reason: str = ""
    exe: Path | None = None
    tokenizer: Path | None = None
    version: str = ""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
        env["HF_HUB_DISABLE_TELEMETRY"] = "1"
        env["TOKENIZERS_PARALLELISM"] = "false"
        return env

    def cmd(self, rows: Path, url: str, art: Path, extra: Sequence[str]) -> list[str]:
        assert self.exe is not None and self.tokenizer is not None
        return [
            str(self.exe),
            "profile",
            "--model",
            MODEL,
            "--url",
            url,
            "--endpoint-type",
            "chat",
            "--streaming",
            "--tokenizer",
            str(self.tokenizer),
            "--input-file",
            str(rows),
            "--custom-dataset-type",
            "mooncake_trace",
            "--ui-type",
            "none",
            "--no-gpu-telemetry",
            "--no-server-metrics",
            "--output-artifact-dir",
            str(art),
            *extra,
        ]


def ensure_aiperf(install: bool = True) -> AIPerf:
    exe = AIPERF_VENV / "bin" / "aiperf"
    py = AIPERF_VENV / "bin" / "python"
    if not exe.exists():
        if not install:
            return AIPerf(False, "not installed (bench/.venv-aiperf) and --no-install")
        print(
            "installing AIPerf: python -m venv bench/.venv-aiperf && pip install aiperf "
            "(~1.2 GB, a few minutes)",
            flush=True,
        )
        try:
            subprocess.run([sys.executable, "-m", "venv", str(AIPERF_VENV)], check=True)
            r = subprocess.run(
                [str(py), "-m", "pip", "install", "-q", "aiperf"],
                capture_output=True,
                text=True,
                timeout=1800,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return AIPerf(False, f"install failed: {exc}")
        if r.returncode != 0 or not exe.exists():
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            return AIPerf(False, f"pip install aiperf failed: {' / '.join(tail)}")
    tok = WORK / "aiperf-tokenizer"
    if not (tok / "tokenizer.json").exists():
        print(f"building a tiny offline tokenizer for AIPerf in {tok}", flush=True)
        r = subprocess.run([str(py), str(MKTOK), str(tok)], capture_output=True, text=True)
        if r.returncode != 0:
            return AIPerf(False, f"tokenizer build failed: {r.stderr.strip()[-300:]}")
    v = subprocess.run([str(exe), "--version"], capture_output=True, text=True)
    version = (v.stdout.strip().splitlines() or ["?"])[-1]
    return AIPerf(True, exe=exe, tokenizer=tok, version=version)


def aiperf_records(art: Path) -> list[dict[str, Any]]:
    path = art / "profile_export.jsonl"
    out: list[dict[str, Any]] = []
    if not path.exists():  # --export-level summary
        return out
    with path.open() as f:
        for line in f:
            rec = json.loads(line)
            meta = rec.get("metadata", {})
            meta["_error"] = rec.get("error")
            icl = (rec.get("metrics") or {}).get("inter_chunk_latency", {}).get("value")
            # SSE chunks carrying output: one more than the gaps between them
            meta["_chunks"] = len(icl) + 1 if isinstance(icl, list) else None
            out.append(meta)
    return out


def aiperf_phase_start(art: Path) -> float | None:
    """Unix time (s) of the profiling phase start (AIPerf's schedule zero)."""
    log = art / "logs" / "aiperf.log"
    if not log.exists():
        return None
    m = re.search(r"phase=CreditPhase\.PROFILING.*?\bstart_ns=(\d+)", log.read_text())
    return int(m.group(1)) / 1e9 if m else None


# -- 1. client choice ----------------------------------------------------------------


async def _client_load(
    kind: str, url: str, concurrency: int, seconds: float, max_tokens: int
) -> dict[str, Any]:
    import orjson

    from replayer.wire import ChatAccumulator, SSEDecoder

    body = orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi there"}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    headers = {"Content-Type": "application/json"}
    target = f"{url}/v1/chat/completions"
    counts = {"requests": 0, "chunks": 0, "errors": 0}
    loop = asyncio.get_running_loop()

    if kind == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency),
            timeout=aiohttp.ClientTimeout(total=60),
            auto_decompress=False,
        )

        async def one() -> None:
            dec, acc = SSEDecoder(), ChatAccumulator()
            async with session.post(target, data=body, headers=headers) as r:
                if r.status != 200:
                    counts["errors"] += 1
                async for chunk in r.content.iter_any():
                    now = loop.time()
                    for ev in dec.feed(chunk):
                        acc.event(ev, now)
            counts["chunks"] += acc.reply.chunks
            counts["errors"] += not acc.reply.done

        close = session.close
    else:
        import httpx

        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            timeout=60,
        )

        async def one() -> None:
            dec, acc = SSEDecoder(), ChatAccumulator()
            async with client.stream("POST", target, content=body, headers=headers) as r:
                if r.status_code != 200:
                    counts["errors"] += 1
                async for chunk in r.aiter_raw():
                    now = loop.time()
                    for ev in dec.feed(chunk):
                        acc.event(ev, now)
            counts["chunks"] += acc.reply.chunks
            counts["errors"] += not acc.reply.done

        close = client.aclose

    try:
        for _ in range(2):  # warm the pool
            await asyncio.gather(*(one() for _ in range(concurrency)))
        counts.update(requests=0, chunks=0, errors=0)
        c0, t0 = self_cpu(), time.monotonic()
        deadline = t0 + seconds

        async def worker() -> None:
            while time.monotonic() < deadline:
                await one()
                counts["requests"] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.monotonic() - t0, self_cpu() - c0
    finally:
        await close()
    return {
        **counts,
        "seconds": wall,
        "cpu_s": cpu,
        "req_per_s": counts["requests"] / wall,
        "chunks_per_s": counts["chunks"] / wall,
        "req_per_cpu_s": counts["requests"] / cpu,
        "chunks_per_cpu_s": counts["chunks"] / cpu,
        "client_cpu": cpu / wall,
    }


def client_child(argv: list[str]) -> None:
    kind, url, conc, secs, mt = argv
    res = asyncio.run(_client_load(kind, url, int(conc), float(secs), int(mt)))
    print(json.dumps(res))


def bench_clients(seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with emulator(request_log=False) as emu:
        for label, conc, mt in (("short", 32, TINY_TOKENS), ("long", 16, 256)):
            for kind in ("aiohttp", "httpx"):
                cmd = [sys.executable, "-m", "bench.replay", "client", kind, emu.url]
                cmd += [str(conc), str(seconds), str(mt)]
                e0 = proc_cpu(emu.pid) or 0.0
                run = run_child(
                    cmd,
                    log=WORK / f"client-{kind}-{label}.log",
                    timeout=seconds + 120,
                    emu_pid=emu.pid,
                )
                if run.rc != 0:
                    raise RuntimeError(f"client child failed: {run.log_tail()}")
                lines = [ln for ln in run.log_tail(4000).splitlines() if ln.startswith("{")]
                res = json.loads(lines[-1])
                res["emulator_cores"] = ((proc_cpu(emu.pid) or 0.0) - e0) / run.wall
                res["foreign_cores"] = run.foreign_cores
                res["concurrency"], res["max_tokens"] = conc, mt
                out[f"{kind}_{label}"] = res
    return out


# -- 2. schedule lag -----------------------------------------------------------------


def replayer_lag(
    trace: Path, rate: float, emu: Any, out: Path, extra: Sequence[str]
) -> dict[str, Any]:
    run, results, summary = replayer_run(
        trace, emu, out, extra, timeout=120 + 3 * len(trace_rows(trace)) / rate
    )
    ts = {f"r{i}": i / rate for i in range(len(results))}
    sent = [r for r in results if r["dispatched_us"] is not None]
    pairs = [(r["dispatched_us"] / 1e6, ts[r["request_id"]]) for r in sent]
    engine = [(r["dispatched_us"] - r["scheduled_us"]) / 1e3 for r in sent]
    t0 = [(r["dispatched_us"] / 1e6 - ts[r["request_id"]]) * 1e3 for r in sent]
    arr = arrivals(emu)
    apairs = [(e["t"], ts[e["request_id"]]) for e in arr if e.get("request_id") in ts]
    disp = sorted(r["dispatched_us"] for r in sent)
    failure = summary.get("failure") or {}
    first = next((r for r in sent if r["request_id"] == "r0"), None)
    return {
        "args": list(extra),
        "sent": len(sent),
        "ok": sum(1 for r in results if r["status"] == "ok"),
        "target_failed": failure.get("kind") if summary.get("failed") else None,
        "failure_message": failure.get("message") if summary.get("failed") else None,
        "errors": error_counts(results),
        # T0-anchored lag of the trace's first request: the first-anchored
        # figures are shifted by minus this
        "first_request_lag_ms": first["dispatched_us"] / 1e3 if first else None,
        "achieved_rps": (len(disp) - 1) / ((disp[-1] - disp[0]) / 1e6) if len(disp) > 1 else 0,
        "first_anchored_ms": dist_ms(first_anchored(pairs)),
        "t0_anchored_ms": dist_ms(t0),
        "engine_ms": dist_ms(engine),
        "arrival_ms": dist_ms(least_late(apairs)),
        "summary_lag_ms": summary.get("lag_ms"),
        "cpu_s": run.cpu,
        "wall_s": run.wall,
        "foreign_cores": run.foreign_cores,
        "startup_s": (min(e["t"] for e in arr) - run.spawned) if arr else None,
    }


def aiperf_lag(
    ap: AIPerf, rows: Path, emu: Any, art: Path, n: int, cpu: int | None = TOOL_CPU
) -> dict[str, Any]:
    if art.exists():
        shutil.rmtree(art)
    cmd = ap.cmd(rows, emu.url, art, ["--fixed-schedule"])
    run = run_child(
        cmd,
        log=art.with_suffix(".log"),
        timeout=300 + n / 50,
        env=ap.env(),
        emu_pid=emu.pid,
        cpu=cpu,
    )
    if run.rc != 0:
        raise RuntimeError(f"aiperf exited {run.rc}: {run.log_tail()}")
    ts = trace_times(rows)
    recs = aiperf_records(art)
    sent = [m for m in recs if m.get("request_start_ns")]
    pairs = [(m["request_start_ns"] / 1e9, ts[m["conversation_id"]]) for m in sent]
    offsets = [(s - t) * 1e3 for s, t in pairs]
    lo = min(offsets) if offsets else 0.0
    start = aiperf_phase_start(art)
    rid = {m["x_request_id"]: ts[m["conversation_id"]] for m in sent}
    arr = arrivals(emu)
    apairs = [(e["t"], rid[e["request_id"]]) for e in arr if e.get("request_id") in rid]
    starts = sorted(m["request_start_ns"] for m in sent)
    return {
        "sent": len(sent),
        "ok": sum(1 for m in recs if not m.get("_error")),
        "achieved_rps": (len(starts) - 1) / ((starts[-1] - starts[0]) / 1e9)
        if len(starts) > 1
        else 0,
        "first_anchored_ms": dist_ms(first_anchored(pairs)),
        "t0_anchored_ms": dist_ms([(s - (start + t)) * 1e3 for s, t in pairs])
        if start is not None
        else None,
        "least_late_ms": dist_ms([o - lo for o in offsets]),
        "arrival_ms": dist_ms(least_late(apairs)),
        "cpu_s": run.cpu,
        "wall_s": run.wall,
        "foreign_cores": run.foreign_cores,
        "maxrss": run.maxrss,
        "startup_s": (min(e["t"] for e in arr) - run.spawned) if arr else None,
    }


def bench_lag(
    rates: Sequence[float],
    seconds: float,
    repeats: int,
    ap: AIPerf | None,
    unpinned_rates: Sequence[float] = (),
    no_monitor_repeats: int = 1,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rate in rates:
        n = max(50, round(rate * seconds))
        trace = rate_trace(WORK / f"lag-{rate:g}.arrow", rate, n)
        entry: dict[str, Any] = {"rate": rate, "requests": n, "seconds": n / rate}
        for key, extra, reps in (
            ("replayer", [], repeats),
            ("replayer_no_monitor", ["--no-monitor"], no_monitor_repeats),
        ):
            runs = []
            for k in range(reps):
                with emulator() as emu:
                    run_dir = WORK / f"lag-{rate:g}-{key}-r{k}"
                    runs.append(replayer_lag(trace, rate, emu, run_dir, extra))
            # the run with the median T0-anchored p99 (all p99s are kept)
            runs.sort(key=lambda r: r["t0_anchored_ms"]["p99"])
            entry[key] = runs[len(runs) // 2]
            entry[f"{key}_runs_p99_ms"] = [r["t0_anchored_ms"]["p99"] for r in runs]
        with emulator() as emu:
            entry["replayer_session_order"] = replayer_lag(
                trace, rate, emu, WORK / f"lag-{rate:g}-session", SESSION_ARGS
            )
        if ap is not None and ap.ok:
            try:
                rows = export_aiperf(trace, WORK / f"lag-{rate:g}.jsonl")
                with emulator() as emu:
                    entry["aiperf"] = aiperf_lag(ap, rows, emu, WORK / f"aiperf-lag-{rate:g}", n)
            except (RuntimeError, OSError, KeyError, ValueError) as exc:
                entry["aiperf"] = {"unavailable": f"{type(exc).__name__}: {str(exc)[-300:]}"}
            if rate in unpinned_rates and "unavailable" not in entry["aiperf"]:
                # AIPerf is multi-process: its best case may need both cores
                try:
                    with emulator() as emu:
                        entry["aiperf_unpinned"] = aiperf_lag(
                            ap, rows, emu, WORK / f"aiperf-lag-{rate:g}-unpinned", n, cpu=None
                        )
                except (RuntimeError, OSError, KeyError, ValueError) as exc:
                    entry["aiperf_unpinned"] = {"unavailable": f"{type(exc).__name__}: {exc}"}
        out[f"{rate:g}"] = entry
        print(f"  lag at {rate:g} req/s done", flush=True)
    return out


# -- 3. start-up ---------------------------------------------------------------------


def bench_startup(repeats: int) -> dict[str, Any]:
    trace = rate_trace(WORK / "startup.arrow", 1.0, 1)
    times, imports = [], []
    for k in range(repeats):
        with emulator() as emu:
            run, _, _ = replayer_run(trace, emu, WORK / f"startup-{k}", [], timeout=60)
            arr = arrivals(emu)
            times.append(min(e["t"] for e in arr) - run.spawned)
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, "-c", "import replayer.cli.replay, replayer.replay.run"],
            check=True,
            preexec_fn=_pin(TOOL_CPU),
        )
        imports.append(time.monotonic() - t0)
    return {
        "runs_s": times,
        "median_s": statistics.median(times),
        "python_and_imports_s": statistics.median(imports),
    }


# -- 4. throughput on one core -------------------------------------------------------


def bench_throughput(
    n_tiny: int,
    n_long: int,
    n_aiperf: int,
    repeats: int,
    ap: AIPerf | None,
    aiperf_settings: Sequence[Sequence[str]],
    n_aiperf_long: int = 0,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tiny = rate_trace(WORK / "tput-tiny.arrow", 1000.0, n_tiny)
    for label, extra in (
        ("replayer_strict", ["--timing", "asap", "--max-inflight", "64"]),
        ("replayer_session", ["--timing", "asap", "--max-inflight", "64", "--order", "session"]),
    ):
        best: dict[str, Any] | None = None
        for k in range(repeats):
            with emulator() as emu:
                e0 = proc_cpu(emu.pid) or 0.0
                run, results, summary = replayer_run(
                    tiny, emu, WORK / f"{label}-{k}", extra, timeout=120 + n_tiny / 200
                )
                emu_cores = ((proc_cpu(emu.pid) or 0.0) - e0) / run.wall
                arr = arrivals(emu)
            w = window_rate(run, [e["t"] for e in arr])
            res = {
                **w,
                "ok": summary["status"].get("ok", 0),
                "total_cpu_s": run.cpu,
                "wall_s": run.wall,
                "emulator_cores": emu_cores,
                "foreign_cores": run.foreign_cores,
                "maxrss": run.maxrss,
            }
            if best is None or res["req_per_s"] > best["req_per_s"]:
                best = res
        out[label] = best
    # SSE chunks/s: 256-token streams
    long = rate_trace(WORK / "tput-long.arrow", 1000.0, n_long, max_tokens=256)
    best = None
    for k in range(repeats):
        with emulator() as emu:
            e0 = proc_cpu(emu.pid) or 0.0
            run, results, summary = replayer_run(
                long,
                emu,
                WORK / f"replayer-chunks-{k}",
                ["--timing", "asap", "--max-inflight", "32"],
                timeout=120 + n_long / 10,
            )
            emu_cpu = (proc_cpu(emu.pid) or 0.0) - e0
            first = min(e["t"] for e in arrivals(emu))
        d0 = min(r["dispatched_us"] for r in results)
        d1 = max(r["done_us"] for r in results)
        span = (d1 - d0) / 1e6
        chunks = sum(r["chunks"] or 0 for r in results)
        # the replay span in Unix time starts at the first arrival
        cpu_span = run.cpu_at(first + span) - run.cpu_at(first)
        res = {
            "requests": len(results),
            "chunks": chunks,
            "span_s": span,
            "chunks_per_s": chunks / span,
            "req_per_s": len(results) / span,
            "client_cores_in_span": cpu_span / span if span > 0 else float("nan"),
            "chunks_per_cpu_s": chunks / cpu_span if cpu_span > 0 else float("nan"),
            "emulator_cores": emu_cpu / run.wall,
            "foreign_cores": run.foreign_cores,
            "total_cpu_s": run.cpu,
        }
        if best is None or res["chunks_per_s"] > best["chunks_per_s"]:
            best = res
    out["replayer_chunks"] = best
    if ap is not None and ap.ok:
        settings: dict[str, Any] = {}
        try:
            rows = export_aiperf(
                rate_trace(WORK / "tput-aiperf.arrow", 1000.0, n_aiperf),
                WORK / "tput-aiperf.jsonl",
            )
        except RuntimeError as exc:
            settings["export"] = {"unavailable": str(exc)}
            aiperf_settings = []
        for ap_extra in aiperf_settings:
            name = " ".join(ap_extra)
            art = WORK / ("aiperf-tput-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"))
            if art.exists():
                shutil.rmtree(art)
            args = ["--no-fixed-schedule", "--request-count", str(n_aiperf), *ap_extra]
            try:
                with emulator() as emu:
                    e0 = proc_cpu(emu.pid) or 0.0
                    run = run_child(
                        ap.cmd(rows, emu.url, art, args),
                        log=art.with_suffix(".log"),
                        timeout=300 + n_aiperf / 20,
                        env=ap.env(),
                        emu_pid=emu.pid,
                    )
                    emu_cores = ((proc_cpu(emu.pid) or 0.0) - e0) / run.wall
                    arr = arrivals(emu)
                if run.rc != 0:
                    raise RuntimeError(f"aiperf exited {run.rc}: {run.log_tail(600)}")
                recs = aiperf_records(art)
                settings[name] = {
                    **window_rate(run, [e["t"] for e in arr]),
                    "ok": sum(1 for m in recs if not m.get("_error")) if recs else None,
                    "arrived": len(arr),
                    "total_cpu_s": run.cpu,
                    "wall_s": run.wall,
                    "emulator_cores": emu_cores,
                    "foreign_cores": run.foreign_cores,
                    "maxrss": run.maxrss,
                    "max_processes": run.max_procs,
                }
            except (RuntimeError, OSError, ValueError) as exc:
                settings[name] = {"unavailable": f"{type(exc).__name__}: {str(exc)[-300:]}"}
        out["aiperf_settings"] = settings
        ok = {k: v for k, v in settings.items() if "req_per_cpu_s" in v}
        if ok:
            name = max(ok, key=lambda k: ok[k]["req_per_cpu_s"])
            out["aiperf_best"] = {"setting": name, **ok[name]}
        if n_aiperf_long:
            try:
                out["aiperf_chunks"] = aiperf_chunks(ap, n_aiperf_long)
            except (RuntimeError, OSError, ValueError, KeyError) as exc:
                out["aiperf_chunks"] = {"unavailable": f"{type(exc).__name__}: {str(exc)[-300:]}"}
    return out


def aiperf_chunks(ap: AIPerf, n: int, concurrency: int = 16) -> dict[str, Any]:
    """AIPerf's SSE chunks/s with 256-token streams, closed loop, pinned like
    replayer's: span = first request start to last request end."""
    rows = export_aiperf(
        rate_trace(WORK / "tput-aiperf-long.arrow", 1000.0, n, max_tokens=256),
        WORK / "tput-aiperf-long.jsonl",
    )
    art = WORK / "aiperf-chunks"
    if art.exists():
        shutil.rmtree(art)
    args = ["--no-fixed-schedule", "--request-count", str(n), "--concurrency", str(concurrency)]
    with emulator(request_log=False) as emu:
        e0 = proc_cpu(emu.pid) or 0.0
        run = run_child(
            ap.cmd(rows, emu.url, art, args),
            log=art.with_suffix(".log"),
            timeout=300 + n / 5,
            env=ap.env(),
            emu_pid=emu.pid,
        )
        emu_cores = ((proc_cpu(emu.pid) or 0.0) - e0) / run.wall
    if run.rc != 0:
        raise RuntimeError(f"aiperf exited {run.rc}: {run.log_tail(600)}")
    recs = [m for m in aiperf_records(art) if m.get("request_start_ns")]
    if not recs:
        raise RuntimeError("no AIPerf records")
    a = min(m["request_start_ns"] for m in recs) / 1e9
    b = max(m.get("request_end_ns") or m["request_start_ns"] for m in recs) / 1e9
    span = b - a
    chunks = sum(m["_chunks"] or 0 for m in recs)
    cpu_span = run.cpu_at(b) - run.cpu_at(a)
    return {
        "setting": " ".join(args[3:]),
        "requests": len(recs),
        "ok": sum(1 for m in recs if not m.get("_error")),
        "chunks": chunks,
        "span_s": span,
        "chunks_per_s": chunks / span if span > 0 else float("nan"),
        "req_per_s": len(recs) / span if span > 0 else float("nan"),
        "client_cores_in_span": cpu_span / span if span > 0 else float("nan"),
        "chunks_per_cpu_s": chunks / cpu_span if cpu_span > 0 else float("nan"),
        "emulator_cores": emu_cores,
        "foreign_cores": run.foreign_cores,
        "total_cpu_s": run.cpu,
    }


# -- 5. kv-cache-tester peak RSS -----------------------------------------------------


def bench_kv_rss(limit: int) -> dict[str, Any]:
    from replayer.trace.reader import Trace

    trace = OUT / "kv-cache-tester.arrow"  # written by `python -m bench trace_storage`
    if not trace.exists():
        trace = WORK / "kv-cache-tester.arrow"
        if not trace.exists():
            print(f"importing {CORPUS} -> {trace}", flush=True)
            subprocess.run(
                [sys.executable, "-m", "replayer", "import", "kv-cache-tester", str(CORPUS)]
                + ["-o", str(trace)],
                check=True,
                capture_output=True,
            )
    t = Trace.open(trace)
    rows = t.order[:limit]
    sizes = t.column("body_bytes")
    body_bytes = [sizes[r] for r in rows]
    extra = ["--timing", "asap", "--max-inflight", "64", "--limit", str(limit)]
    # continue: one stale keep-alive connection must not end the measurement
    extra += ["--model", MODEL, "--on-failure", "continue"]
    emu_extra = ["--max-model-len", "1M", "--num-gpu-blocks-override", "1000000"]
    with emulator(emu_extra, request_log=False) as emu:
        e0 = proc_cpu(emu.pid) or 0.0
        run, results, summary = replayer_run(
            trace, emu, WORK / "kv-rss", extra, timeout=300 + limit
        )
        emu_cores = ((proc_cpu(emu.pid) or 0.0) - e0) / run.wall
    return {
        "trace": str(trace.relative_to(REPO)),
        "trace_requests": len(t),
        "replayed": len(results),
        "ok": summary["status"].get("ok", 0),
        "status": summary["status"],
        "errors": error_counts(results),
        "body_bytes_total": sum(body_bytes),
        "body_bytes_max": max(body_bytes),
        "body_bytes_mean": sum(body_bytes) / len(body_bytes),
        "peak_rss": run.maxrss,
        "wall_s": run.wall,
        "cpu_s": run.cpu,
        "req_per_s": summary.get("throughput_rps"),
        "emulator_cores": emu_cores,
        "foreign_cores": run.foreign_cores,
        "args": extra,
    }


# -- report --------------------------------------------------------------------------


def _f(x: Any, spec: str = ",.0f") -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and x != x:
        return "–"
    return format(x, spec)


def _ms(d: dict[str, float] | None, key: str) -> str:
    if not d:
        return "–"
    v = d.get(key)
    if v is None or v != v:
        return "–"
    return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"


def render(fig: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    cl = fig.get("clients")
    if cl:
        add(
            "**Client choice** (hot path: POST + SSE read + replayer's SSE decoding; closed loop; "
            "client child pinned to core 1, emulator to core 0)\n"
        )
        add(
            "| client | 2-token streams, c=32: req/s | req per client CPU-s | "
            "256-token streams, c=16: chunks/s | chunks per client CPU-s | client CPU |"
        )
        add("|---|---|---|---|---|---|")
        for kind in ("aiohttp", "httpx"):
            s, lg = cl[f"{kind}_short"], cl[f"{kind}_long"]
            add(
                f"| {kind} | {_f(s['req_per_s'])} | {_f(s['req_per_cpu_s'])} | "
                f"{_f(lg['chunks_per_s'])} | {_f(lg['chunks_per_cpu_s'])} | "
                f"{s['client_cpu']:.0%} / {lg['client_cpu']:.0%} |"
            )
        a, h = cl["aiohttp_short"], cl["httpx_short"]
        la, lh = cl["aiohttp_long"], cl["httpx_long"]
        add(
            f"\naiohttp / httpx: {a['req_per_cpu_s'] / h['req_per_cpu_s']:.2f}x requests per "
            f"CPU-s, {la['chunks_per_cpu_s'] / lh['chunks_per_cpu_s']:.2f}x chunks per CPU-s.\n"
        )
    lag = fig.get("lag")
    if lag:
        add(
            "**Schedule lag** (ms; open loop, one single-turn session per request, "
            f"{TINY_TOKENS} output tokens; lag = T0-anchored send lag: send time minus "
            "scheduled time on each tool's own clock zero; see the definitions below)\n"
        )
        add(
            "| offered req/s | tool | sent | achieved req/s | lag p50 | lag p99 | lag max | "
            "first-anchored p50 / p99 | arrival spread p50 / p99 | lag p99 of each repeat | "
            "foreign load (cores) |"
        )
        add("|---|---|---|---|---|---|---|---|---|---|---|")
        for key, e in lag.items():
            for tool, label in (
                ("replayer", "replayer (strict)"),
                ("replayer_no_monitor", "replayer --no-monitor"),
                ("replayer_session_order", "replayer " + " ".join(SESSION_ARGS)),
                ("aiperf", "AIPerf --fixed-schedule"),
                ("aiperf_unpinned", "AIPerf --fixed-schedule, unpinned (both cores)"),
            ):
                r = e.get(tool)
                if r is None:
                    continue
                if "unavailable" in r:
                    add(f"| {key} | {label} | AIPerf unavailable: {r['unavailable']} ||||||||")
                    continue
                if tool == "replayer_session_order" and r.get("args"):
                    label = "replayer " + " ".join(r["args"])
                fa = r["first_anchored_ms"]
                fa_text = f"{_ms(fa, 'p50')} / {_ms(fa, 'p99')}"
                if tool == "replayer_session_order":
                    late = r.get("first_request_lag_ms")
                    fa_text = "n/a" + (f" (first request {late:,.0f} ms late)" if late else "")
                if r.get("target_failed"):
                    label += f" (target failed: {r['target_failed']}, {r['ok']:,} ok)"
                t0 = r.get("t0_anchored_ms")
                reps = e.get(f"{tool}_runs_p99_ms")
                add(
                    f"| {key} | {label} | {r['sent']:,} | {_f(r['achieved_rps'])} | "
                    f"{_ms(t0, 'p50')} | {_ms(t0, 'p99')} | {_ms(t0, 'max')} | "
                    f"{fa_text} | "
                    f"{_ms(r['arrival_ms'], 'p50')} / {_ms(r['arrival_ms'], 'p99')} | "
                    f"{', '.join(f'{x:,.2f}' for x in reps) if reps else '–'} | "
                    f"{r['foreign_cores']:.2f} |"
                )
        add("")
        for k, v in LAG_DEFINITIONS.items():
            add(f"- *{k}*: {v}")
        add("")
    st = fig.get("startup")
    if st:
        add("**Start-up** (spawn → first request in the emulator's log)\n")
        add("| tool | median | runs |\n|---|---|---|")
        add(
            f"| replayer | {st['median_s'] * 1e3:,.0f} ms | "
            f"{', '.join(f'{x * 1e3:,.0f}' for x in st['runs_s'])} ms (python + imports alone: "
            f"{st['python_and_imports_s'] * 1e3:,.0f} ms) |"
        )
        ai = [
            e["aiperf"]["startup_s"]
            for e in (lag or {}).values()
            if isinstance(e.get("aiperf"), dict) and e["aiperf"].get("startup_s")
        ]
        un = [
            e["aiperf_unpinned"]["startup_s"]
            for e in (lag or {}).values()
            if isinstance(e.get("aiperf_unpinned"), dict) and e["aiperf_unpinned"].get("startup_s")
        ]
        if ai:
            add(
                f"| AIPerf | {statistics.median(ai):,.1f} s | "
                f"{', '.join(f'{x:,.1f}' for x in ai)} s (its fixed-schedule lag runs, pinned "
                "to one core"
                + (f"; unpinned: {', '.join(f'{x:,.1f}' for x in un)} s" if un else "")
                + ") |"
            )
        add("")
    tp = fig.get("throughput")
    if tp:
        add(
            "**Throughput on one core** (tool pinned to core 1; steady window = 5th–95th "
            "percentile of arrivals; CPU = whole process tree)\n"
        )
        add(
            "| tool / setting | req/s | tool CPU (cores) | req per CPU-s | emulator CPU | "
            "foreign load |"
        )
        add("|---|---|---|---|---|---|")
        for label, key in (
            ("replayer asap, strict, --max-inflight 64", "replayer_strict"),
            ("replayer asap, --order session, --max-inflight 64", "replayer_session"),
        ):
            r = tp.get(key)
            if r:
                add(
                    f"| {label} | {_f(r['req_per_s'])} | {_f(r['cpu_cores'], '.2f')} | "
                    f"{_f(r['req_per_cpu_s'])} | {r['emulator_cores']:.0%} | "
                    f"{r['foreign_cores']:.2f} |"
                )
        for name, r in (tp.get("aiperf_settings") or {}).items():
            if "unavailable" in r:
                add(f"| AIPerf {name} | AIPerf unavailable: {r['unavailable']} |||||")
                continue
            add(
                f"| AIPerf closed loop {name} | {_f(r['req_per_s'])} | "
                f"{_f(r['cpu_cores'], '.2f')} | {_f(r['req_per_cpu_s'])} | "
                f"{r['emulator_cores']:.0%} | {r['foreign_cores']:.2f} |"
            )
        c = tp.get("replayer_chunks")
        if c:
            add(
                f"| replayer asap, 256-token streams, --max-inflight 32 | "
                f"{_f(c['chunks_per_s'])} SSE chunks/s ({_f(c['req_per_s'])} req/s) | "
                f"{_f(c['client_cores_in_span'], '.2f')} | {_f(c['chunks_per_cpu_s'])} chunks | "
                f"{c['emulator_cores']:.0%} | {c['foreign_cores']:.2f} |"
            )
        ac = tp.get("aiperf_chunks")
        if ac and "unavailable" in ac:
            add(f"| AIPerf 256-token streams | AIPerf unavailable: {ac['unavailable']} |||||")
        elif ac:
            add(
                f"| AIPerf closed loop {ac['setting']}, 256-token streams | "
                f"{_f(ac['chunks_per_s'])} SSE chunks/s ({_f(ac['req_per_s'])} req/s) | "
                f"{_f(ac['client_cores_in_span'], '.2f')} | {_f(ac['chunks_per_cpu_s'])} chunks | "
                f"{ac['emulator_cores']:.0%} | {ac['foreign_cores']:.2f} |"
            )
        best = tp.get("aiperf_best")
        if best and tp.get("replayer_strict"):
            rs = tp["replayer_strict"]["req_per_cpu_s"]
            add(
                f"\nreplayer (strict) / AIPerf best ({best['setting']}): "
                f"**{rs / best['req_per_cpu_s']:.1f}x** requests per CPU-second"
                + (
                    "; 256-token streams: "
                    f"**{c['chunks_per_cpu_s'] / ac['chunks_per_cpu_s']:.1f}x**"
                    " SSE chunks per CPU-second"
                    if c and ac and "chunks_per_cpu_s" in ac
                    else ""
                )
                + ".\n"
            )
    kv = fig.get("kv_rss")
    if kv:
        add(
            "**Peak RSS, kv-cache-tester corpus** "
            f"(`replayer replay {kv['trace']} {' '.join(kv['args'])}`)\n"
        )
        add("| requests | bodies sent | largest body | peak RSS | req/s | wall |")
        add("|---|---|---|---|---|---|")
        other = {k: v for k, v in kv["status"].items() if k != "ok"}
        add(
            f"| {kv['replayed']:,} of {kv['trace_requests']:,} ({kv['ok']:,} ok"
            + "".join(f", {v:,} {k}" for k, v in other.items())
            + ") | "
            f"{kv['body_bytes_total'] / 1e9:.2f} GB | {kv['body_bytes_max'] / 1e6:.1f} MB | "
            f"{kv['peak_rss'] / 2**20:,.0f} MiB | {_f(kv['req_per_s'], '.1f')} | "
            f"{kv['wall_s']:.0f} s |"
        )
        errs = kv.get("errors") or {}
        if errs:
            add("")
        for err, n in errs.items():
            add(f"- not ok: {n:,} × {err}")
        add("")
    return "\n".join(lines)


def _git() -> dict[str, Any]:
    def run(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True)
        return r.stdout.strip()

    return {
        "head": run("rev-parse", "--short", "HEAD"),
        "replayer_dirty": bool(run("status", "--porcelain", "replayer")),
    }


def main(argv: list[str]) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench replay")
    p.add_argument("--quick", action="store_true", help="short version (~4 min)")
    p.add_argument("--no-aiperf", action="store_true", help="skip AIPerf")
    p.add_argument("--no-install", action="store_true", help="do not pip install AIPerf")
    p.add_argument(
        "--only", default="clients,lag,startup,throughput,kv", help="comma-separated parts to run"
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="before each run, wait up to this many seconds for other load to drop "
        "below 0.25 cores (default 6, quick 5)",
    )
    args = p.parse_args(argv)
    QUIET["max_wait"] = (
        args.quiet_wait if args.quiet_wait is not None else (5.0 if args.quick else 6.0)
    )
    quick = args.quick
    parts = set(args.only.split(","))
    WORK.mkdir(parents=True, exist_ok=True)
    fig: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "git": _git(),
        "loadavg_start": loadavg(),
        "busy_thread_share_core": {str(c): busy_share(c) for c in (EMU_CPU, TOOL_CPU)},
        "quick": quick,
        "lag_definitions": LAG_DEFINITIONS,
    }
    ap: AIPerf | None = None
    if not args.no_aiperf and parts & {"lag", "throughput"}:
        ap = ensure_aiperf(install=not args.no_install)
        fig["aiperf"] = {"ok": ap.ok, "reason": ap.reason, "version": ap.version}
        if not ap.ok:
            print(f"AIPerf unavailable: {ap.reason}", flush=True)
    t_start = time.monotonic()
    part_seconds: dict[str, float] = {}
    fig["part_seconds"] = part_seconds

    def part(name: str, what: str, fn: Callable[[], dict[str, Any]]) -> None:
        if name in parts:
            print(f"- {what}", flush=True)
            t0 = time.monotonic()
            fig[name if name != "kv" else "kv_rss"] = fn()
            part_seconds[name] = round(time.monotonic() - t0, 1)

    part(
        "clients",
        "client micro-benchmark (aiohttp vs httpx)",
        lambda: bench_clients(2.0 if quick else 5.0),
    )
    part(
        "lag",
        "schedule lag",
        lambda: bench_lag(
            [200.0, 1000.0, 3000.0],
            2.0 if quick else 6.0,
            1 if quick else 3,
            ap,
            unpinned_rates=() if quick else (1000.0,),
        ),
    )
    part("startup", "start-up", lambda: bench_startup(3 if quick else 5))
    settings = [["--concurrency", "64"]]
    if not quick:
        settings += [
            ["--concurrency", "64", "--workers-max", "2"],
            ["--concurrency", "64", "--export-level", "summary"],
        ]
    part(
        "throughput",
        "throughput on one core",
        lambda: bench_throughput(
            6000 if quick else 30000,
            300 if quick else 2000,
            2500 if quick else 5000,
            1 if quick else 2,
            ap,
            settings,
            n_aiperf_long=200 if quick else 800,
        ),
    )
    part("kv", "kv-cache-tester peak RSS", lambda: bench_kv_rss(150 if quick else 1000))
    fig["loadavg_end"] = loadavg()
    fig["bench_seconds"] = time.monotonic() - t_start
    print()
    print(render(fig))
    print(
        f"machine: {fig['cpus']} cores; load average at start "
        f"{' '.join(map(str, fig['loadavg_start']))}, at end "
        f"{' '.join(map(str, fig['loadavg_end']))}; busy-thread CPU share per core "
        + ", ".join(f"{k}: {v:.0%}" for k, v in fig["busy_thread_share_core"].items())
        + f"; git {fig['git']['head']}"
        + (" (replayer/ has uncommitted changes)" if fig["git"]["replayer_dirty"] else "")
    )
    return fig


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        client_child(sys.argv[2:])
    else:
        raise SystemExit("usage: python -m bench replay [-- ARGS]  (or: client KIND URL C S T)")
