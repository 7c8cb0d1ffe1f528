"""``/health`` probing: a timeline of what the server said, and when.

vLLM answers 200 with an empty body while the engine lives (even when it is
hung: there is no liveness probe into the GPU), 503 once the engine is dead,
and nothing (connection refused) once the API process has exited. Each probe
is recorded with its latency; consecutive failures are counted.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from replayer._async import wait_event
from replayer._http import out_of_fds


@dataclass(frozen=True, slots=True)
class Probe:
    t: float
    """Seconds after the replay's anchor T0 (negative: before it)."""
    status: int | None
    """HTTP status, or None when no answer came."""
    latency: float
    error: str | None = None
    """``refused``, ``timeout`` or another transport failure."""

    @property
    def ok(self) -> bool:
        return self.status == 200

    def to_dict(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 6),
            "status": self.status,
            "latency_ms": round(self.latency * 1000, 3),
            "error": self.error,
        }


@dataclass
class HealthMonitor:
    """Polls ``url/health`` every ``interval`` seconds (each probe bounded by
    ``timeout``) until stopped."""

    url: str
    interval: float = 1.0
    timeout: float = 2.0
    t0: float = 0.0
    """Loop time of the anchor the probe times are relative to."""
    timeline: list[Probe] = field(default_factory=list)
    consecutive_failures: int = 0
    _session: aiohttp.ClientSession | None = None

    async def probe(self) -> Probe:
        loop = asyncio.get_running_loop()
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=2, force_close=True)
            )
        start = loop.time()
        status: int | None = None
        error: str | None = None
        try:
            async with self._session.get(
                self.url.rstrip("/") + "/health", timeout=aiohttp.ClientTimeout(total=self.timeout)
            ) as resp:
                status = resp.status
                await resp.read()
        except aiohttp.ClientConnectorError as exc:
            error = "client_resources" if out_of_fds(exc) else "refused"
        except TimeoutError:
            error = "timeout"
        except aiohttp.ClientError as exc:
            error = type(exc).__name__
        p = Probe(t=start - self.t0, status=status, latency=loop.time() - start, error=error)
        self.timeline.append(p)
        if p.error != "client_resources":  # says nothing about the server
            self.consecutive_failures = 0 if p.ok else self.consecutive_failures + 1
        return p

    async def run(self, stop: asyncio.Event) -> None:
        """Probe until ``stop`` is set; the first probe is immediate."""
        try:
            while not stop.is_set():
                await self.probe()
                await wait_event(stop, self.interval)
        finally:
            await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def last(self) -> Probe | None:
        return self.timeline[-1] if self.timeline else None

    def around(self, t: float, before: float = 30.0, after: float = 30.0) -> list[Probe]:
        return [p for p in self.timeline if t - before <= p.t <= t + after]


def wall_anchor() -> dict[str, float]:
    """Wall-clock and monotonic readings taken together, to relate run times."""
    return {"unix": time.time(), "monotonic": time.monotonic()}
