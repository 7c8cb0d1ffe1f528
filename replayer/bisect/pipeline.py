"""``replayer bisect``: from a crashing trace to a minimal repro bundle.

Stages (each optional), every one a pass over the best candidate so far:

1. **calibrate**: replay the full selection until ``calibrate_matches``
   matching crashes or ``calibrate_runs`` runs. The first crash pins the
   chased signature (unless ``--signature`` did), and the rate sets how many
   quiet runs it takes to dismiss a candidate.
2. **cut**: drop every request dispatched after the failure.
3. **prefix**: the shortest crashing prefix in trace order (binary search;
   the crash may come seconds after its trigger, so the failure point is only
   an upper bound).
4. **sessions**: the fewest sessions of that prefix that still crash, the
   last request's session pinned, likely culprits first (the sessions named in
   vLLM's scheduler dump, then those in flight at the crash, then by recency).
5. **turns**: the fewest requests of those sessions, the last one pinned,
   newest first.
6. **shrink**: the same crash with less inside the requests: ``max_tokens``,
   the crashing request's context (trailing blocks or characters, oldest
   conversation turns) and the prefix-cache hit it needs, each down to its
   threshold (:mod:`~replayer.bisect.shrink`).
7. **timing**: faster replay (x2, x4 ... of the speed, then ``asap``), kept
   only while the crash survives: every later run of the bundle is cheaper.

Then **confirm**: N runs of the result (k/N with a Wilson interval), and the
same on the control target if there is one. The best-so-far bundle is
rewritten after every improvement, so a stopped bisect leaves a usable one.
Every trial is journaled (``journal.jsonl``) before the search moves on;
``--resume`` replays the journal and continues without repeating a trial.

Who runs a trial is a :class:`~replayer.bisect.runner.Runner`: a real
target (a :class:`~replayer.bisect.trial.TrialEnv`, wrapped as
:class:`~replayer.bisect.runner.EnvRunner`) or a user's own oracle, for
the main target and the control alike. The passes are in
:mod:`~replayer.bisect.stages`, confirmation in
:mod:`~replayer.bisect.confirm`, the bundle in
:mod:`~replayer.bisect.manifest`.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from replayer.bisect import confirm as _confirm
from replayer.bisect import manifest as _manifest
from replayer.bisect import shrink as _shrink
from replayer.bisect import stages as _stages
from replayer.bisect.oracle import (
    Budget,
    BudgetExhausted,
    Candidate,
    Oracle,
    Outcome,
    TrialRecord,
)
from replayer.bisect.runner import Runner, Trial, as_runner, observed
from replayer.bisect.stages import STAGES, NotReproducible
from replayer.bisect.stats import fisher_one_sided
from replayer.bisect.trial import Chase, NotExercised, TrialEnv
from replayer.errors import OptionError
from replayer.monitor.signature import Signature
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.trace.reader import Trace

__all__ = [
    "STAGES",
    "Bisect",
    "BisectOptions",
    "BisectResult",
    "Control",
    "NotReproducible",
    "fisher_one_sided",
    "run_bisect",
]


@dataclass(frozen=True)
class BisectOptions:
    """How hard a bisect searches and how it confirms (see the module doc)."""

    stages: tuple[str, ...] = STAGES
    calibrate_matches: int = 5
    calibrate_runs: int = 10
    prefix_recheck: int = 2
    """After a binary prefix search (a crash that looked deterministic), runs
    of the longest prefix it found quiet: each costs a deterministic crash
    one trial and catches a crash that is flaky at shorter lengths with
    probability p (bench/RESULTS.md, "Bisect for real crashes")."""
    shrink_steps: int = 256
    """The shrink stage cuts a text prompt, or the prose of a conversation
    item, in at most this many steps (log2 of it probes per text)."""
    confirm: int = 10
    alpha: float = 0.05
    max_trials: int | None = None
    max_time: float | None = None
    speedups: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0)
    try_asap: bool = True
    bundle: bool = True
    """Write the repro bundle (after every improvement and at the end)."""

    def __post_init__(self) -> None:
        bad = [s for s in self.stages if s not in STAGES]
        if bad:
            raise OptionError(
                "stages",
                f"names unknown stage(s) {', '.join(bad)}; the stages are {', '.join(STAGES)}",
            )
        if self.calibrate_matches < 1:
            raise OptionError("calibrate_matches", "must be at least 1")
        if self.calibrate_runs < 1:
            raise OptionError("calibrate_runs", "must be at least 1")
        if self.confirm < 0:
            raise OptionError("confirm", "must not be negative")
        if self.prefix_recheck < 0:
            raise OptionError("prefix_recheck", "must not be negative")
        if self.shrink_steps < 2:
            raise OptionError("shrink_steps", "must be at least 2")
        if not 0 < self.alpha < 1:
            raise OptionError("alpha", "must be between 0 and 1")
        if self.max_trials is not None and self.max_trials < 1:
            raise OptionError("max_trials", "must be at least 1")
        if self.max_time is not None and not self.max_time > 0:
            raise OptionError("max_time", "must be positive")


@dataclass
class Control:
    """The platform that runs clean (e.g. B300): the repro is replayed there too."""

    name: str
    runner: Runner | TrialEnv


@dataclass
class BisectResult:
    status: str
    """``complete``, ``budget_exhausted``, ``not_reproducible`` or ``not_exercised``."""
    best: Candidate
    bundle: Path | None
    trials: int
    reproduction: tuple[int, int] = (0, 0)
    control: tuple[int, int] | None = None
    signature: Signature | None = None
    stages_done: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    """The best repro's request ids, in trace order."""
    other_failures: list[dict[str, Any]] = field(default_factory=list)
    """The first trial of each other failure met (not the chased crash):
    journaled trial records, one per signature."""
    shrink: dict[str, Any] | None = None
    """What the shrink stage found (the manifest's ``shrink``): ``text`` is
    the line for people ("crashes at >= 327,680 prompt tokens, not at 327,168")."""


class _Trials:
    """The oracle's runner: a candidate becomes a :class:`Trial` for the
    bisect's runner, and what it observed a journaled :class:`TrialRecord`."""

    def __init__(self, bisect: Bisect) -> None:
        self.b = bisect

    async def run(self, cand: Candidate, trial: int, stage: str) -> TrialRecord:
        b = self.b
        rel = f"trials/{trial:04d}"
        started = time.time()
        t0 = time.monotonic()
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
            duration_s=round(time.monotonic() - t0, 3),
            started_at=started,
            run=rel,
            failed_request=obs.failed_request,
            suspects=list(obs.suspects or getattr(obs.signature, "suspects", ())),
            reached=None if sent is None else b.reached(sent),
            inflight=b.positions_of(b.source_rows(spec.trace, obs.in_flight)),
        )
        if isinstance(obs.signature, Signature):
            path = b.out / rel / "signature.json"
            if not path.exists():  # the real target writes its own
                path.write_bytes(orjson.dumps(obs.signature.to_dict(), option=orjson.OPT_INDENT_2))
        if outcome is Outcome.MATCH:
            if not c.pinned:
                # the first crash of the full trace is the one this bisect chases
                c.pin(obs.failure_class, obs.signature)
            if b.signature is None and isinstance(obs.signature, Signature):
                b.signature = obs.signature
        return rec


class Bisect:
    """One minimization of one trace with one runner (see the module doc).

    ``runner`` is a real target's :class:`TrialEnv` or any
    :class:`~replayer.bisect.runner.Runner`; ``policy`` (default: the
    env's) is the replay policy trials start from and the bundle states;
    ``chase`` (default: the env's) pins the failure to chase.

    **Usage**::

        b = Bisect(trace, rows, env, out, BisectOptions(confirm=10))
        result = await run_bisect(b)
    """

    def __init__(
        self,
        trace: Trace,
        rows: Sequence[int],
        runner: Runner | TrialEnv,
        out: Path,
        opts: BisectOptions | None = None,
        *,
        control: Control | None = None,
        policy: ReplayPolicy | None = None,
        chase: Chase | None = None,
        facts: dict[str, Any] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        env = runner if isinstance(runner, TrialEnv) else None
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
        self.started = time.monotonic()
        out.mkdir(parents=True, exist_ok=True)
        self.oracle = Oracle(
            _Trials(self),
            out / "journal.jsonl",
            alpha=self.opts.alpha,
            # a crash seen on every calibration run is taken as deterministic
            deterministic_after=self.opts.calibrate_matches,
            budget=Budget(self.opts.max_trials, self.opts.max_time),
        )
        self.oracle.on_trial.append(self._progress)
        self.sessions = trace.column("session_id")
        self.ids = trace.column("request_id")
        self._pos_of = {r: p for p, r in enumerate(self.rows)}
        self.best = Candidate(
            tuple(range(len(self.rows))), self.policy.timing.value, self.policy.speed
        )
        self.prefix_length: int | None = None
        self.stages_done: list[str] = []
        self.trace_sha = ""
        self.vary: Callable[[Bisect], Awaitable[None]] | None = None
        """Run after confirming (``--vary``: :func:`replayer.bisect.vary.bisect_hook`)."""
        self.variants: dict[str, Any] | None = None
        """What the hook found: the manifest's ``variants``."""
        self.shrunk: dict[str, Any] | None = None
        """What the shrink stage found: the manifest's ``shrink``."""
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

    def _progress(self, rec: TrialRecord, cand: Candidate) -> None:
        k, n = self.oracle.crash_rate()
        what = f"{rec.outcome.value}"
        if rec.failure_class:
            what += f" ({rec.failure_class}" + (f" {rec.signature}" if rec.signature else "") + ")"
        elapsed = time.monotonic() - self.started
        left = self._projection()
        self.say(
            f"trial {rec.trial:>3} [{rec.stage}] {rec.size:,} requests -> {what} in "
            f"{rec.duration_s:.1f}s | best {len(self.best.positions):,} requests | crash rate "
            f"{k}/{n}, dismiss after {self.oracle.repeats()} quiet | "
            f"~{left} trials left{self._eta(left)} | {elapsed:,.0f}s"
        )

    def plan(self) -> str:
        """What is left to run and what it should cost: said once calibration
        has timed the first trials (a crash, then the restart after it)."""
        left = [s for s in STAGES if s in self.opts.stages and s not in self.stages_done]
        if self.opts.confirm:
            left.append(f"confirm ({self.opts.confirm} runs)")
            if self.control is not None:
                left.append(f"control ({self.opts.confirm} runs)")
        n = self._projection()
        costs = self.oracle.trial_costs()
        per = (
            f"; a trial takes ~{_duration(costs[0])} after a crash (restart included), "
            f"~{_duration(costs[1])} after a pass"
            if costs
            else ""
        )
        return f"== plan: {', '.join(left) or 'nothing'}: ~{n} trials{self._eta(n)}{per}"

    def _eta(self, left: int) -> str:
        """`` (~12 min)``: ``left`` trials at the measured cost of a trial
        after a crash (it restarts the server: a model load) and after a
        pass, mixed by the crash rate; empty before two trials are in."""
        return f" (~{_duration(est)})" if (est := expected_seconds(self.oracle, left)) else ""

    def _projection(self) -> int:
        """A rough count of trials left (binary searches over what remains)."""
        n = len(self.best.positions)
        per_probe = 1 + (self.oracle.repeats() - 1) / 2
        stages_left = [s for s in STAGES if s in self.opts.stages and s not in self.stages_done]
        probes = 0.0
        for s in stages_left:
            if s in ("prefix", "sessions", "turns"):
                probes += math.ceil(math.log2(max(n, 2))) + (
                    self.opts.prefix_recheck if s == "prefix" else 0
                )
            elif s == "shrink":
                # max_tokens on a doubling grid, the context, a provider: ~3 short searches
                probes += 3 * (4 + min(1, self.opts.prefix_recheck))
            elif s == "timing":
                probes += len(self.opts.speedups) + max(2, self.opts.calibrate_matches)
        return (
            round(probes * per_probe)
            + self.opts.confirm * (self.control is not None)
            + (self.opts.confirm if self.opts.confirm else 0)
        )

    def derived(self, cand: Candidate) -> tuple[Trace, list[int]]:
        """The trace and rows a trial of ``cand`` replays: the selection's own,
        or for a shrunk candidate a small trace of its edited requests."""
        rows = [self.rows[p] for p in cand.positions]
        if not cand.edit:
            return self.trace, rows
        got = self._derived.get(cand.key())
        if got is None:
            path = self.out / "shrunk" / f"{cand.key()}.arrow"
            t = _shrink.materialize(self.trace, rows, _shrink.Edit.parse(cand.edit), path)
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
        return _manifest.write(self, status)

    # -- the whole run ------------------------------------------------------------

    async def run(self) -> BisectResult:
        passes: dict[str, Callable[[Bisect], Awaitable[None]]] = {
            "calibrate": _stages.calibrate,
            "cut": _stages.cut,
            "prefix": _stages.prefix,
            "sessions": _stages.sessions,
            "turns": _stages.turns,
            "shrink": _shrink.shrink,
            "timing": _stages.timing,
        }
        status = "complete"
        try:
            for name in STAGES:
                if name not in self.opts.stages:
                    continue
                if name != "calibrate" and not self.oracle.matched:
                    # without calibration, the full selection is taken as crashing
                    await _stages.calibrate(self)
                await passes[name](self)
                self.stages_done.append(name)
                if name == "calibrate":
                    self.say(self.plan())
            if self.opts.confirm:
                await _confirm.confirm(self)
                if await _confirm.revisit(self):
                    await _confirm.confirm(self)  # the smaller result's own runs
                self.stages_done.append("confirm")
            if self.vary is not None:
                await self.vary(self)
        except NotReproducible as exc:
            self.say(f"== not reproducible: {exc}")
            return BisectResult("not_reproducible", self.best, None, self.oracle.trials)
        except NotExercised as exc:
            self.say(f"== NOT EXERCISED, refusing to bisect: {exc}")
            return BisectResult("not_exercised", self.best, None, self.oracle.trials)
        except BudgetExhausted as exc:
            status = "budget_exhausted"
            self.say(f"== stopped: {exc}; the best repro so far stands")
        bundle = self.write_bundle(status)
        return BisectResult(
            status,
            self.best,
            bundle,
            self.oracle.trials,
            _confirm.confirm_counts(self),
            _confirm.control_counts(self),
            self.signature,
            self.stages_done,
            [self.ids[self.rows[p]] for p in self.best.positions],
            [r.to_json() for r in self.oracle.bugs.values()],
            _manifest.shrink_dict(self),
        )

    async def aclose(self) -> None:
        """Stop what the runners hold (the targets they launched)."""
        closers = [getattr(r, "aclose", None) for r in (self.runner, self.control_runner)]
        await asyncio.gather(*(c() for c in closers if c is not None), return_exceptions=True)


async def run_bisect(b: Bisect) -> BisectResult:
    """Run ``b`` and always stop the targets it started."""
    try:
        return await b.run()
    finally:
        await b.aclose()


def expected_seconds(oracle: Oracle, left: int) -> float | None:
    """Wall time of ``left`` more trials, from the journal: a trial that
    follows a failure restarts the server first, so the two kinds are timed
    apart (:meth:`Oracle.trial_costs`) and mixed by the pooled crash rate
    (the chance the next trial follows a failure). None with fewer than two
    timed trials."""
    costs = oracle.trial_costs()
    if costs is None or left <= 0:
        return None
    k, n = oracle.crash_rate()
    f = k / n if n else 0.5
    return left * (f * costs[0] + (1 - f) * costs[1])


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
