"""Emulator throughput and start-up (issue 3): how fast the embedded default
target is, so later benchmarks know it is not their bottleneck.

* requests/s: non-streaming chat, 1 output token, a 1 KB prompt;
* SSE chunks/s (and tokens/s): streaming chat, 256 output tokens a request;
* start-up: process start to the first ``/health`` 200 with ``--load-time 0``.

The emulator runs with ``--speed instant --disable-uvicorn-access-log``,
pinned to one core; the client (aiohttp, this process) is pinned to another
core when there is one. Both CPU figures are reported: a client near 100%
means the client, not the emulator, was the limit. Emulator CPU comes from
its own ``process_cpu_seconds_total`` metric.

Run: ``python -m bench emulator`` (``-- --duration 3`` for a shorter run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from typing import Any

import aiohttp

from replayer.testing.emulator import EmulatorProcess

ARGS = ["--speed", "instant", "--disable-uvicorn-access-log", "--stats-interval", "0"]
MODEL = "moonshotai/Kimi-K3"


def pin(pid: int, cpu: int) -> bool:
    try:
        os.sched_setaffinity(pid, {cpu})
        return True
    except (AttributeError, OSError):
        return False


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def server_cpu(s: aiohttp.ClientSession, url: str) -> float:
    async with s.get(f"{url}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith("process_cpu_seconds_total"):
                return float(line.split()[-1])
    return float("nan")


async def load(
    url: str, body: dict[str, Any], concurrency: int, duration: float, stream: bool
) -> dict[str, float]:
    """Closed-loop load: ``concurrency`` workers send back-to-back requests."""
    conn = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        for _ in range(concurrency):  # warm the connection pool
            async with s.post(f"{url}/v1/chat/completions", json=body) as r:
                await r.read()
        cpu0, scpu0 = cpu_self(), await server_cpu(s, url)
        t0 = time.monotonic()
        deadline = t0 + duration
        done = [0]
        chunks = [0]
        errors = [0]

        async def worker() -> None:
            while time.monotonic() < deadline:
                async with s.post(f"{url}/v1/chat/completions", json=body) as r:
                    if r.status != 200:
                        errors[0] += 1
                    if stream:
                        async for data in r.content.iter_any():
                            chunks[0] += data.count(b"data: ")
                    else:
                        await r.read()
                done[0] += 1

        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(worker())
        wall = time.monotonic() - t0
        cpu1, scpu1 = cpu_self(), await server_cpu(s, url)
    server_cpu_s = scpu1 - scpu0
    return {
        "requests": done[0],
        "errors": errors[0],
        "seconds": wall,
        "requests_per_s": done[0] / wall,
        "chunks_per_s": chunks[0] / wall,
        "server_cpu": server_cpu_s / wall,
        "client_cpu": (cpu1 - cpu0) / wall,
        # What one fully available core sustains: work per emulator CPU-second.
        "requests_per_cpu_s": done[0] / server_cpu_s,
        "chunks_per_cpu_s": chunks[0] / server_cpu_s,
    }


def available_cpu(seconds: float = 0.5) -> float:
    """CPU share a busy thread actually gets here (1.0 on an idle machine)."""
    t0, c0 = time.monotonic(), time.process_time()
    while time.monotonic() - t0 < seconds:
        pass
    return (time.process_time() - c0) / (time.monotonic() - t0)


def startup_times(n: int) -> list[float]:
    out = []
    for _ in range(n):
        emu = EmulatorProcess([*ARGS, "--load-time", "0"], request_log=False)
        t0 = time.monotonic()
        emu.start()
        out.append(time.monotonic() - t0)
        emu.stop()
    return out


def main(argv: list[str]) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench emulator")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per load phase")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--startups", type=int, default=5)
    args = p.parse_args(argv)

    ncpu = os.cpu_count() or 1
    share = available_cpu()
    emu = EmulatorProcess(ARGS, request_log=False).start()
    try:
        server_pinned = pin(emu.pid, 0)
        client_pinned = ncpu > 1 and pin(0, 1)
        small = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 1000}]}
        unary = asyncio.run(
            load(emu.url, small | {"max_tokens": 1}, args.concurrency, args.duration, False)
        )
        stream_body = small | {"max_tokens": 256, "stream": True, "ignore_eos": True}
        streams = asyncio.run(
            load(emu.url, stream_body, args.concurrency // 2, args.duration, True)
        )
    finally:
        emu.stop()
    if client_pinned:
        os.sched_setaffinity(0, set(range(ncpu)))
    starts = startup_times(args.startups)
    tokens_per_s = streams["requests_per_s"] * 256
    figures: dict[str, Any] = {
        "cpus": ncpu,
        "busy_thread_cpu_share": share,
        "server_pinned_to_one_core": server_pinned,
        "client_pinned_to_other_core": client_pinned,
        "client": "aiohttp ClientSession, closed loop, in the bench process",
        "unary": unary,
        "stream": streams | {"tokens_per_s": tokens_per_s},
        "startup_s": starts,
        "startup_median_s": statistics.median(starts),
    }
    rows = [
        (
            f"non-streaming chat (1 token, 1 KB prompt, c={args.concurrency})",
            f"{unary['requests_per_s']:,.0f} req/s",
        ),
        (
            f"streaming chat (256 tokens, c={args.concurrency // 2})",
            f"{streams['chunks_per_s']:,.0f} SSE chunks/s, {tokens_per_s:,.0f} tokens/s, "
            f"{streams['requests_per_s']:,.1f} req/s",
        ),
        (
            "same, per emulator CPU-second (= one dedicated core)",
            f"{unary['requests_per_cpu_s']:,.0f} req/s; "
            f"{streams['chunks_per_cpu_s']:,.0f} SSE chunks/s",
        ),
        (
            "emulator CPU (unary / stream)",
            f"{unary['server_cpu']:.0%} / {streams['server_cpu']:.0%} of one core",
        ),
        (
            "client CPU (unary / stream)",
            f"{unary['client_cpu']:.0%} / {streams['client_cpu']:.0%} of one core",
        ),
        ("errors", str(unary["errors"] + streams["errors"])),
        ("CPU share a busy thread got on this machine", f"{share:.0%}"),
        (
            f"start-up to /health 200 (median of {len(starts)})",
            f"{figures['startup_median_s'] * 1000:,.0f} ms (min {min(starts) * 1000:,.0f} ms)",
        ),
    ]
    print("| emulator, --speed instant, pinned to one core | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return figures
