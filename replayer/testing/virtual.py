"""A replay on virtual time: a fake server and a fake ``/health`` prober
that live on a :class:`VirtualClock`.

With them the replay's scheduler and its watchdogs run without sockets, so
virtual time is the only time there is: every dispatch, token and probe
happens at an exact, scripted instant, whatever the machine's load, and a
test can assert times to the microsecond. :class:`FakeServer` is a
:class:`~replayer.replay.transport.Transport` (pass it as ``Replay(...,
transport=...)``); its :attr:`~FakeServer.arrivals` is its own log, in the
order it took the requests, of every target it serves.

**Usage** (a tiny trace: session ``a`` of two turns, ``b`` of one; each
request answered 10 ms after it arrives)::

    from replayer.replay.client import Endpoint
    from replayer.replay.engine import Replay
    from replayer.replay.plan import build_plan, select
    from replayer.replay.policy import ReplayPolicy
    from replayer.replay.results import ResultsWriter
    from replayer.testing import FakeServer, Script, VirtualClock
    from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter

    async def test_a_turn_waits_for_its_predecessor(tmp_path):
        path = tmp_path / "t.arrow"
        with TraceWriter(path, TraceMeta(source="test")) as w:
            # (request id, session, turn, recorded start and end in ms)
            for rid, s, k, start, end in (("a0", "a", 0, 0, 5), ("b0", "b", 0, 3, 4),
                                          ("a1", "a", 1, 10, 12)):
                body = {"model": "m", "prompt": rid, "max_tokens": 1}
                w.add(RequestRecord.from_body(body, request_id=rid, session_id=s, turn=k,
                                              start_us=start * 1000, end_us=end * 1000))
        trace = Trace.open(path)
        clock = VirtualClock(limit=3600)  # past an hour of virtual time: a deadlock
        server = FakeServer(clock, lambda rid: Script(ttft=0.010, tokens=1))
        policy = ReplayPolicy()  # recorded timing, strict order
        writer = ResultsWriter(tmp_path / "results.arrow")
        replay = Replay(trace, build_plan(trace, select(trace), policy), policy,
                        [Endpoint("e", "http://e")], writer, clock=clock, transport=server)
        await replay.run()
        writer.close()
        # a1 goes once a0 is done (10 ms) plus its recorded think gap (5 ms)
        assert server.order() == ["a0", "b0", "a1"]
        assert [round((a.at - replay.t0) * 1e6) for a in server.arrivals] == [0, 3_000, 15_000]
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from replayer._clock import VirtualClock
from replayer.monitor.health import Probe
from replayer.replay.results import Status
from replayer.replay.transport import Request, Transport

__all__ = ["Arrival", "FakeHealth", "FakeServer", "Script", "VirtualClock"]


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
    """Seconds between tokens."""
    status: int = 200
    """Non-200: an error body instead of tokens."""
    hang_after: int | None = None
    """Stop after this many tokens and never finish (a hung engine); 0:
    after the response headers."""


@dataclass(frozen=True)
class Arrival:
    """One request as the fake server took it."""

    at: float
    """Clock time the server took the request (subtract the replay's
    ``t0`` for the time after T0)."""
    url: str
    request_id: str
    """Its ``X-Request-Id`` header (the trace's request id)."""
    session: str | None
    """Its ``X-Session-Id`` header."""
    body: dict[str, Any]


def _default_script(request_id: str) -> Script:
    return Script()


@dataclass
class FakeServer(Transport):
    """A transport whose server answers on ``clock``, as ``script`` says
    for each request id; never a socket.

    A request arrives once its connection is open (``Script.connect``) and
    its turn came (strict order); ``sent`` resolves then, ``answered`` with
    the response headers, ``ttft`` later. Results carry the times and
    status a real server's exchange would give (``http_<status>`` for an
    error), with ``chunks`` = tokens."""

    clock: VirtualClock
    script: Callable[[str], Script] = _default_script
    arrivals: list[Arrival] = field(default_factory=list)

    async def handle(self, request: Request) -> None:
        result, stats, clock, t0 = request.result, request.stats, self.clock, request.t0

        def us() -> int:
            return round((clock.now() - t0) * 1e6)

        rid = request.headers["X-Request-Id"]
        s = self.script(rid)
        if s.connect:
            await clock.sleep(s.connect)
        if request.go is not None and not await request.go():  # its turn never came
            request.release()
            return
        self.arrivals.append(
            Arrival(
                clock.now(),
                request.url,
                rid,
                request.headers.get("X-Session-Id"),
                orjson.loads(request.body),
            )
        )
        try:
            if request.sent is not None:
                request.sent.set_result(None)
            await clock.sleep(s.ttft)
            result.first_byte_us, result.http_status = us(), s.status
            if request.answered is not None:
                request.answered.set_result(None)
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
            request.release()
        result.done_us = us()

    def order(self, target: str = "") -> list[str]:
        """Request ids in the order the server took them (of the target
        whose URL starts with ``target``; all by default)."""
        return [a.request_id for a in self.arrivals if a.url.startswith(target)]


def _always_healthy(t: float) -> int | str:
    return 200


@dataclass
class FakeHealth:
    """A ``/health`` prober (a :class:`~replayer.monitor.watch.Health`, for
    ``Replay(..., probers={name: ...})``) whose answer at each time (seconds
    after T0) is scripted: a status code, or an error such as
    ``"refused"`` or ``"timeout"``."""

    clock: VirtualClock
    answer: Callable[[float], int | str] = _always_healthy
    latency: float = 0.001
    """How long a probe takes."""
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
