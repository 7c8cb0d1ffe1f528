"""A fake server and a fake ``/health`` prober that live on a VirtualClock.

With them the replay scheduler and the watchdogs run without sockets, so
virtual time is the only time there is: every dispatch, token and probe
happens at an exact, scripted instant, whatever the machine's load. The fake
server's ``arrivals`` is its own log, in the order it took the requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from replayer._clock import VirtualClock
from replayer.monitor.health import Probe
from replayer.replay.results import Result, Status
from replayer.wire import Reply


@dataclass(frozen=True)
class Script:
    """How the fake server answers one request."""

    connect: float = 0.0
    """The connection takes this long to open; the request arrives (is
    written) once it is open and its turn has come."""
    ttft: float = 0.010
    """Response headers and the first token come this long after arrival."""
    tokens: int = 3
    itl: float = 0.005
    status: int = 200
    """Non-200: an error body instead of tokens."""
    hang_after: int | None = None
    """Stop after this many tokens and never finish (a hung engine)."""


@dataclass(frozen=True)
class Arrival:
    at: float
    """Clock time the server took the request."""
    url: str
    request_id: str
    session: str | None
    body: dict[str, Any]


@dataclass
class FakeServer:
    """A :class:`~replayer.replay.engine.Sender` that answers on ``clock``."""

    clock: VirtualClock
    script: Callable[[str], Script] = lambda rid: Script()
    arrivals: list[Arrival] = field(default_factory=list)

    async def __call__(
        self,
        session: Any,
        url: str,
        body: bytes,
        headers: dict[str, str],
        result: Result,
        *,
        t0: float,
        request_timeout: float,
        keep_text: bool = False,
        sent: asyncio.Future[None] | None = None,
        answered: asyncio.Future[None] | None = None,
        stats: Reply | None = None,
        go: Callable[[], Awaitable[bool]] | None = None,
    ) -> Reply:
        stats = stats if stats is not None else Reply()
        clock = self.clock

        def us() -> int:
            return round((clock.now() - t0) * 1e6)

        rid = headers["X-Request-Id"]
        s = self.script(rid)
        if s.connect:
            await clock.sleep(s.connect)
        if go is not None and not await go():  # its turn never came: not sent
            for fut in (sent, answered):
                if fut is not None and not fut.done():
                    fut.set_result(None)
            return stats
        self.arrivals.append(
            Arrival(clock.now(), url, rid, headers.get("X-Session-Id"), orjson.loads(body))
        )
        try:
            if sent is not None:
                sent.set_result(None)
            await clock.sleep(s.ttft)
            result.first_byte_us, result.http_status = us(), s.status
            if answered is not None:
                answered.set_result(None)
            if s.hang_after == 0:
                await asyncio.get_running_loop().create_future()  # until aborted
            if s.status != 200:
                result.status, result.error_class = Status.HTTP_ERROR, f"http_{s.status}"
                result.error = "planted"
            else:
                for k in range(s.tokens):
                    if k:
                        await clock.sleep(s.itl)
                    else:
                        result.first_token_us = us()
                    stats.output(clock.now())
                    if s.hang_after is not None and k + 1 >= s.hang_after:
                        await asyncio.get_running_loop().create_future()  # until aborted
                result.status, result.chunks = Status.OK, s.tokens
        finally:
            for fut in (sent, answered):
                if fut is not None and not fut.done():
                    fut.set_result(None)
        result.done_us = us()
        return stats

    def order(self, target: str = "") -> list[str]:
        """Request ids in the order the server took them (of one target URL)."""
        return [a.request_id for a in self.arrivals if a.url.startswith(target)]


@dataclass
class FakeHealth:
    """A ``/health`` prober whose answer at each time (seconds after T0) is
    scripted: a status code, or an error such as ``"refused"``."""

    clock: VirtualClock
    answer: Callable[[float], int | str] = lambda t: 200
    latency: float = 0.001
    timeout: float | None = None
    """How long a ``"timeout"`` answer takes (the prober's bound; default
    ``latency``)."""
    t0: float = 0.0
    timeline: list[Probe] = field(default_factory=list)
    consecutive_failures: int = 0
    closed: bool = False

    async def probe(self) -> Probe:
        start = self.clock.now()
        a = self.answer(start - self.t0)
        took = self.timeout if a == "timeout" and self.timeout is not None else self.latency
        await self.clock.sleep(took)
        status, error = (a, None) if isinstance(a, int) else (None, a)
        p = Probe(t=start - self.t0, status=status, latency=took, error=error)
        self.timeline.append(p)
        self.consecutive_failures = 0 if p.ok else self.consecutive_failures + 1
        return p

    def last(self) -> Probe | None:
        return self.timeline[-1] if self.timeline else None

    def around(self, t: float, before: float = 30.0, after: float = 30.0) -> list[Probe]:
        return [p for p in self.timeline if t - before <= p.t <= t + after]

    async def close(self) -> None:
        self.closed = True
