"""Watching one target during a replay: health, metrics, progress, verdict.

A :class:`TargetWatch` runs beside a target's dispatch: it probes
``/health``, scrapes metrics, and runs the hang watchdog. When the target
fails (the engine reports the first failing request, or health alone shows
the engine dead or the process gone), it keeps probing through a settle
window, then classifies the failure (:mod:`replayer.monitor.classify`) and
assembles the report: when, the first failing request, what was in flight
and recently completed, the health timeline around it, and the last metrics
before it.

The watchdog fires ``hang`` when no in-flight request has made token
progress for ``stall_timeout`` seconds while the server still answers
``/health`` 200 - or no longer answers it at all (its last
``health_failures`` probes timed out: the API server's event loop is stuck
too, which a 503 or a refused connection is not) - and only once every
request still waiting for its first token has waited past its prefill
allowance (``stall_timeout + input tokens / min_prefill_rate``): a long
prefill sends no bytes for minutes, and that is not a hang. It wakes at the
moment that rule would hold (at the latest a tick later, to see new
requests), so it fires at its threshold, not up to a tick after it.

All times are read from one :class:`~replayer._clock.Clock` (the engine's),
so the watch runs on a test's virtual clock as exactly as the scheduler.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from replayer._async import spawn
from replayer._clock import REAL, Clock
from replayer.monitor.classify import Evidence, FailureClass, classify, is_engine_death_message
from replayer.monitor.health import HealthMonitor, Probe
from replayer.monitor.metrics import MetricsScraper, MetricsWriter
from replayer.monitor.metrics import counter_sum as gauge_sum
from replayer.options.monitor import WatchConfig as WatchConfig

log = logging.getLogger("replayer.monitor")

HEALTH_200 = "while /health stays 200"


@dataclass
class InFlight:
    """A request on the wire, as the watchdog sees it."""

    index: int
    request_id: str
    dispatched: float
    """Seconds after T0."""
    input_tokens: int
    stats: Any
    """Its :class:`~replayer.wire.Reply` (``first_token``,
    ``last_token`` in clock time)."""


class ProcessProbe(Protocol):
    """A launched server process, when replayer owns it."""

    def exited(self) -> bool: ...


class Health(Protocol):
    """What the watch needs of a ``/health`` prober (:class:`HealthMonitor`;
    a test's scripted fake)."""

    t0: float
    timeline: list[Probe]
    consecutive_failures: int

    async def probe(self) -> Probe: ...

    def last(self) -> Probe | None: ...

    def around(self, t: float, before: float = 30.0, after: float = 30.0) -> list[Probe]: ...

    async def close(self) -> None: ...


@dataclass
class FailureReport:
    failure_class: FailureClass
    at: float
    request_id: str | None
    seq: int | None
    kind: str
    message: str
    inflight: list[str]
    recent: list[str]
    health: list[Probe]
    metrics_file: str | None = None
    health_stalled: bool = False
    """A hang during which ``/health`` stopped answering too."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.failure_class.value,
            "at_s": round(self.at, 6),
            "request_id": self.request_id,
            "seq": self.seq,
            "kind": self.kind,
            "message": self.message,
            "inflight": self.inflight,
            "recent": self.recent,
            "health": [p.to_dict() for p in self.health],
            "metrics_snapshot": self.metrics_file,
            **({"health_stalled": True} if self.health_stalled else {}),
        }


@dataclass
class TargetWatch:
    """The monitor of one target for one replay."""

    name: str
    url: str
    config: WatchConfig
    inflight: dict[int, InFlight]
    on_failure: Callable[[str, str], None]
    """Called as ``(kind, message)`` when the watch itself fails the target."""
    abort: Callable[[], None]
    """Cancels the requests in flight (after a hang)."""
    writer: MetricsWriter | None = None
    process: ProcessProbe | None = None
    out: Path | None = None
    recent: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=32))
    hang: bool = False
    health_stalled: bool = False
    """The hang was called while ``/health`` timed out (not while it said 200)."""
    failed_at: float | None = None
    death_bodies: int = 0
    clock: Clock = REAL
    direct_url: str | None = None
    """The target's own address, when requests reach it through a hop (a
    proxy, a tunnel): ``/health`` and ``/metrics`` are read there, so a
    broken way to a healthy target is told from a crash (``network``). A
    :class:`HealthMonitor` of another address than ``url`` given as
    ``prober`` is that address."""
    prober: InitVar[Health | None] = None
    """The ``/health`` prober; default a :class:`HealthMonitor` of
    ``direct_url`` or else ``url``."""
    health: Health = field(init=False)
    scraper: MetricsScraper = field(init=False)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    t0: float = 0.0

    def __post_init__(self, prober: Health | None) -> None:
        c = self.config
        other = isinstance(prober, HealthMonitor) and prober.url.rstrip("/") != self.url.rstrip("/")
        if self.direct_url is None and other:
            assert isinstance(prober, HealthMonitor)
            self.direct_url = prober.url
        self.health = prober or HealthMonitor(
            self.direct_url or self.url, interval=c.health_interval, timeout=c.health_timeout
        )
        sources = ([self.metrics_url] if c.scrape_target else []) + list(c.scrape)
        self.scraper = MetricsScraper(sources, self.writer, interval=c.scrape_interval)

    async def prime(self) -> None:
        """Before T0: the target's counters as they stand (see MetricsScraper.prime)."""
        if self.config.scrape_target:
            await self.scraper.prime()

    def start(self, t0: float) -> None:
        self.t0 = t0
        self.health.t0 = t0
        self.scraper.anchor(t0)
        self._tasks = [
            spawn(self._health_loop(), name=f"health-{self.name}"),
            spawn(self._watchdog(), name=f"watchdog-{self.name}"),
        ]
        if self.scraper.sources:
            self._tasks.append(spawn(self.scraper.run(self._stop), name=f"scrape-{self.name}"))

    @property
    def metrics_url(self) -> str:
        """The target's own ``/metrics`` (past any hop)."""
        return (self.direct_url or self.url).rstrip("/") + "/metrics"

    def now(self) -> float:
        """Seconds since T0."""
        return self.clock.now() - self.t0

    def completed(self, request_id: str, failed_message: str | None) -> None:
        """The engine reports every settled request (for ``recent``)."""
        self.recent.append((self.now(), request_id))
        if is_engine_death_message(failed_message):
            self.death_bodies += 1

    def mark_failed(self, at: float) -> None:
        if self.failed_at is None:
            self.failed_at = at

    async def _health_loop(self) -> None:
        c = self.config
        unhealthy = 0
        while not self._stop.is_set():
            p = await self.health.probe()
            unhealthy = unhealthy + 1 if p.unhealthy else 0
            if self.failed_at is None and unhealthy >= c.health_failures:
                self.on_failure(
                    "health",
                    f"engine unhealthy ({p.fault or 'no fault info'}): "
                    f"/fault_tolerance/status on {c.health_failures} probes in a row, "
                    f"/health {p.status}",
                )
            if (
                self.failed_at is None
                and self.health.consecutive_failures >= c.health_failures
                and (p.status == 503 or p.error == "refused")
            ):
                what = "engine dead: /health 503" if p.status == 503 else "connection refused"
                self.on_failure("health", f"{what} on {c.health_failures} probes in a row")
            await self.clock.sleep(c.health_interval, self._stop)

    def _stall_due(self) -> float | None:
        """When (clock time) the hang rule of the module docstring holds if
        nothing changes: the last token progress plus ``stall_timeout``, and
        no earlier than every prefill's allowance. None: nothing in flight."""
        c = self.config
        if not self.inflight:
            return None
        last_progress = max((self.t0 + t for t, _ in self.recent), default=self.t0)
        due = last_progress
        for f in self.inflight.values():
            st = f.stats
            if st.last_token is not None:
                last_progress = max(last_progress, st.last_token)
            else:
                sent = self.t0 + f.dispatched
                due = max(due, sent + c.stall_timeout + f.input_tokens / c.min_prefill_rate)
                last_progress = max(last_progress, sent)
        return max(due, last_progress + c.stall_timeout)

    def _stalled(self, now: float) -> str | None:
        """The watchdog's rule, at clock time ``now``: due, and what /health
        says allows a hang: ``"200"``, or ``"stalled"`` when its last
        ``health_failures`` probes all timed out. None: no hang (not due, or
        /health says dead or refused, or one probe timed out: a busy server)."""
        due = self._stall_due()
        if due is None or now < due:
            return None
        last = self.health.last()
        if last is None:
            return None
        if last.ok:
            return "200"
        recent = self.health.timeline[-self.config.health_failures :]
        if len(recent) == self.config.health_failures and all(p.error == "timeout" for p in recent):
            return "stalled"
        return None

    async def _watchdog(self) -> None:
        tick = min(0.5, self.config.stall_timeout / 4)
        while True:
            now = self.clock.now()
            due = self._stall_due()
            wake = now + tick if due is None or due <= now else min(due, now + tick)
            if not await self.clock.sleep_until(wake, self._stop):
                return
            health = self._stalled(self.clock.now()) if self.failed_at is None else None
            if health is not None:
                self.hang = True
                self.health_stalled = health == "stalled"
                self.on_failure(
                    "hang",
                    f"no token progress on {len(self.inflight)} in-flight request(s) for "
                    f"{self.config.stall_timeout:g} s {self._while()}",
                )
                self.abort()

    def _while(self) -> str:
        """The hang message's account of ``/health``."""
        if not self.health_stalled:
            return HEALTH_200
        t = self.config.health_timeout
        return f"while /health stopped answering too (probes time out after {t:g} s)"

    async def grace_period(self) -> None:
        """No failure yet: watch ``grace`` more seconds for a late one."""
        if self.failed_at is not None or self.config.grace <= 0:
            return
        clock = self.clock
        deadline = clock.now() + self.config.grace
        for _ in range(100_000):
            if self.failed_at is not None or clock.now() >= deadline:
                return
            if self.process is not None and self.process.exited():
                self.on_failure("exit", "the server process exited after the last request")
                return
            await clock.sleep_until(min(clock.now() + 0.05, deadline))

    async def settle(self) -> None:
        """After a failure: probe until the process is gone or the settle
        window has passed, so the verdict does not depend on timing."""
        if self.failed_at is None:
            return
        clock = self.clock
        deadline = self.t0 + self.failed_at + self.config.settle
        for _ in range(10_000):
            if clock.now() >= deadline:
                break
            if self.process is not None and self.process.exited():
                break
            last = self.health.last()
            if last is not None and last.error == "refused" and last.t >= self.failed_at:
                break
            await clock.sleep_until(min(clock.now() + 0.1, deadline))
        if self.direct_url is not None and self.config.scrape_target:
            await self.scraper.final()  # is it idle now? (see _idle)

    async def stop(self) -> None:
        self._stop.set()
        # a probe in flight can wait out its whole timeout (a stalled API):
        # its answer no longer matters
        for t in self._tasks[:1]:  # the health loop (see start)
            t.cancel()
        try:
            for t in self._tasks:
                try:
                    await t
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # our caller is being cancelled, not just this watcher
        finally:
            await self.health.close()  # a cancelled trial's too: else its session leaks
        if self.failed_at is None and self.config.scrape_target:
            await self.scraper.final()

    def prefix_cache(self) -> dict[str, float] | None:
        """Prefix-cache hits and queries (tokens) over the run, from the
        server's own counters: vLLM reports per-request cached tokens only
        with ``--enable-prompt-tokens-details``, its counters always."""
        url = self.metrics_url
        hits = self.scraper.counter_delta(url, "vllm:prefix_cache_hits_total")
        queries = self.scraper.counter_delta(url, "vllm:prefix_cache_queries_total")
        if hits is None or queries is None:
            return None
        return {"hits": hits, "queries": queries}

    def spec_decode(self) -> dict[str, Any] | None:
        """Speculative-decoding figures over the run from the server's own
        counters (None: it exposes none); after a failure, up to the last
        scrape that got through."""
        return self.scraper.spec_decode(self.metrics_url)

    def _idle(self, at: float) -> bool | None:
        """Whether the target's own metrics, scraped after ``at``, show no
        request running or waiting (None: no such scrape)."""
        s = self.scraper.last.get(self.metrics_url)
        if s is None or s.t < at:
            return None
        running = gauge_sum(s.text, "vllm:num_requests_running")
        waiting = gauge_sum(s.text, "vllm:num_requests_waiting")
        if running is None:
            return None
        return running == 0 and not waiting

    def report(
        self,
        *,
        kind: str,
        message: str,
        request_id: str | None,
        seq: int | None,
        error_class: str | None,
        http_status: int | None,
        inflight: list[str],
    ) -> FailureReport:
        at = self.failed_at if self.failed_at is not None else self.now()
        after = [p for p in self.health.timeline if p.t >= at - self.config.health_interval]
        if (
            self.hang
            and not self.health_stalled
            and after
            and all(p.error == "timeout" for p in after)
        ):
            # called on the last 200 before /health stopped answering: say what followed
            self.health_stalled = True
            message = message.replace(HEALTH_200, self._while())
        ev = Evidence(
            error_class="hang" if self.hang else error_class,
            http_status=http_status,
            message=message,
            probes_after=after,
            process_exited=self.process is not None and self.process.exited(),
            hang=self.hang,
            death_bodies=self.death_bodies,
            direct=self.direct_url is not None,
            idle=self._idle(at),
        )
        cls = classify(ev)
        if cls is FailureClass.NETWORK:
            message = (
                f"{message} (network: the target answered /health 200 at "
                f"{self.direct_url} throughout; the way to it at {self.url} failed)"
            )
        metrics_file = None
        snap = self.scraper.before(at)
        if self.out is not None and snap:
            path = self.out / f"metrics-before-failure-{self.name}.txt"
            path.write_text(
                "".join(f"# source {s.source} at t={s.t:.3f}s\n{s.text}" for s in snap.values())
            )
            metrics_file = path.name
        return FailureReport(
            failure_class=cls,
            at=at,
            request_id=request_id,
            seq=seq,
            kind=kind,
            message=message,
            inflight=inflight,
            recent=[rid for t, rid in self.recent if t <= at][-10:],
            health=self.health.around(at),
            metrics_file=metrics_file,
            health_stalled=self.health_stalled,
        )
