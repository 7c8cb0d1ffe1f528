"""The replay engine: a plan, several targets, one anchor.

Every target replays the whole selection under its own schedule, all started
on the same monotonic T0 in one event loop. ``strict`` order runs one
dispatcher per target that walks the plan in trace order: it waits for a
request's previous turn, then for its eligible time, then for a concurrency
slot, and hands the request to its own task. That task opens (or takes) its
connection at once but writes its first byte only once the previous request's
last byte is in its transport: a burst's connections open together, its
requests still leave in trace order (:data:`AHEAD` at most wait their turn).
``session`` order runs one task per session. Bodies are built just before
their time from the trace (lazily, O(appended) per turn) and the first ones
before T0, so start-up has no burst.

A target *fails* on its first server-side failure (transport error, 5xx,
in-stream error event, cut stream, timeout) or when a monitor says so
(:meth:`TargetRun.fail`, the seam for health checks). With ``stop``, nothing
more is dispatched to it; requests in flight resolve, bounded by the request
timeout; everything never sent is recorded ``not_sent_after_crash``.

Every wait and every time stamp goes through one :class:`~replayer._clock.Clock`
(the real one unless a test passes a virtual one, which makes dispatch times
exact). Dispatch waits are precise: a coarse sleep to ~1.5 ms before the
deadline, then yielding to the loop until it passes (asyncio wakes timers on
millisecond ticks; lag is what the results report, so it should be the
replayer's own).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from replayer._async import spawn
from replayer._clock import REAL, Clock
from replayer.monitor.metrics import MetricsWriter
from replayer.monitor.watch import (
    FailureReport,
    Health,
    InFlight,
    ProcessProbe,
    TargetWatch,
    WatchConfig,
)
from replayer.replay import client
from replayer.replay.bodies import Bodies, body_patch
from replayer.replay.client import Endpoint, HTTPTransport, TargetFacts
from replayer.replay.plan import Plan
from replayer.replay.policy import Mode, OnFailure, Order, ReplayPolicy, ResponsesState, Timing
from replayer.replay.results import Result, ResultsWriter, Status
from replayer.replay.transport import Request, Transport, release
from replayer.replay.workers import ProcBodies, auto_workers, spec_of, usable_cpus
from replayer.trace.reader import BodyBuilder, Trace
from replayer.trace.schema import Kind
from replayer.wire import Api, api_for_path
from replayer.wire import Reply as StreamStats

log = logging.getLogger("replayer.replay")

_BODY_LEAD = 0.05
"""Seconds before its due time a session builds its next body (long contexts
take milliseconds to serialize)."""
WARM_S = 1.0
"""Bodies due within this many seconds of T0 are built before T0."""
WARM_TIMEOUT = 30.0
"""Real seconds the start waits for them at most (past it, T0 and lag)."""
AHEAD = 32
"""Strict order: requests whose connection may open while earlier ones wait
to be written. A burst of new sessions at one instant otherwise connects one
connection after another (a loop round trip each);
a bound, so an ASAP replay without ``--max-inflight`` does not open a
connection for every request of the trace at once."""


PREOPEN_MAX = 1024
"""Connections opened before T0 at most, per target (the file descriptors
of a replay are the user's ``ulimit -n``)."""


@dataclass
class Failure:
    """Why a target was declared failed (first one wins)."""

    kind: str
    """``transport``, ``http_5xx``, ``stream_error``, ``stream_cut``, ``timeout``,
    or a monitor's class."""
    message: str
    at_us: int
    request_id: str | None = None
    seq: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "at_s": self.at_us / 1e6,
            "request_id": self.request_id,
            "seq": self.seq,
        }


def _cancelling() -> bool:
    """The current task itself is being cancelled (not only what it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@dataclass(frozen=True, slots=True)
class TargetSnapshot:
    """One target's live state at one instant: what observers read."""

    sent: int
    inflight: int
    last_lag_us: int
    health: str
    """``failed``, ``healthy``, ``unhealthy``, ``unreachable`` or ``unknown``
    (the last ``/health`` probe, or the declared failure)."""
    failure_class: str | None
    """The classified failure (or the replay's first view of it), once failed."""


@dataclass
class TargetRun:
    """One target's state during a replay."""

    target: Endpoint
    plan: Plan
    results: list[Result]
    transport: Transport
    builder: BodyBuilder
    preopened: int = 0
    """Connections opened before T0 (:meth:`Replay._preopen`)."""
    facts: TargetFacts | None = None
    failure: Failure | None = None
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    done_at: list[float | None] = field(default_factory=list)
    waiters: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    slots: asyncio.Semaphore | None = None
    inflight: int = 0
    sent: int = 0
    settled: int = 0
    errors: int = 0
    last_lag_us: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    inflight_map: dict[int, InFlight] = field(default_factory=dict)
    watch: TargetWatch | None = None
    bodies: Bodies | ProcBodies | None = None
    """Bodies built off the loop, ahead of dispatch (set when the run starts)."""
    report: FailureReport | None = None
    prefix_cache: dict[str, float] | None = None
    """Prefix-cache hits and queries over the run, from the target's /metrics."""
    aborting: bool = False
    interrupted: bool = False
    """The replay itself was interrupted (Ctrl-C, SIGTERM), not the target."""
    # live mode: per session, (position in context, recorded reply replaced by live JSON)
    live_subs: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    context_len: dict[int, int] = field(default_factory=dict)
    response_ids: dict[str, str] = field(default_factory=dict)
    """Responses (chain mode): request id -> the id of its live response."""
    unchained: int = 0
    """Chain mode: chained requests sent expanded (no live parent response)."""

    def fail(self, failure: Failure, *, stop: bool = True) -> None:
        """Declare the target failed (first failure wins); stop dispatching to it.

        This is the monitor seam: the engine calls it for a failing request,
        the watch for health failures and hangs."""
        if self.failure is None:
            self.failure = failure
            if self.watch is not None:
                self.watch.mark_failed(failure.at_us / 1e6)
            log.info("target %s failed: %s (%s)", self.target.name, failure.kind, failure.message)
        if stop:
            self.stopped.set()

    def abort_inflight(self, *, interrupted: bool = False) -> None:
        """Cancel every request on the wire (a hung target never answers; an
        interrupted replay does not wait for answers)."""
        self.aborting = True
        if interrupted:
            self.interrupted = True
            self.stopped.set()
        for t in list(self.tasks):
            t.cancel()

    def complete(self, i: int, when: float) -> None:
        self.done_at[i] = when
        w = self.waiters.pop(i, None)
        if w is not None and not w.done():
            w.set_result(None)


class Replay:
    """Replays a plan of one trace against targets.

    **Usage**::

        replay = Replay(trace, plan, policy, targets, writer)
        await replay.run()
        replay.runs["b300"].failure
    """

    def __init__(
        self,
        trace: Trace,
        plan: Plan,
        policy: ReplayPolicy,
        targets: Sequence[Endpoint],
        writer: ResultsWriter,
        *,
        on_tick: Callable[[Replay], None] | None = None,
        watch: WatchConfig | None = None,
        out: Path | None = None,
        processes: dict[str, ProcessProbe] | None = None,
        clock: Clock = REAL,
        transport: Transport | None = None,
        probers: dict[str, Health] | None = None,
    ) -> None:
        """``clock``, ``transport`` and ``probers`` (a ``/health`` prober per
        target) are seams for tests: the defaults are the loop's clock, an
        :class:`~replayer.replay.client.HTTPTransport` per target (closed at
        the end; a transport passed in serves every target and stays open),
        and HTTP probes of each target's URL."""
        self.trace = trace
        self.plan = plan
        self.policy = policy
        self.targets = list(targets)
        self.writer = writer
        self.on_tick = on_tick
        self.runs: dict[str, TargetRun] = {}
        self.watch_config = watch
        self.out = out
        self.processes = processes or {}
        self.clock = clock
        self.transport = transport
        self.probers = probers or {}
        self.metrics: MetricsWriter | None = None
        self.t0 = 0.0
        self.facts: dict[str, TargetFacts] = {}
        self.started = False
        self.finished = False
        self._warned_fds = False
        self._auto_workers: str | None = None
        """Why ``--workers auto`` chose what it did (None: a count was given)."""
        c = trace.column
        self._rid, self._sid = c("request_id"), c("session_id")
        self._turn, self._path, self._kind = c("turn"), c("path"), c("kind")
        self._tokens = c("input_tokens")
        self._patch: dict[str, Any] = {}
        if policy.model:
            self._patch["model"] = policy.model
        self._chain = self._chained() if policy.responses_state is ResponsesState.CHAIN else {}

    def _chained(self) -> dict[int, tuple[str, int]]:
        """Rows the recorder expanded from a ``previous_response_id``: row ->
        (the parent's request id, context items it prepended)."""
        out: dict[int, tuple[str, int]] = {}
        for row in self.plan.rows:
            if api_for_path(self._path[row]) is not Api.RESPONSES:
                continue
            exp = (self.trace.meta(row) or {}).get("expanded")
            if isinstance(exp, dict) and isinstance(exp.get("items"), int):
                out[row] = (str(exp.get("parent")), exp["items"])
        return out

    # -- set-up --------------------------------------------------------------

    def _body_patch(self, row: int) -> dict[str, Any] | None:
        return body_patch(self.trace, row, self._patch, self.policy.force_stream)

    def _new_results(self, name: str) -> list[Result]:
        return [
            Result(
                target=name,
                row=r,
                request_id=self._rid[r],
                session_id=self._sid[r],
                turn=self._turn[r],
            )
            for r in self.plan.rows
        ]

    def _workers(self, static: Sequence[bool]) -> int:
        """``policy.workers``, with ``auto`` decided (and why, for the summary)."""
        if self.policy.workers != "auto":
            return self.policy.workers
        size = self.trace.column("body_bytes")
        total = sum(int(size[r] or 0) for r, s in zip(self.plan.rows, static, strict=True) if s)
        span = None
        if self.policy.timing is not Timing.ASAP and self.plan.start:
            span = (max(self.plan.start) - min(self.plan.start)) or None
        n, self._auto_workers = auto_workers(total, span, usable_cpus())
        return n

    def body_workers(self) -> dict[str, Any] | None:
        """``--workers``: how many built bodies, and the deaths among them;
        with ``auto``, also why that many."""
        procs = [r.bodies for r in self.runs.values() if isinstance(r.bodies, ProcBodies)]
        auto = {"auto": self._auto_workers} if self._auto_workers is not None else {}
        if not procs:
            return {"workers": 1, **auto} if auto else None
        return {"workers": procs[0].n, **auto, "died": [d for p in procs for d in p.died]}

    def snapshot(self) -> dict[str, TargetSnapshot]:
        """Every target's live state now (cheap; safe to call from an observer)."""
        out = {}
        for name, run in list(self.runs.items()):
            probe = run.watch.health.last() if run.watch is not None else None
            if run.failure is not None:
                health = "failed"
            elif probe is None:
                health = "unknown"
            elif probe.status == 200:
                health = "healthy"
            else:
                health = "unhealthy" if probe.status is not None else "unreachable"
            cls = None
            if run.failure is not None:
                cls = run.report.failure_class.value if run.report is not None else run.failure.kind
            out[name] = TargetSnapshot(run.sent, run.inflight, run.last_lag_us, health, cls)
        return out

    async def preflight(self) -> dict[str, TargetFacts]:
        """Ask every target for its models before anything is scheduled."""
        async with aiohttp.ClientSession() as s:
            facts = await asyncio.gather(*(client.preflight(s, t) for t in self.targets))
        self.facts = {t.name: f for t, f in zip(self.targets, facts, strict=True)}
        return self.facts

    # -- the run -------------------------------------------------------------

    async def run(self) -> None:
        """Replay to the end (or until every target failed); never raises for
        a target's failure: that is a result."""
        n = len(self.plan)
        for t in self.targets:
            run = TargetRun(
                target=t,
                plan=self.plan,
                results=self._new_results(t.name),
                transport=self.transport or HTTPTransport(),
                builder=self.trace.builder(self.plan.rows),
                facts=self.facts.get(t.name),
                done_at=[None] * n,
                slots=asyncio.Semaphore(self.policy.max_inflight)
                if self.policy.max_inflight
                else None,
            )
            self.runs[t.name] = run
        static = [self._static(row) for row in self.plan.rows]
        shared = threading.Lock()  # the targets' builders share the trace's caches
        due_at = None if self.policy.timing is Timing.ASAP else self.plan.start
        spec = None
        workers = self._workers(static)
        if workers > 1 and self.clock is REAL:
            spec = spec_of(self.trace, self.policy)
            if spec is None:
                log.warning("--workers: the trace is not a file here; bodies are built in-process")
        weight = [int(self._tokens[r] or 0) for r in self.plan.rows] if spec else []
        for run in self.runs.values():
            if spec is not None:
                run.bodies = ProcBodies(
                    spec,
                    workers,
                    partial(self._body, run),
                    static,
                    self.plan.rows,
                    self.plan.sessions,
                    weight,
                    ahead_bytes=self.policy.body_cache_mb << 20,
                    due=due_at,
                    horizon=WARM_S,
                    lock=shared,
                )
                continue
            run.bodies = Bodies(
                partial(self._body, run),
                static,
                ahead_bytes=self.policy.body_cache_mb << 20,
                threaded=self.clock is REAL,
                due=due_at,
                horizon=WARM_S,
                lock=shared,
            )
        if self.watch_config is not None:
            if self.out is not None:
                self.metrics = MetricsWriter(self.out / "metrics.arrow")
            for run in self.runs.values():
                run.watch = self._make_watch(run)
        # the tick also flushes results (on real time only: on a virtual
        # clock a periodic timer would make idle waits look busy)
        ticking = self.on_tick is not None or self.clock is REAL
        ticker = spawn(self._tick(), name="replay-progress") if ticking else None
        try:
            watches = [r.watch for r in self.runs.values() if r.watch is not None]
            await asyncio.gather(*(w.prime() for w in watches))
            # bodies due in the first second are built before T0: a burst of
            # sessions that start together then leaves on time
            due = bisect.bisect_left(self.plan.start, WARM_S) if self.plan.start else 0
            if self.policy.timing is Timing.ASAP:
                due = len(self.plan)
            await asyncio.gather(
                *(r.bodies.warm(due, WARM_TIMEOUT) for r in self.runs.values() if r.bodies)
            )
            await self._preopen(due)
            # T0 after every set-up step: no request is late because of start-up.
            self.t0 = self.clock.now() + 0.005
            for run in self.runs.values():
                if run.bodies is not None:
                    run.bodies.start(self.t0)
                if run.watch is not None:
                    run.watch.start(self.t0)
            self.started = True
            async with asyncio.TaskGroup() as tg:
                for run in self.runs.values():
                    if self.policy.order.global_order:
                        tg.create_task(
                            self._dispatch_strict(run), name=f"dispatch-{run.target.name}"
                        )
                    else:
                        tg.create_task(
                            self._dispatch_sessions(run), name=f"dispatch-{run.target.name}"
                        )
        finally:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                # interrupted (Ctrl-C, SIGTERM, a cancelled job): do not wait for
                # requests that may never answer (a hang); record them as cut short
                for run in self.runs.values():
                    run.abort_inflight(interrupted=True)
            for run in self.runs.values():
                if run.tasks:
                    await asyncio.gather(*run.tasks, return_exceptions=True)
                for r in run.results:
                    if r.seq is None and r.error_class is None:
                        r.status = Status.NOT_SENT_AFTER_CRASH
                        r.error_class = "target_failed" if run.failure else "interrupted"
                        self.writer.add(r)
                if self.transport is None:  # its own: made for this run
                    run.transport.close()
                if run.bodies is not None:
                    run.bodies.close()
                with shared:  # (a bodies thread may still be in a build)
                    run.builder.close()
            await asyncio.gather(*(self._conclude(run) for run in self.runs.values()))
            if self.metrics is not None:
                self.metrics.close()
            self.finished = True
            if ticker is not None:
                ticker.cancel()
                if self.on_tick:
                    self.on_tick(self)

    def _make_watch(self, run: TargetRun) -> TargetWatch:
        assert self.watch_config is not None

        def on_failure(kind: str, message: str) -> None:
            at = round(self.now() * 1e6)
            stop = self.policy.on_failure is OnFailure.STOP or kind == "hang"
            run.fail(Failure(kind=kind, message=message, at_us=at), stop=stop)

        return TargetWatch(
            name=run.target.name,
            url=run.target.url,
            config=self.watch_config,
            inflight=run.inflight_map,
            on_failure=on_failure,
            abort=run.abort_inflight,
            writer=self.metrics,
            process=self.processes.get(run.target.name),
            out=self.out,
            clock=self.clock,
            prober=self.probers.get(run.target.name),
        )

    async def _conclude(self, run: TargetRun) -> None:
        """Settle, classify and report a failure; stop the watch."""
        w = run.watch
        if w is None:
            return
        try:
            if run.failure is None and not run.interrupted:
                await w.grace_period()
            if run.failure is not None:
                if not run.interrupted:
                    await w.settle()
                f = run.failure
                first = next((r for r in run.results if r.seq is not None and r.seq == f.seq), None)
                at_us = f.at_us
                inflight = [
                    r.request_id
                    for r in run.results
                    if r.dispatched_us is not None
                    and r.dispatched_us <= at_us
                    and (r.done_us is None or r.done_us >= at_us)
                    and r is not first
                ]
                run.report = w.report(
                    kind=f.kind,
                    message=f.message,
                    request_id=f.request_id,
                    seq=f.seq,
                    error_class=first.error_class if first else None,
                    http_status=first.http_status if first else None,
                    inflight=inflight,
                )
        finally:
            await w.stop()
            run.prefix_cache = w.prefix_cache()

    async def _tick(self) -> None:
        while True:
            await self.clock.sleep(0.5)
            if self.on_tick:
                self.on_tick(self)
            self.writer.flush_due()

    # -- dispatch ------------------------------------------------------------

    def now(self) -> float:
        """Seconds since T0."""
        return self.clock.now() - self.t0

    async def _sleep_until(self, run: TargetRun, at: float, *, precise: bool = True) -> bool:
        """Wait until ``at`` seconds after T0; False if the target stopped.
        ``precise=False`` skips the sub-millisecond spin at the end."""
        return await self.clock.sleep_until(self.t0 + at, run.stopped, precise=precise)

    async def _wait_prev(self, run: TargetRun, p: int) -> bool:
        if run.done_at[p] is not None:
            return True
        fut = run.waiters.get(p)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            run.waiters[p] = fut
        stop = spawn(run.stopped.wait(), name="stop-wait")
        waits: set[asyncio.Future[Any]] = {fut, stop}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        return run.done_at[p] is not None and not run.stopped.is_set()

    def _skip(self, run: TargetRun, i: int, at: float) -> bool:
        """Over-context requests are skipped (when asked): recorded, not sent."""
        if not self.policy.skip_over_context or run.facts is None:
            return False
        mml = run.facts.max_model_len
        row = self.plan.rows[i]
        if mml is None or self._tokens[row] < mml:
            return False
        if run.bodies is not None:
            run.bodies.discard(i)
        r = run.results[i]
        r.status = Status.SKIPPED
        r.error_class = "over_context"
        r.error = f"input_tokens {self._tokens[row]} >= max_model_len {mml}"
        r.scheduled_us = round(at * 1e6)
        run.complete(i, at)
        run.settled += 1
        self.writer.add(r)
        return True

    def _static(self, row: int) -> bool:
        """Whether a row's body is known before the replay (else it waits for
        live replies: the live parent of a chain, live-mode assistant turns)."""
        if row in self._chain:
            return False
        return not (self.policy.mode is Mode.LIVE and self._kind[row] == Kind.CHAT)

    async def _next_body(self, run: TargetRun, i: int) -> bytes:
        assert run.bodies is not None  # made with the run, before any dispatch
        return await run.bodies.get(i)

    def _body(self, run: TargetRun, i: int) -> bytes:
        """Build a body (in the bodies worker thread on the real clock)."""
        row = self.plan.rows[i]
        patch = self._body_patch(row)
        chained = self._chain.get(row)
        if chained is not None:
            live = run.response_ids.get(chained[0])
            if live is not None:  # as the client sent it, chained to the live parent
                content = run.builder.content(row)[chained[1] :]
                patch = {**(patch or {}), "previous_response_id": live}
                return run.builder.json(row, patch, content=content)
            run.unchained += 1
            if run.unchained == 1:
                log.warning(
                    "%s: %s has no live parent response to chain to; sent expanded",
                    run.target.name,
                    self._rid[row],
                )
        if self.policy.mode is Mode.LIVE and self._kind[row] == Kind.CHAT:
            content = run.builder.content(row)
            run.context_len[i] = len(content)
            subs = run.live_subs.get(self.plan.sessions[i])
            if subs:
                content = substitute_live(content, subs)
            return run.builder.json(row, patch, content=content)
        return run.builder.json(row, patch)

    async def _preopen(self, due: int) -> None:
        """Connections for the requests due in the first second open before
        T0, as a client with a warm pool has them: a burst of new sessions
        against a server busy with prefill needs one each, and opening them
        inside the burst made its tail late (bench/RESULTS.md, issue 17)."""
        if self.clock is not REAL:
            return  # a virtual clock's transport is a fake: nothing to open
        n = min(due, PREOPEN_MAX, self.policy.max_inflight or due)
        if n <= 0:
            return
        runs = list(self.runs.values())
        opened = await asyncio.gather(*(r.transport.preopen(r.target.url, n) for r in runs))
        for r, k in zip(runs, opened, strict=True):
            r.preopened = k

    async def _dispatch_strict(self, run: TargetRun) -> None:
        plan, policy = self.plan, self.policy
        admitted = policy.order is Order.ADMITTED
        last = 0.0  # when the previous request in trace order was due
        turn: asyncio.Future[None] | None = None  # the previous request's sent
        ahead: deque[asyncio.Future[None]] = deque()
        for i in range(len(plan)):
            if run.stopped.is_set():
                return
            p = plan.prev[i]
            if p is not None and not await self._wait_prev(run, p):
                return
            at = plan.eligible(i, policy.timing, run.done_at[p] if p is not None else None)
            # in strict order a request is also due no earlier than its
            # predecessor was due: lag then measures the replayer (and grows
            # if it falls behind), not the order constraint
            at = max(at, last)
            if self._skip(run, i, at):
                continue
            body = await self._next_body(run, i)
            if not await self._sleep_until(run, at):
                return
            if run.slots is not None:
                await run.slots.acquire()
                if run.stopped.is_set():
                    run.slots.release()
                    return
            loop = asyncio.get_running_loop()
            sent: asyncio.Future[None] = loop.create_future()
            answered = loop.create_future() if admitted else None
            task = spawn(
                self._send(run, i, at, body, sent, answered, None if admitted else turn),
                name=f"send-{run.target.name}-{i}",
            )
            run.tasks.add(task)
            task.add_done_callback(run.tasks.discard)
            # a task cancelled before it ran never resolves its own
            task.add_done_callback(partial(_release, (sent, answered)))
            last = at
            if answered is not None:
                # admitted order waits for the response headers: the engine has
                # taken it (its connection opens only then: a request the
                # engine may never take must not hold the next one's turn)
                await answered
                continue
            # the next request writes only once this one's bytes are on the
            # wire, so the server sees trace order even across connections
            turn = sent
            ahead.append(sent)
            while ahead and ahead[0].done():
                ahead.popleft()
            if len(ahead) >= AHEAD:
                await asyncio.wait((ahead.popleft(),))

    async def _dispatch_sessions(self, run: TargetRun) -> None:
        plan, timing = self.plan, self.policy.timing
        by_session: dict[str, list[int]] = {}
        for i, s in enumerate(plan.sessions):
            by_session.setdefault(s, []).append(i)
        # a session's task starts just before its first request is due: set up
        # all at T0, 18,000 sessions delayed the first send by most of a second
        starts = sorted(
            (plan.eligible(idx[0], timing, None) if plan.prev[idx[0]] is None else 0.0, idx[0], s)
            for s, idx in by_session.items()
        )
        async with asyncio.TaskGroup() as tg:
            for at, _, s in starts:
                if not await self._sleep_until(run, at - _BODY_LEAD, precise=False):
                    break
                tg.create_task(self._session_loop(run, by_session[s]), name=f"session-{s}")

    async def _session_loop(self, run: TargetRun, idx: list[int]) -> None:
        plan, policy = self.plan, self.policy
        for i in idx:
            if run.stopped.is_set():
                return
            p = plan.prev[i]
            at = plan.eligible(i, policy.timing, run.done_at[p] if p is not None else None)
            if self._skip(run, i, at):
                continue
            # the body is built just before it is due: thousands of sessions
            # waiting for their start must not each hold one (memory), nor
            # build them all at T0 before anything is sent (lag)
            if not await self._sleep_until(run, at - _BODY_LEAD, precise=False):
                return
            body = await self._next_body(run, i)
            if not await self._sleep_until(run, at):
                return
            if run.slots is not None:
                await run.slots.acquire()
                if run.stopped.is_set():
                    run.slots.release()
                    return
            task = spawn(self._send(run, i, at, body), name=f"send-{run.target.name}-{i}")
            run.tasks.add(task)
            task.add_done_callback(run.tasks.discard)
            try:
                # its completion is the session's next dependency; shielded: a
                # cancel of this loop (Ctrl-C cancels the task group) must not
                # cancel the send behind the run's back, which then left its
                # row unrecorded; the run aborts it and records why
                await asyncio.shield(task)
            except asyncio.CancelledError:
                # the send was aborted (hang watchdog, interrupt): the session
                # goes on or stops as the run says. A cancel of this loop itself
                # stops it here: swallowed, the loop sent its next turn into a
                # hung server and the interrupt waited for that
                if _cancelling():
                    raise

    async def _send(
        self,
        run: TargetRun,
        i: int,
        at: float,
        body: bytes,
        sent: asyncio.Future[None] | None = None,
        answered: asyncio.Future[None] | None = None,
        turn: asyncio.Future[None] | None = None,
    ) -> None:
        """Send request ``i``: its first byte only after ``turn`` (the previous
        request's ``sent``) and only while the run goes on; seq and dispatch
        time are stamped then, the order the target sees."""
        row = self.plan.rows[i]
        r = run.results[i]
        r.scheduled_us = round(at * 1e6)
        now = self.clock.now()
        refused = False

        def stamp() -> None:
            r.dispatched_us = round((self.clock.now() - self.t0) * 1e6)
            r.seq = run.sent
            run.sent += 1
            run.last_lag_us = r.dispatched_us - (r.scheduled_us or 0)

        async def go() -> bool:
            nonlocal refused
            if turn is not None and not turn.done():
                await asyncio.wait((turn,))
            if run.stopped.is_set():
                refused = True
                return False
            stamp()
            run.inflight += 1  # counted from its first byte, like ``sent``
            return True

        headers = run.target.headers()
        headers["X-Request-Id"] = self._rid[row]
        if self.policy.session_header:
            headers[self.policy.session_header] = self._sid[row]
        url = run.target.url.rstrip("/") + self._path[row]
        stats = StreamStats()
        run.inflight_map[i] = InFlight(i, r.request_id, now - self.t0, self._tokens[row], stats)
        request = Request(
            url,
            body,
            headers,
            r,
            t0=self.t0,
            timeout=self.policy.request_timeout,
            stats=stats,
            keep_text=self.policy.save_output or self.policy.mode is Mode.LIVE,
            sent=sent,
            answered=answered,
            go=go,
        )
        try:
            await run.transport.handle(request)
        except asyncio.CancelledError:
            if not run.aborting:
                raise
            release(sent, answered)
            if r.seq is None:  # aborted before its first byte: never sent (untouched)
                refused = True
            else:
                r.status = Status.TIMEOUT
                if run.interrupted:
                    r.error_class = "interrupted"
                    r.error = "the replay was interrupted before the response finished"
                else:  # aborted by the hang watchdog: the request never finished
                    r.error_class = "hang"
                    r.error = "aborted: the target stopped making progress"
                r.done_us = round((self.clock.now() - self.t0) * 1e6)
        finally:
            if r.seq is not None:  # stamped by go: on the wire (counted in)
                run.inflight -= 1
            run.inflight_map.pop(i, None)
            if run.slots is not None:
                run.slots.release()
        if refused:  # the run stopped before its turn: recorded as never sent
            return
        if r.seq is None:  # it ended before a byte left (no connection, aborted)
            stamp()
        if run.watch is not None:
            run.watch.completed(r.request_id, r.error if r.status is not Status.OK else None)
        if self.policy.mode is Mode.LIVE and r.status is Status.OK and i in run.context_len:
            self._thread_live_reply(run, i, stats.assistant_message())
        if self._chain and stats.response_id is not None and r.status is Status.OK:
            run.response_ids[r.request_id] = stats.response_id
        if r.status is not Status.OK:
            run.errors += 1
            if r.error_class == "client_resources" and not self._warned_fds:
                self._warned_fds = True
                log.warning(
                    "requests to %s fail on this side: out of file descriptors; "
                    "raise `ulimit -n` or cap connections with --max-inflight",
                    run.target.name,
                )
        if self.policy.save_output is False:
            r.output_text = None
        run.settled += 1
        self.writer.add(r)
        done = (r.done_us or 0) / 1e6
        run.complete(i, done)
        if client.is_target_failure(r) and not run.interrupted:
            run.fail(
                Failure(
                    kind=r.error_class or r.status.value,
                    message=r.error or "",
                    at_us=r.done_us or 0,
                    request_id=r.request_id,
                    seq=r.seq,
                ),
                stop=self.policy.on_failure is OnFailure.STOP,
            )

    def _thread_live_reply(self, run: TargetRun, i: int, reply: dict[str, Any]) -> None:
        """Later turns of the session get this reply where the recorded one
        was: at this request's context length (see :func:`substitute_live`)."""
        pos = run.context_len.pop(i)
        run.live_subs.setdefault(self.plan.sessions[i], []).append(
            (pos, orjson.dumps(reply).decode())
        )


def _release(signals: tuple[asyncio.Future[None] | None, ...], _task: object) -> None:
    release(*signals)


def substitute_live(content: list[str], subs: list[tuple[int, str]]) -> list[str]:
    """Replace recorded assistant replies by live ones (live mode).

    Turn j's reply sits at index ``len(context of turn j)`` of every later
    turn (teacher-forced traces append it there). A substitution applies only
    where that message is an assistant's; tool results that answer a recorded
    tool call are re-pointed at the live call's id, so the conversation stays
    coherent for the server."""
    out = list(content)
    ids: dict[str, str] = {}
    for pos, live in subs:
        if pos >= len(out):
            continue
        recorded = orjson.loads(out[pos])
        if not isinstance(recorded, dict) or recorded.get("role") != "assistant":
            continue
        live_msg = orjson.loads(live)
        rec_calls = recorded.get("tool_calls") or []
        live_calls = live_msg.get("tool_calls") or []
        for a, b in zip(rec_calls, live_calls, strict=False):
            if isinstance(a, dict) and isinstance(b, dict) and a.get("id") and b.get("id"):
                ids[a["id"]] = b["id"]
        out[pos] = live
    if ids:
        for k, text in enumerate(out):
            if '"tool_call_id"' not in text:
                continue
            msg = orjson.loads(text)
            if isinstance(msg, dict) and msg.get("tool_call_id") in ids:
                msg["tool_call_id"] = ids[msg["tool_call_id"]]
                out[k] = orjson.dumps(msg).decode()
    return out
