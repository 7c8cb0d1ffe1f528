"""The state a bisect's passes share, behind one narrow interface.

:class:`Search` is what every pass (:mod:`~replayer.bisect.stages`,
:mod:`~replayer.bisect.confirm`, :mod:`~replayer.bisect.shrink`) and the
bundle writer (:mod:`~replayer.bisect.manifest`) see: the selection, the
best candidate so far, the oracle that runs and journals trials, and what the
passes found. It imports none of them, so the passes sit above it and the
pipeline (:mod:`~replayer.bisect.pipeline`) above them all: the package has
no import cycle.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from replayer._clock import REAL, Clock
from replayer._files import writing
from replayer.bisect.edit import Edit, materialize
from replayer.bisect.oracle import Budget, Candidate, Oracle, Outcome, TrialRecord, spans
from replayer.bisect.runner import Runner, Trial, as_runner, observed
from replayer.bisect.search import width_of
from replayer.monitor.signature import Signature
from replayer.options.search import BisectOptions
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.session import Chase, Session
from replayer.trace.reader import Trace


@dataclass
class Control:
    """The platform that runs clean (e.g. B300): the repro is replayed there too."""

    name: str
    runner: Runner | Session


class _Trials:
    """The oracle's runner: a candidate becomes a :class:`Trial` for the
    bisect's runner, and what it observed a journaled :class:`TrialRecord`."""

    def __init__(self, bisect: Search) -> None:
        self.b = bisect

    @property
    def width(self) -> int:
        """Trials the bisect's runner runs at once (a pool's servers)."""
        return width_of(self.b.runner)

    async def run(self, cand: Candidate, trial: int, stage: str) -> TrialRecord:
        b = self.b
        rel = f"trials/{trial:04d}"
        started = b.clock.wall()
        t0 = b.clock.now()
        spec = b.trial(cand, trial, stage, b.out / rel, b.chase)
        obs = observed(await b.runner.run(spec))
        sent = None if obs.sent is None else b.source_rows(spec.trace, obs.sent)
        sig = obs.signature_hash
        outcome = obs.outcome
        c = b.chase
        if outcome is Outcome.MATCH and c.is_other(obs.signature):
            outcome = Outcome.OTHER_FAILURE  # a runner's MATCH with another crash's label
        rec = TrialRecord(
            trial=trial,
            key=cand.key(),
            size=len(cand.positions),
            stage=stage,
            outcome=outcome,
            failure_class=obs.failure_class,
            signature=sig,
            message=obs.message,
            duration_s=round(b.clock.now() - t0, 3),
            started_at=started,
            server=obs.server,
            run=rel,
            failed_request=obs.failed_request,
            suspects=list(obs.suspects or getattr(obs.signature, "suspects", ())),
            reached=None if sent is None else b.reached(sent),
            inflight=b.positions_of(b.source_rows(spec.trace, obs.in_flight)),
        )
        if obs.failed_request is not None and obs.cleared is not None:
            rec.failed_at = b.position_of_id(obs.failed_request)
            if rec.failed_at is not None:
                rec.cleared = spans(b.positions_of(b.source_rows(spec.trace, obs.cleared)))
        if isinstance(obs.signature, Signature):
            path = b.out / rel / "signature.json"
            if not path.exists():  # the real target writes its own
                with writing(path):
                    path.write_bytes(
                        orjson.dumps(obs.signature.to_dict(), option=orjson.OPT_INDENT_2)
                    )
        if outcome is Outcome.MATCH:
            if not c.pinned:
                # the first crash of the full trace is the one this bisect chases
                c.pin(obs.failure_class, obs.signature)
            if b.signature is None and isinstance(obs.signature, Signature):
                b.signature = obs.signature
        return rec


class Search:
    """What the passes of a bisect share: the selection, the best candidate
    so far, the oracle that runs and journals trials, and what was found.

    A pass asks :meth:`test` (or the oracle) and calls :meth:`improve`; it
    never runs a trial itself. ``runner`` is a
    :class:`~replayer.session.Session` (its server under test) or any
    :class:`~replayer.bisect.runner.Runner`; ``policy`` (default: the
    session's) is the replay policy trials start from and the bundle states;
    ``chase`` (default: the session's) pins the failure to chase."""

    def __init__(
        self,
        trace: Trace,
        rows: Sequence[int],
        runner: Runner | Session,
        out: Path,
        opts: BisectOptions | None = None,
        *,
        control: Control | None = None,
        policy: ReplayPolicy | None = None,
        chase: Chase | None = None,
        facts: dict[str, Any] | None = None,
        say: Callable[[str], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        env = runner if isinstance(runner, Session) else None
        self.clock: Clock = clock or (env.clock if env else REAL)
        """Where trials are timed (a test's or a simulation's virtual clock)."""
        self.trace = trace
        self.rows = list(rows)
        self.runner = as_runner(runner)
        self.policy = policy or (env.policy if env else ReplayPolicy())
        self.chase = chase or (env.chase if env else Chase())
        self.out = out
        self.opts = opts or BisectOptions()
        self.control = control
        self.control_runner = as_runner(control.runner) if control else None
        self.facts = facts or {}
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.signature: Signature | None = None
        self.started = self.clock.now()
        with writing(out):
            out.mkdir(parents=True, exist_ok=True)
        self.oracle = Oracle(
            _Trials(self),
            out / "journal.jsonl",
            alpha=self.opts.alpha,
            # a crash seen on every calibration run is taken as deterministic
            deterministic_after=self.opts.calibrate_matches,
            budget=Budget(self.opts.max_trials, self.opts.max_time),
            clock=self.clock,
        )
        self.sessions = trace.column("session_id")
        self.ids = trace.column("request_id")
        self._pos_of = {r: p for p, r in enumerate(self.rows)}
        self._pos_of_id: dict[str, int] | None = None
        self.best = Candidate(
            tuple(range(len(self.rows))), self.policy.timing.value, self.policy.speed
        )
        self.prefix_length: int | None = None
        self.stages_done: list[str] = []
        self.trace_sha = ""
        self.bundle_writer: Callable[[Search, str], Path | None] | None = None
        """Writes the bundle of the best so far (the pipeline's; None: no bundle)."""
        self.variants: dict[str, Any] | None = None
        """What the hook found: the manifest's ``variants``."""
        self.shrunk: dict[str, Any] | None = None
        """What the shrink stage found: the manifest's ``shrink``."""
        self.shrink_refused: list[dict[str, Any]] = []
        """Cuts the shrink stage refused because the crash got rarer."""
        self.reliable: dict[str, Any] | None = None
        """The smallest candidate seen crashing at least ``reliable_rate``
        of its runs, where the result crashes less often (the manifest's
        ``reliable``)."""
        self.revisit_left: tuple[int, int] = (0, 0)
        """Requests the revisit has still to try, and runs each may take."""
        self._derived: dict[str, tuple[Trace, list[int]]] = {}
        self._restore_chase()

    # -- bookkeeping -------------------------------------------------------------

    def _restore_chase(self) -> None:
        """On resume, the chased failure is the first journaled match's."""
        for rec in self.oracle.history():
            if rec.outcome is not Outcome.MATCH:
                continue
            restored = not self.chase.pinned
            if restored:
                self.chase.pin(rec.failure_class, rec.signature)
            sig_path = self.out / (rec.run or "") / "signature.json"
            if rec.run and sig_path.exists():
                self.signature = Signature.from_dict(orjson.loads(sig_path.read_bytes()))
                if restored and self.signature.hash == rec.signature:
                    # the journal holds the hash only: the exit-aware match needs the rest
                    self.chase.pin(rec.failure_class, self.signature)
                return

    def derived(self, cand: Candidate) -> tuple[Trace, list[int]]:
        """The trace and rows a trial of ``cand`` replays: the selection's own,
        or for a shrunk candidate a small trace of its edited requests."""
        rows = [self.rows[p] for p in cand.positions]
        if not cand.edit:
            return self.trace, rows
        got = self._derived.get(cand.key())
        if got is None:
            path = self.out / "shrunk" / f"{cand.key()}.arrow"
            t = materialize(self.trace, rows, Edit.parse(cand.edit), path)
            if len(self._derived) >= 16:
                self._derived.pop(next(iter(self._derived)))
            got = self._derived[cand.key()] = (t, list(t.order))
        return got

    def source_rows(self, trace: Trace, rows: Sequence[int]) -> list[int]:
        """Rows of a derived trace as the selection's rows (by request id)."""
        if trace is self.trace:
            return list(rows)
        ids = trace.column("request_id")
        by_id = {self.ids[r]: r for r in self.rows}
        return [by_id[ids[r]] for r in rows if ids[r] in by_id]

    def served_prompt_tokens(self, cand: Candidate, request_id: str) -> int | None:
        """Prompt tokens the server reported for ``request_id`` in a quiet run of ``cand``."""
        from replayer.replay.results import read_results

        for rec in self.oracle.records.get(cand.key(), []):
            path = self.out / (rec.run or "") / "results.arrow"
            if rec.outcome is not Outcome.PASS or not rec.run or not path.exists():
                continue
            for r in read_results(path):
                if r["request_id"] == request_id and r.get("prompt_tokens"):
                    return int(r["prompt_tokens"])
        return None

    def trial(self, cand: Candidate, number: int, stage: str, out: Path, chase: Chase) -> Trial:
        """What the runner is asked: ``cand``'s rows with its timing and speed."""
        with writing(out):
            out.mkdir(parents=True, exist_ok=True)
        trace, rows = self.derived(cand)
        return Trial(
            trace=trace,
            rows=tuple(rows),
            policy=replace(self.policy, timing=Timing(cand.timing), speed=cand.speed),
            number=number,
            stage=stage,
            out=out,
            chase=chase,
        )

    def session(self, position: int) -> str:
        s: str = self.sessions[self.rows[position]]
        return s

    def positions_of(self, rows: Sequence[int]) -> list[int]:
        """Positions of the selection's ``rows`` (others are ignored)."""
        return [self._pos_of[r] for r in rows if r in self._pos_of]

    def position_of_id(self, request_id: str) -> int | None:
        """The selection's position of a request id (None: not in it)."""
        if self._pos_of_id is None:
            self._pos_of_id = {self.ids[r]: p for p, r in enumerate(self.rows)}
        return self._pos_of_id.get(request_id)

    def reached(self, sent: Sequence[int]) -> int | None:
        """1 + the last position among the rows ``sent`` (None: none sent)."""
        positions = self.positions_of(sent)
        return max(positions) + 1 if positions else None

    def candidate(self, positions: Sequence[int]) -> Candidate:
        return replace(self.best, positions=tuple(sorted(positions)))

    async def test(self, positions: Sequence[int], stage: str) -> bool:
        return await self.oracle.test(self.candidate(positions), stage=stage, within=self.best)

    def improve(self, cand: Candidate, stage: str) -> None:
        if cand != self.best:
            self.best = cand
            self.say(
                f"== {stage}: best repro now {len(cand.positions):,} requests "
                f"({cand.timing}, speed {cand.speed:g})"
            )
            self.write_bundle("in_progress")

    def stage_runs(self, cand: Candidate, stage: str) -> list[TrialRecord]:
        """``cand``'s journaled runs in ``stage`` that reached a verdict (not INFRA)."""
        return [
            r
            for r in self.oracle.records.get(cand.key(), [])
            if r.stage == stage and r.outcome is not Outcome.INFRA
        ]

    def write_bundle(self, status: str) -> Path | None:
        return self.bundle_writer(self, status) if self.bundle_writer is not None else None

    async def aclose(self) -> None:
        """Stop what the runners hold (the targets they launched)."""
        closers = [getattr(r, "aclose", None) for r in (self.runner, self.control_runner)]
        await asyncio.gather(*(c() for c in closers if c is not None), return_exceptions=True)
