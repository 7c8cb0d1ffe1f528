"""Idle connections: what 1,000 open, silent client connections cost
``replayer record`` and ``replayer serve``.

Setup: one emulator (``--speed instant``), one ``replayer record``
subprocess in front of it and one ``replayer serve`` subprocess, each
started with a soft open-files limit of 1,024 (they raise it themselves)
and ``$REPLAYER_CLIENT_TIMEOUT`` long enough that the idle connections stay
for the whole run. An aiohttp client in this process.

* **Latency** (concurrency 1, one keep-alive connection per path, direct and
  proxied requests interleaved one by one so drift hits both alike): a
  non-streaming chat request (~1 KB prompt, 4 tokens), send to last byte.
  *Added* is a percentile of the proxied distribution minus the same
  percentile of the direct one, with 0 and with ``--idle`` connections open
  to the recorder.
* **RSS** (``VmRSS``) of the recorder after each latency run, and just
  after the idle connections are accepted (the process's descriptor count
  has grown by them): per connection, that step over their number. Of
  serve, before and after the idle connections are accepted.

Run: ``python -m bench idle_conns`` (``-- --idle 1000 --requests 400``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from replayer.service.launcher import ServeProcess
from replayer.testing.emulator import EmulatorProcess, poll_until
from tests.helpers.target import with_soft_nofile

SOFT_NOFILE = 1024
WAIT = "3600"
"""``$REPLAYER_CLIENT_TIMEOUT``: the idle connections must outlive the run."""
BODY = {
    "model": "moonshotai/Kimi-K3",
    "messages": [{"role": "user", "content": "why is the build red? " * 48}],
    "max_tokens": 4,
}


class SoftServe(ServeProcess):
    def command(self) -> list[str]:
        return with_soft_nofile(super().command(), SOFT_NOFILE)


class Recorder:
    def __init__(self, upstream: str, out: Path) -> None:
        self.port_file = out.with_suffix(".port")
        cmd = [sys.executable, "-m", "replayer", "record", "--upstream", upstream, "-o", str(out)]
        cmd += ["--listen", "127.0.0.1:0", "--port-file", str(self.port_file), "--progress", "0"]
        env = {**os.environ, "REPLAYER_CLIENT_TIMEOUT": WAIT}
        self.proc = subprocess.Popen(
            with_soft_nofile(cmd, SOFT_NOFILE), stderr=subprocess.PIPE, text=True, env=env
        )
        poll_until(
            lambda: self.port_file.exists() and self.port_file.read_text().endswith("\n"),
            60,
            what="the recorder's port",
        )
        self.url = f"http://127.0.0.1:{int(self.port_file.read_text())}"

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        return err


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def open_idle(url: str, n: int, pid: int) -> list[socket.socket]:
    """``n`` silent connections, returned once the server has accepted them all."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    base = open_files(pid)
    socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(n)]
    poll_until(lambda: open_files(pid) >= base + n - 3, 120, what=f"{n} connections accepted")
    return socks


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


async def latency(urls: dict[str, str], n: int) -> dict[str, list[float]]:
    """Seconds per request for each URL, requests interleaved one by one."""
    out: dict[str, list[float]] = {k: [] for k in urls}
    conns = {k: aiohttp.TCPConnector(limit=1) for k in urls}
    sessions = {k: aiohttp.ClientSession(connector=c) for k, c in conns.items()}
    try:
        for i in range(n + 20):  # the first 20: warm-up, not counted
            for name, url in urls.items():
                t0 = time.perf_counter()
                async with sessions[name].post(f"{url}/v1/chat/completions", json=BODY) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: HTTP {r.status}")
                if i >= 20:
                    out[name].append(time.perf_counter() - t0)
    finally:
        for s in sessions.values():
            await s.close()
    return out


def summary(lat: dict[str, list[float]]) -> dict[str, float]:
    """p50/p99 ms direct and proxied, and what the proxy adds."""
    d, p = lat["direct"], lat["proxied"]
    return {
        "direct_p50_ms": pct(d, 50) * 1e3,
        "direct_p99_ms": pct(d, 99) * 1e3,
        "proxied_p50_ms": pct(p, 50) * 1e3,
        "proxied_p99_ms": pct(p, 99) * 1e3,
        "added_p50_ms": (pct(p, 50) - pct(d, 50)) * 1e3,
        "added_p99_ms": (pct(p, 99) - pct(d, 99)) * 1e3,
        "added_mean_ms": (statistics.mean(p) - statistics.mean(d)) * 1e3,
    }


def main(argv: list[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench idle_conns")
    ap.add_argument("--idle", type=int, default=1000, help="idle connections to open")
    ap.add_argument("--requests", type=int, default=400, help="latency samples per path")
    args = ap.parse_args(argv)
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * args.idle + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))

    tmp = Path(tempfile.mkdtemp(prefix="replayer-bench-idle-"))
    emu = EmulatorProcess(["--speed", "instant"], request_log=False).start()
    rec = Recorder(emu.url, tmp / "bench.arrow")
    pid = rec.proc.pid
    figures: dict[str, Any] = {"idle": args.idle, "requests": args.requests}
    socks: list[socket.socket] = []
    try:
        urls = {"direct": emu.url, "proxied": rec.url}
        asyncio.run(latency(urls, 50))  # pools, caches and the trace writer warmed up
        lat = summary(asyncio.run(latency(urls, args.requests)))
        rss_a = rss_kib(pid)
        figures["recorder_0_idle"] = {"rss_mib": rss_a / 1024, **lat}
        socks = open_idle(rec.url, args.idle, pid)
        rss_b = rss_kib(pid)
        lat = summary(asyncio.run(latency(urls, args.requests)))
        rss_c = rss_kib(pid)
        figures["recorder_idle"] = {
            "rss_accepted_mib": rss_b / 1024,
            "rss_mib": rss_c / 1024,
            **lat,
        }
        figures["recorder_rss_per_idle_kib"] = (rss_b - rss_a) / args.idle
        for s in socks:
            s.close()
        socks = []
        err = rec.stop()
        if rec.proc.returncode != 0:
            raise RuntimeError(f"recorder exited {rec.proc.returncode}: {err[-2000:]}")
    finally:
        for s in socks:
            s.close()
        if rec.proc.poll() is None:
            rec.proc.kill()
        emu.stop()

    data = tmp / "serve-data"
    env = {"REPLAYER_CLIENT_TIMEOUT": WAIT}
    with SoftServe(data, token="b" * 32, env=env, startup_timeout=60) as srv:
        spid = srv.proc.pid if srv.proc is not None else 0
        before = rss_kib(spid)
        socks = open_idle(srv.url, args.idle, spid)
        try:
            after = rss_kib(spid)
        finally:
            for s in socks:
                s.close()
    figures["serve"] = {
        "rss_0_idle_mib": before / 1024,
        "rss_idle_mib": after / 1024,
        "rss_per_idle_kib": (after - before) / args.idle,
    }
    print_table(figures)
    return figures


def print_table(f: dict[str, Any]) -> None:
    n = f["idle"]
    print(f"| recorder, {f['requests']} requests per path | 0 idle | {n} idle |")
    print("|---|---|---|")
    a, b = f["recorder_0_idle"], f["recorder_idle"]
    for key, label in (
        ("rss_mib", "RSS MiB"),
        ("direct_p50_ms", "direct p50 ms"),
        ("proxied_p50_ms", "proxied p50 ms"),
        ("added_p50_ms", "added p50 ms"),
        ("direct_p99_ms", "direct p99 ms"),
        ("proxied_p99_ms", "proxied p99 ms"),
        ("added_p99_ms", "added p99 ms"),
    ):
        print(f"| {label} | {a[key]:.2f} | {b[key]:.2f} |")
    print(f"| RSS once the idle ones are accepted | | {b['rss_accepted_mib']:.2f} |")
    print(f"| RSS per idle connection | | {f['recorder_rss_per_idle_kib']:.1f} KiB |")
    s = f["serve"]
    print(
        f"\nserve RSS: {s['rss_0_idle_mib']:.1f} MiB with 0 idle, {s['rss_idle_mib']:.1f} MiB "
        f"with {n} idle ({s['rss_per_idle_kib']:.1f} KiB per connection)"
    )
