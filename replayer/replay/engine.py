"""The replay engine: a plan, several targets, one anchor.

Every target replays the whole selection under its own schedule, all started
on the same monotonic T0 in one event loop. :class:`Replay` sets the pieces
up and runs them; each idea is its own module:

* :mod:`~replayer.replay.schedule` - when a request is due (one clock, one T0);
* :mod:`~replayer.replay.dispatch` - which goes next: strict, admitted or
  session order, and the connections opened before T0;
* :mod:`~replayer.replay.send` - one request out and its result settled,
  through the target's :class:`~replayer.replay.transport.Transport` (the seam
  a test's fake server takes);
* :mod:`~replayer.replay.content` - what each body says on each target, and
  the bodies built ahead (the first ones before T0, so start-up has no burst);
* :mod:`~replayer.replay.accounting` - every request once per target, and why
  a target failed.

A target *fails* on its first server-side failure (transport error, 5xx,
in-stream error event, cut stream, timeout) or when a monitor says so
(:meth:`~replayer.replay.accounting.TargetRun.fail`, the seam for health
checks). With ``stop``, nothing more is dispatched to it; requests in flight
resolve, bounded by the request timeout; everything never sent is recorded
``not_sent_after_crash``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from replayer._async import spawn
from replayer._clock import REAL, Clock
from replayer._files import output_error
from replayer.errors import OutputError
from replayer.monitor.metrics import MetricsWriter
from replayer.monitor.watch import Health, ProcessProbe, TargetWatch, WatchConfig
from replayer.replay import client
from replayer.replay.accounting import (
    Books,
    Failure,
    TargetRun,
    TargetSnapshot,
    conclude,
    new_results,
    snapshot,
)
from replayer.replay.client import Endpoint, HTTPTransport, TargetFacts
from replayer.replay.content import Content
from replayer.replay.dispatch import Dispatcher, preopen
from replayer.replay.plan import Plan
from replayer.replay.policy import OnFailure, ReplayPolicy
from replayer.replay.results import ResultsWriter
from replayer.replay.schedule import WARM_TIMEOUT, Schedule, Turns
from replayer.replay.send import Sender
from replayer.replay.transport import Transport
from replayer.replay.workers import ProcBodies
from replayer.trace.reader import Trace


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
        self.output_error: OutputError | None = None
        """The first output file that could not be written (a full disk):
        the replay stopped on it (:meth:`fail_output`)."""
        self._running: asyncio.Task[None] | None = None
        self.stopped_for_output = False
        """True when :meth:`fail_output` cancelled :meth:`run`'s task: its
        caller takes that cancellation back (``uncancel``) and raises the error."""
        self.facts: dict[str, TargetFacts] = {}
        self.started = False
        self.finished = False
        self.schedule = Schedule(plan, policy.timing, clock)
        self.content = Content(trace, plan, policy)
        self.books = Books(writer, policy)
        if writer.on_error is None:
            writer.on_error = self.fail_output
        sender = Sender(trace, plan, policy, self.schedule, self.books)
        self.dispatcher = Dispatcher(trace, plan, policy, self.schedule, self.books, sender)

    @property
    def t0(self) -> float:
        """Clock time of T0, the anchor every target's schedule starts from."""
        return self.schedule.t0

    def now(self) -> float:
        """Seconds since T0."""
        return self.schedule.now()

    def body_workers(self) -> dict[str, Any] | None:
        """``--workers``: how many built bodies, and the deaths among them;
        with ``auto``, also why that many."""
        procs = [r.bodies for r in self.runs.values() if isinstance(r.bodies, ProcBodies)]
        why = self.content.auto_workers
        auto = {"auto": why} if why is not None else {}
        if not procs:
            return {"workers": 1, **auto} if auto else None
        return {"workers": procs[0].n, **auto, "died": [d for p in procs for d in p.died]}

    def snapshot(self) -> dict[str, TargetSnapshot]:
        """Every target's live state now (cheap; safe to call from an observer)."""
        return snapshot(self.runs)

    async def preflight(self) -> dict[str, TargetFacts]:
        """Ask every target for its models before anything is scheduled."""
        async with aiohttp.ClientSession() as s:
            facts = await asyncio.gather(*(client.preflight(s, t) for t in self.targets))
        self.facts = {t.name: f for t, f in zip(self.targets, facts, strict=True)}
        return self.facts

    def fail_output(self, err: OutputError) -> None:
        """An output file cannot be written: keep the first such error and
        stop the run now (as an interrupt would: nothing waits for requests
        in flight), not leave it going with nowhere to put what it measures."""
        if self.output_error is not None:
            return
        self.output_error = err
        task = self._running
        if task is not None and not task.done():
            self.stopped_for_output = True
            task.cancel()

    # -- the run -------------------------------------------------------------

    async def run(self) -> None:
        """Replay to the end (or until every target failed); never raises for
        a target's failure: that is a result."""
        self._running = asyncio.current_task()
        n = len(self.plan)
        for t in self.targets:
            run = TargetRun(
                target=t,
                results=new_results(self.trace, self.plan.rows, t.name),
                transport=self.transport or HTTPTransport(),
                content=self.content.for_target(t.name, self.trace.builder(self.plan.rows)),
                turns=Turns(n),
                facts=self.facts.get(t.name),
                slots=asyncio.Semaphore(self.policy.max_inflight)
                if self.policy.max_inflight
                else None,
            )
            self.runs[t.name] = run
        runs = list(self.runs.values())
        bodies = self.content.ahead([r.content for r in runs], self.schedule)
        for run, b in zip(runs, bodies, strict=True):
            run.bodies = b
        if self.watch_config is not None:
            if self.out is not None:
                self.metrics = MetricsWriter(self.out / "metrics.arrow", self.fail_output)
            for run in runs:
                run.watch = self._make_watch(run)
        # the tick also flushes results (on real time only: on a virtual
        # clock a periodic timer would make idle waits look busy)
        ticking = self.on_tick is not None or self.clock is REAL
        ticker = spawn(self._tick(), name="replay-progress") if ticking else None
        try:
            watches = [r.watch for r in runs if r.watch is not None]
            await asyncio.gather(*(w.prime() for w in watches))
            # bodies due in the first second are built before T0: a burst of
            # sessions that start together then leaves on time
            due = self.schedule.warm()
            await asyncio.gather(*(r.bodies.warm(due, WARM_TIMEOUT) for r in runs if r.bodies))
            if self.clock is REAL:  # a virtual clock's transport is a fake: nothing to open
                await preopen(runs, due, self.policy.max_inflight)
            # T0 after every set-up step: no request is late because of start-up.
            t0 = self.schedule.start()
            for run in runs:
                if run.bodies is not None:
                    run.bodies.start(t0)
                if run.watch is not None:
                    run.watch.start(t0)
            self.started = True
            async with asyncio.TaskGroup() as tg:
                for run in runs:
                    tg.create_task(self.dispatcher.run(run), name=f"dispatch-{run.target.name}")
        finally:
            self._running = None  # from here on a failed write is noted, not a cancel
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                # interrupted (Ctrl-C, SIGTERM, a cancelled job, a full disk): do
                # not wait for requests that may never answer (a hang); record
                # them as cut short
                for run in runs:
                    run.abort_inflight(interrupted=True)
            for run in runs:
                if run.tasks:
                    await asyncio.gather(*run.tasks, return_exceptions=True)
                self.books.unsent(run)
                if self.transport is None:  # its own: made for this run
                    run.transport.close()
                if run.bodies is not None:
                    run.bodies.close()
                run.content.close()
            ended = await asyncio.gather(*(conclude(run) for run in runs), return_exceptions=True)
            if self.metrics is not None:
                self.metrics.close()
            self.finished = True
            if ticker is not None:
                ticker.cancel()
                if self.on_tick:
                    with contextlib.suppress(OSError):  # noted by the tick already
                        self.on_tick(self)
            for e in ended:
                if isinstance(e, OutputError):
                    self.fail_output(e)
                elif isinstance(e, BaseException):
                    raise e

    def _make_watch(self, run: TargetRun) -> TargetWatch:
        assert self.watch_config is not None

        def on_failure(kind: str, message: str) -> None:
            at = round(self.now() * 1e6)
            stop = self.policy.on_failure is OnFailure.STOP or kind == "hang"
            run.fail(Failure(kind=kind, message=message, at_us=at), stop=stop)

        return TargetWatch(
            name=run.target.name,
            url=run.target.url,
            direct_url=run.target.monitor_url,
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

    async def _tick(self) -> None:
        while True:
            await self.clock.sleep(0.5)
            if self.on_tick:
                try:
                    self.on_tick(self)
                except OSError as exc:  # progress to a file on the full disk
                    self.on_tick = None
                    self.fail_output(output_error(exc, "<progress on stderr>"))
            self.writer.flush_due()
