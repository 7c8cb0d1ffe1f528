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
server (a :class:`~replayer.session.Session`, wrapped as
:class:`~replayer.bisect.runner.SessionRunner`) or a user's own oracle, for
the main target and the control alike. The passes are in
:mod:`~replayer.bisect.stages`, confirmation in
:mod:`~replayer.bisect.confirm`, the bundle in
:mod:`~replayer.bisect.manifest`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayer._clock import Clock
from replayer.bisect import confirm as _confirm
from replayer.bisect import manifest as _manifest
from replayer.bisect import reliability as _reliability
from replayer.bisect import shrink as _shrink
from replayer.bisect import stages as _stages
from replayer.bisect.oracle import (
    BudgetExhausted,
    Candidate,
    Oracle,
    TrialRecord,
)
from replayer.bisect.runner import Runner
from replayer.bisect.stages import NotReproducible
from replayer.bisect.state import Control, Search
from replayer.bisect.stats import describe_rate, fisher_one_sided
from replayer.monitor.signature import Signature
from replayer.options.search import STAGES, BisectOptions
from replayer.replay.policy import ReplayPolicy
from replayer.session import Chase, NotExercised, Session
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


@dataclass
class BisectResult:
    status: str
    """``complete``, ``below_floor`` (the confirm runs crashed less often
    than ``min_rate``: not a reproducer), ``budget_exhausted``,
    ``not_reproducible`` or ``not_exercised``."""
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
    selected: int = 0
    """Requests in the selection the bisect started from."""
    variants: dict[str, Any] | None = None
    """What made the crash go away (``--vary``'s report), or None."""
    reliable: dict[str, Any] | None = None
    """Where the result crashes rarely: the smallest candidate seen crashing
    at least ``reliable_rate`` of its runs (requests, size, reproduction)."""
    signatures: list[dict[str, Any]] = field(default_factory=list)
    """Every failure signature met, chased first, with its match fraction."""
    hand_over: str = ""
    """Which of the results to give a kernel engineer, in one sentence."""
    floor: float = 0.15


class Bisect(Search):
    """One minimization of one trace with one runner (see the module doc):
    the passes in order over the shared :class:`~replayer.bisect.state.Search`,
    then confirmation and ``vary`` (run after confirming: ``--vary``,
    :func:`replayer.bisect.vary.bisect_hook`).

    **Usage**::

        b = Bisect(trace, rows, session, out, BisectOptions(confirm=10))
        result = await run_bisect(b)
    """

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
        vary: Callable[[Search], Awaitable[None]] | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            trace, rows, runner, out, opts, control=control, policy=policy, chase=chase,
            facts=facts, say=say, clock=clock,
        )  # fmt: skip
        self.vary = vary
        self.bundle_writer = _manifest.write
        self.oracle.on_trial.append(self._progress)

    def _progress(self, rec: TrialRecord, cand: Candidate) -> None:
        k, n = self.oracle.crash_rate()
        what = f"{rec.outcome.value}"
        if rec.failure_class:
            what += f" ({rec.failure_class}" + (f" {rec.signature}" if rec.signature else "") + ")"
        elapsed = self.clock.now() - self.started
        left, rounds = self._projection(self.oracle.width)
        on = f" on server {rec.server}" if rec.server is not None and self.oracle.width > 1 else ""
        self.say(
            f"trial {rec.trial:>3} [{rec.stage}]{on} {rec.size:,} requests -> {what} in "
            f"{rec.duration_s:.1f}s | best {len(self.best.positions):,} requests | crash rate "
            f"{k}/{n}, dismiss after {self.oracle.repeats()} quiet | "
            f"~{left} trials left{self._eta(rounds)} | {elapsed:,.0f}s"
        )

    def plan(self) -> str:
        """What is left to run and what it should cost: said once calibration
        has timed the first trials (a crash, then the restart after it). On
        a pool, the wall time is for the servers in hand, and what one more
        would save (a lab's question: is another node worth asking for?)."""
        left = [s for s in STAGES if s in self.opts.stages and s not in self.stages_done]
        if self.opts.confirm:
            left.append(f"confirm ({self.opts.confirm} runs)")
            if self.control is not None:
                left.append(f"control ({self.opts.confirm} runs)")
        width = self.oracle.width
        n, rounds = self._projection(width)
        costs = self._costs()
        per = pool = more = ""
        if costs:
            per = (
                f"; a trial takes ~{_duration(costs[0])} after a crash (restart included), "
                f"~{_duration(costs[1])} after a pass"
            )
        if width > 1:
            pool = f" in ~{rounds} rounds on {width} servers"
            per = per or "; timed once a server has restarted"
        now, after = self._seconds(rounds), self._seconds(self._projection(width + 1)[1])
        if now is not None and after is not None and now - after >= 1:
            more = f"; one more server would save ~{_duration(now - after)}"
        return (
            f"== plan: {', '.join(left) or 'nothing'}: ~{n} trials{pool}{self._eta(rounds)}"
            f"{per}{more}"
        )

    def _eta(self, rounds: int) -> str:
        """`` (~12 min)``: ``rounds`` rounds of trials (on one server, a round
        is a trial) at the measured cost of a trial after a crash (it
        restarts the server: a model load) and after a pass, mixed by the
        crash rate; empty before two trials are in."""
        return f" (~{_duration(est)})" if (est := self._seconds(rounds)) else ""

    def _costs(self) -> tuple[float, float] | None:
        """Seconds of a trial after a crash and after a pass: from one
        server's trials in turn, or on a pool from each server's own."""
        return self.oracle.trial_costs() if self.oracle.width == 1 else self.oracle.pool_costs()

    def _seconds(self, rounds: int) -> float | None:
        """Wall time of ``rounds`` rounds. On a pool a crashed server restarts
        in the background while the others run, and a round waits for it
        when it needs every server: a round costs a restart when any of its
        trials crashed, at the pooled crash rate."""
        width = self.oracle.width
        if width == 1:
            return expected_seconds(self.oracle, rounds)
        costs = self._costs()
        if costs is None or rounds <= 0:
            return None
        k, n = self.oracle.crash_rate()
        crashed = 1 - (1 - (k / n if n else 0.5)) ** width
        return rounds * (crashed * costs[0] + (1 - crashed) * costs[1])

    def _projection(self, width: int = 1) -> tuple[int, int]:
        """A rough count of trials left, and of rounds they take on ``width``
        servers: a search stage is a (width+1)-ary search of ``width``
        probes a round; repeated runs (a flaky candidate's, confirm,
        control, timing's speeds) spread over the servers."""
        n = len(self.best.positions)
        per_probe = 1 + (self.oracle.repeats() - 1) / 2
        stages_left = [s for s in STAGES if s in self.opts.stages and s not in self.stages_done]
        probes = rounds = 0.0
        for s in stages_left:
            if s in ("prefix", "sessions", "turns"):
                recheck = self.opts.prefix_recheck if s == "prefix" else 0
                probes += math.ceil(math.log2(max(n, 2))) + recheck
                rounds += math.ceil(math.log(max(n, 2)) / math.log(width + 1)) + recheck
            elif s == "shrink":
                # max_tokens on a doubling grid, the context, a provider: ~3 short searches
                probes += 3 * (4 + min(1, self.opts.prefix_recheck))
                rounds += 3 * (math.ceil(4 / width) + min(1, self.opts.prefix_recheck))
            elif s == "timing":
                runs = len(self.opts.speedups) + max(2, self.opts.calibrate_matches)
                probes += runs
                rounds += math.ceil(runs / width)
        confirm = self.opts.confirm * (1 + (self.control is not None))
        # the revisit: each request left tries up to ``each`` runs (the
        # result's own rate, not the pooled one, sets them)
        left, each = self.revisit_left
        revisit, revisit_rounds = left * each, left * math.ceil(each / width)
        trials = round(probes * per_probe) + confirm + revisit
        if width > 1:
            # every server busy each round, some of it on probes made moot
            trials = min(
                2 * trials, max(trials, round(rounds * per_probe * width) + confirm + revisit)
            )
        return trials, round(rounds * per_probe) + math.ceil(confirm / width) + revisit_rounds

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
                self.reliable = await _reliability.reliable_alternative(self)
                k, n = _confirm.confirm_counts(self)
                if n and (k == 0 or k / n < self.opts.min_rate):
                    status = "below_floor"
                    self.say(
                        f"== below the floor: the result {describe_rate(k, n)}, under "
                        f"{self.opts.min_rate:.0%}: not a reproducer"
                    )
            if self.vary is not None and status == "complete":
                await self.vary(self)
        except NotReproducible as exc:
            self.say(f"== not reproducible: {exc}")
            return BisectResult(
                "not_reproducible", self.best, None, self.oracle.trials, selected=len(self.rows)
            )
        except NotExercised as exc:
            self.say(f"== NOT EXERCISED, refusing to bisect: {exc}")
            return BisectResult(
                "not_exercised", self.best, None, self.oracle.trials, selected=len(self.rows)
            )
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
            len(self.rows),
            self.variants,
            self.reliable,
            _reliability.signatures_seen(self),
            _manifest.hand_over(self),
            self.opts.min_rate,
        )


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
