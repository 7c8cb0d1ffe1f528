"""Accounts of a replay: every request once per target, and why a target failed.

One :class:`TargetRun` per target holds its results (one slot per plan
position, filled in place), its live counters (what observers and the
progress line read, through :func:`snapshot`) and its failure (the first one
wins: :meth:`TargetRun.fail` is also the seam the monitors call). Every
request leaves through :class:`Books` exactly once, settled (sent or
skipped) or, when the run ends, marked never sent: ``results.arrow`` holds
each planned request once per target, whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayer._files import writing
from replayer.monitor.watch import FailureReport, InFlight, TargetWatch
from replayer.replay.bodies import Bodies
from replayer.replay.client import Endpoint, TargetFacts, is_target_failure
from replayer.replay.content import TargetContent
from replayer.replay.policy import OnFailure, ReplayPolicy
from replayer.replay.results import Result, ResultsWriter, Status
from replayer.replay.schedule import Turns
from replayer.replay.transport import Transport
from replayer.replay.workers import ProcBodies
from replayer.trace.reader import Trace

log = logging.getLogger("replayer.replay")


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
    results: list[Result]
    transport: Transport
    content: TargetContent
    turns: Turns
    preopened: int = 0
    """Connections opened before T0 (:func:`~replayer.replay.dispatch.preopen`)."""
    facts: TargetFacts | None = None
    failure: Failure | None = None
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
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
    spec_decode: dict[str, Any] | None = None
    """Speculative-decoding drafts and acceptance over the run, from its /metrics."""
    aborting: bool = False
    interrupted: bool = False
    """The replay itself was interrupted (Ctrl-C, SIGTERM), not the target."""

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


def new_results(trace: Trace, rows: list[int], name: str) -> list[Result]:
    """A target's result slots, one per plan position."""
    rid, sid, turn = trace.column("request_id"), trace.column("session_id"), trace.column("turn")
    return [
        Result(target=name, row=r, request_id=rid[r], session_id=sid[r], turn=turn[r]) for r in rows
    ]


class Books:
    """Where every request's result is entered, once, and what a failing one
    does to its target."""

    def __init__(self, writer: ResultsWriter, policy: ReplayPolicy) -> None:
        self.writer = writer
        self.policy = policy
        self._warned_fds = False

    def skipped(self, run: TargetRun, i: int, at: float, error_class: str, error: str) -> None:
        """Request ``i`` is not sent, by the replay's choice (recorded as
        due at ``at``; its session's next turn goes on)."""
        r = run.results[i]
        r.status = Status.SKIPPED
        r.error_class = error_class
        r.error = error
        r.scheduled_us = round(at * 1e6)
        run.turns.complete(i, at)
        run.settled += 1
        self.writer.add(r)

    def settle(self, run: TargetRun, i: int) -> None:
        """Request ``i`` came back (or never left its side); a server-side
        failure fails the target (and stops it, unless ``--on-failure
        continue``)."""
        r = run.results[i]
        if r.status not in (Status.OK, Status.ABORTED):  # an abort is the trace's, by design
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
        run.turns.complete(i, (r.done_us or 0) / 1e6)
        if is_target_failure(r) and not run.interrupted:
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

    def unsent(self, run: TargetRun) -> None:
        """The run is over: what never left is recorded as never sent, and why."""
        for r in run.results:
            if r.seq is None and r.error_class is None:
                r.status = Status.NOT_SENT_AFTER_CRASH
                r.error_class = "target_failed" if run.failure else "interrupted"
                self.writer.add(r)


def snapshot(runs: Mapping[str, TargetRun]) -> dict[str, TargetSnapshot]:
    """Every target's live state now (cheap; safe to call from an observer)."""
    out = {}
    for name, run in list(runs.items()):
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


async def conclude(run: TargetRun) -> None:
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
            # the report writes the last scrape before the failure beside the results
            with writing(Path(w.out or ".") / f"metrics-before-failure-{w.name}.txt"):
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
        run.spec_decode = w.spec_decode()
