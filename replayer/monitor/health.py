"""``/health`` probing: a timeline of what the server said, and when.

vLLM answers 200 with an empty body while the engine lives (even when it is
hung: there is no liveness probe into the GPU), 503 once the engine is dead,
and nothing (connection refused) once the API process has exited. Each probe
is recorded with its latency; consecutive failures are counted.

vLLM's fault tolerance (``--enable-fault-tolerance``) adds a state between:
a faulting engine is left UNHEALTHY (its requests aborted, new ones held
until an operator's ``retry`` or the recovery timeout) while ``/health``
still answers 200 (vLLM 0.32 answers 503 only for a dead engine). Only
``GET /fault_tolerance/status`` says so (``{"engines": [{"id": 0, "status":
"unhealthy", "fault_info": "RuntimeError"}]}``), so each probe that got an
answer also reads it, until the server shows it has no such route (404: fault
tolerance off), and records the engine's state.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from replayer._async import wait_event
from replayer._http import out_of_fds

FT_STATUS_PATH = "/fault_tolerance/status"
"""vLLM's fault-tolerance status route (present with ``--enable-fault-tolerance``)."""


def engine_state(body: Any) -> tuple[str | None, str | None]:
    """(state, fault) from a ``/fault_tolerance/status`` body: ``unhealthy``
    when any engine is, else ``dead``, else ``healthy``; the first unhealthy
    engine's ``fault_info``. (None, None) for a body of another shape."""
    engines = body.get("engines") if isinstance(body, dict) else None
    if not isinstance(engines, list):
        return None, None
    states = [e for e in engines if isinstance(e, dict)]
    for want in ("unhealthy", "dead"):
        hit = next((e for e in states if e.get("status") == want), None)
        if hit is not None:
            fault = hit.get("fault_info")
            return want, str(fault) if fault else None
    return "healthy", None


@dataclass(frozen=True, slots=True)
class Probe:
    t: float
    """Seconds after the replay's anchor T0 (negative: before it)."""
    status: int | None
    """HTTP status, or None when no answer came."""
    latency: float
    error: str | None = None
    """``refused``, ``timeout`` or another transport failure."""
    engine: str | None = None
    """The engine's state by ``/fault_tolerance/status`` (``healthy``,
    ``unhealthy``, ``dead``); None where the server has no such route."""
    fault: str | None = None
    """An unhealthy engine's ``fault_info`` (the exception type)."""

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def unhealthy(self) -> bool:
        """Alive but reporting a faulted engine (vLLM fault tolerance)."""
        return self.engine == "unhealthy"

    def to_dict(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 6),
            "status": self.status,
            "latency_ms": round(self.latency * 1000, 3),
            "error": self.error,
            **({"engine": self.engine} if self.engine is not None else {}),
            **({"fault": self.fault} if self.fault is not None else {}),
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
    fault_tolerance: bool | None = None
    """Whether the server has ``/fault_tolerance/status`` (None: not known yet)."""
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
        engine = fault = None
        if status is not None and self.fault_tolerance is not False:
            engine, fault = await self._engine_state()
        p = Probe(
            t=start - self.t0,
            status=status,
            latency=loop.time() - start,
            error=error,
            engine=engine,
            fault=fault,
        )
        self.timeline.append(p)
        if p.error != "client_resources":  # says nothing about the server
            self.consecutive_failures = 0 if p.ok else self.consecutive_failures + 1
        return p

    async def _engine_state(self) -> tuple[str | None, str | None]:
        """The engine's state by ``/fault_tolerance/status``; a 404 (or a body
        that is not its JSON) means the server has none: never asked again."""
        assert self._session is not None
        try:
            async with self._session.get(
                self.url.rstrip("/") + FT_STATUS_PATH,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as resp:
                body = await resp.read()
                if resp.status != 200:
                    if resp.status in (404, 405):
                        self.fault_tolerance = False
                    return None, None
        except (aiohttp.ClientError, TimeoutError):
            return None, None
        try:
            state = engine_state(orjson.loads(body))
        except orjson.JSONDecodeError:
            state = (None, None)
        self.fault_tolerance = state[0] is not None
        return state

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
