"""The seam between a bisect and the world: replay these requests, say what happened.

A bisect asks one question per trial, "does this candidate still crash?", and
everything else (the search, the journal and resume, the budget, the bundle)
is the same whoever answers it. :class:`Runner` is that question, as a
transport is for an HTTP client: :class:`SessionRunner` answers it with a
real server (launch, replay, watch, classify: a
:class:`~replayer.session.Session`'s trial), and a user's own oracle ("does
my kernel test crash on these requests?") answers it in-process, in
milliseconds, with no server at all.

**Usage**::

    class KernelTest:
        async def run(self, trial: Trial) -> Outcome | Observation:
            bodies = trial.bodies()
            return Outcome.MATCH if await my_kernel_crashes(bodies) else Outcome.PASS

    trace = Trace.open("prod.arrow")
    result = await Bisect(trace, select(trace), KernelTest(), Path("runs/k")).run()
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from replayer.monitor.signature import Signature
from replayer.options.replay import ReplayPolicy, Timing
from replayer.replay.files import read_summary
from replayer.replay.results import read_results
from replayer.session import Chase, NotExercised, Outcome, Session, Slot
from replayer.session.pool import Pool
from replayer.trace.reader import Trace


@dataclass(frozen=True)
class Trial:
    """One replay of one candidate, as a runner is asked for it."""

    trace: Trace
    rows: tuple[int, ...]
    """Trace rows to replay, in trace order."""
    policy: ReplayPolicy
    """The bisect's replay policy, with this candidate's timing and speed."""
    number: int
    """Counts every trial of the bisect and its resumes, from 1."""
    stage: str
    """``calibrate``, ``cut``, ``prefix``, ``sessions``, ``turns``, ``timing``,
    ``confirm`` or ``control``."""
    out: Path
    """This trial's own directory, already made. A ``server.log`` or
    ``metrics-before-failure-*.txt`` left in it goes into the bundle."""
    chase: Chase
    """The failure the bisect chases (pinned by the first MATCH, or given)."""

    @property
    def timing(self) -> Timing:
        return self.policy.timing

    @property
    def speed(self) -> float:
        return self.policy.speed

    def request_ids(self) -> list[str]:
        ids = self.trace.column("request_id")
        return [ids[r] for r in self.rows]

    def bodies(self) -> list[dict[str, Any]]:
        """The requests' bodies, as recorded, in order."""
        return [self.trace.body(r) for r in self.rows]


@dataclass(frozen=True)
class Observation:
    """What a trial showed; only ``outcome`` is needed, the rest sharpens the search.

    A MATCH whose ``signature`` differs from the one the bisect chases is
    counted as another bug (OTHER_FAILURE): a runner may call every crash a
    MATCH and label it, and the bisect chases the first label it saw."""

    outcome: Outcome
    failure_class: str | None = None
    signature: Signature | str | None = None
    """A server log's :class:`Signature`, or any stable label of the failure."""
    message: str | None = None
    failed_request: str | None = None
    """The request id the failure was seen on."""
    suspects: Sequence[str] = ()
    """Request ids the failure names (vLLM's scheduler dump): their sessions
    are tried first. Defaults to the signature's."""
    sent: Sequence[int] | None = None
    """Rows sent by the time of the failure (None: not known). The ``cut``
    stage drops every row after them without a search."""
    in_flight: Sequence[int] = ()
    """Rows in flight at the failure: their sessions are tried early."""
    cleared: Sequence[int] | None = None
    """Rows served in full before ``failed_request`` was sent (None: not
    known). A deterministic trigger among them would have struck first: where
    another run named one of them, the crash strikes at several places; where
    none did, a threshold crash that met its first qualifying request at a
    different point on each run (concurrent sessions racing) stays
    deterministic."""
    server: int | None = None
    """Which server of a pool ran the trial (the journal records it)."""

    @property
    def signature_hash(self) -> str | None:
        s = self.signature
        return s.hash if isinstance(s, Signature) else s


class Runner(Protocol):
    """Runs one trial (see the module doc). May raise
    :class:`~replayer.session.NotExercised` to refuse a trace that
    cannot show anything (as the real target does for an all-4xx replay)."""

    async def run(self, trial: Trial) -> Outcome | Observation: ...


def observed(got: Outcome | Observation) -> Observation:
    return got if isinstance(got, Observation) else Observation(got)


@dataclass
class FunctionRunner:
    """A plain function (sync or async) of a :class:`Trial` as a runner."""

    fn: Callable[[Trial], Outcome | Observation | Awaitable[Outcome | Observation]]

    async def run(self, trial: Trial) -> Outcome | Observation:
        got = self.fn(trial)
        if inspect.isawaitable(got):
            return await got
        return got


class SessionRunner:
    """The real server: each trial a fresh (or reset) server, replayed,
    watched and classified by the :class:`~replayer.session.Session`
    (``slot``: which of its servers; default the one under test). Over a
    :class:`~replayer.session.pool.Pool` (``pool``, default the session's),
    each trial leases a free server: as many run at once as are free."""

    def __init__(
        self, session: Session, slot: Slot | None = None, pool: Pool | None = None
    ) -> None:
        self.session = session
        self.pool = pool if pool is not None else (session.pool if slot is None else None)
        self.slot = slot or session.slot
        self._one = asyncio.Lock()
        """One server runs one trial at a time, whatever the caller asks."""

    @property
    def width(self) -> int:
        return self.pool.usable if self.pool is not None else 1

    async def run(self, trial: Trial) -> Observation:
        if self.pool is None:
            async with self._one:
                return await self._run(trial, self.slot, None)
        async with self.pool.lease(trial.number) as slot:
            return await self._run(trial, slot, self.pool.slots.index(slot))

    async def _run(self, trial: Trial, slot: Slot | None, server: int | None) -> Observation:
        res = await self.session.trial(
            trial.out,
            rows=trial.rows,
            slot=slot,
            policy=trial.policy,
            trace=trial.trace,
            chase=trial.chase,
        )
        if self.pool is not None and slot is not None:
            if res.outcome is Outcome.INFRA and res.run is None:
                # it never started (a lost Slurm job did: that is no reason
                # to retire the server)
                self.pool.note_failure(slot, res.message or "did not start")
            else:
                self.pool.note_started(slot)
        if res.unexercised and trial.stage == "calibrate":
            raise NotExercised(res.unexercised)
        sent: list[int] | None = None
        in_flight: list[int] = []
        cleared: list[int] | None = None
        if res.failure is not None and res.run is not None:
            sent, in_flight = failure_rows(trial.out, res.failure)
            cleared = cleared_rows(trial.out, res.failure)
        sig = res.signature
        return Observation(
            res.outcome,
            failure_class=res.failure_class,
            signature=sig,
            message=res.message,
            failed_request=failing_request(res.failure),
            sent=sent,
            in_flight=in_flight,
            cleared=cleared,
            server=server,
        )

    async def aclose(self) -> None:
        if self.session.keep_running:
            return
        if self.pool is not None:
            await self.pool.aclose()
        elif self.slot is not None:
            await self.slot.stop()


def as_runner(runner: Runner | Session) -> Runner:
    return SessionRunner(runner) if isinstance(runner, Session) else runner


def failing_request(failure: dict[str, Any] | None) -> str | None:
    """The request the server was processing when it failed: named by the
    fault's own record, or the client's only request in flight; None where
    several were in flight and no record named one. Every stream sees an
    engine death at once, so the first to see it proves nothing; nor does
    the request new in the scheduler's failing step, when the fault surfaced
    a step or more after its trigger (a delayed or asynchronous error). The
    bisect takes two different names as a crash striking at two places, so
    only exact evidence may name one."""
    if not failure:
        return None
    if failure.get("request_from") == "fault" or not failure.get("inflight"):
        return failure.get("request_id")
    return None


def cleared_rows(run: Path, failure: dict[str, Any]) -> list[int] | None:
    """Rows served in full (status ``ok``) before the failing request was
    sent: the requests that met the server first and did not crash it. None
    where no request is named by exact evidence (:func:`failing_request`) or
    its dispatch is not in the results. Done before the dispatch, not merely
    dispatched before it: two requests sent together can reach the engine in
    either order."""
    rid = failing_request(failure)
    if rid is None:
        return None
    results = list(read_results(run / "results.arrow"))
    sent_at = next((r["dispatched_us"] for r in results if r["request_id"] == rid), None)
    if sent_at is None:
        return None
    return [
        r["row"]
        for r in results
        if r["status"] == "ok" and r["done_us"] is not None and r["done_us"] < sent_at
    ]


def failure_rows(run: Path, failure: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(rows dispatched at or before the failure, rows in flight then), from a
    run directory's results."""
    at_us = round(failure["at_s"] * 1e6)
    sent: list[int] = []
    in_flight: list[int] = []
    for r in read_results(run / "results.arrow"):
        if r["dispatched_us"] is None or r["dispatched_us"] > at_us:
            continue
        sent.append(r["row"])
        done = r["done_us"]
        if done is None or done >= at_us or r["request_id"] == failure["request_id"]:
            in_flight.append(r["row"])
    return sent, in_flight


def run_failure(run: Path) -> dict[str, Any] | None:
    """The failure a run directory's summary records (a journal written
    before failure points were journaled is resumed from these)."""
    summary = read_summary(run)
    if summary is None or not (run / "results.arrow").exists():
        return None
    targets = summary.get("targets", {})
    failure: dict[str, Any] | None = next(
        (t["failure"] for t in targets.values() if t.get("failure")), None
    )
    return failure
