"""Loopback ports, and a replay whose requests take another way to the
target than its monitor (through a :class:`~replayer.testing.faultproxy.FaultProxy`)."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the port helpers stay light to import
    from replayer.monitor.watch import WatchConfig
    from replayer.replay.engine import Replay
    from replayer.replay.policy import ReplayPolicy
    from replayer.trace import Trace


def free_port() -> int:
    """A loopback port free right now (a server under test binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepting(port: int) -> bool:
    """Whether something accepts connections on loopback ``port`` now."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive loopback ports free right now (a pool
    file's ``port``: server i listens on port + i)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 60_000 - n)
        socks: list[socket.socket] = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {n} consecutive free ports")


async def replay_via(
    proxy_url: str,
    direct_url: str,
    trace: Trace,
    out: Path,
    watch: WatchConfig,
    *,
    policy: ReplayPolicy | None = None,
    rows: Sequence[int] | None = None,
) -> Replay:
    """Replay ``trace`` to ``proxy_url`` while the monitor reads the target
    at ``direct_url``, its own address past the proxy (a ``/health`` prober
    of another address is that address); the finished Replay."""
    from replayer.monitor.health import HealthMonitor
    from replayer.replay.client import Endpoint
    from replayer.replay.engine import Replay
    from replayer.replay.plan import build_plan, select
    from replayer.replay.policy import ReplayPolicy, Timing
    from replayer.replay.results import ResultsWriter

    policy = policy or ReplayPolicy(timing=Timing.ASAP, request_timeout=30)
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    writer = ResultsWriter(out / "results.arrow")
    prober = HealthMonitor(direct_url, interval=watch.health_interval, timeout=watch.health_timeout)
    replay = Replay(
        trace,
        build_plan(trace, list(rows) if rows is not None else select(trace), policy),
        policy,
        [Endpoint("e", proxy_url)],
        writer,
        watch=watch,
        out=out,
        probers={"e": prober},
    )
    try:
        await replay.run()
    finally:
        writer.close()
    return replay
