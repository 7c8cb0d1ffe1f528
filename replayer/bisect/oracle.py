"""Trials, outcomes and the oracle the search engines ask.

A *trial* replays one candidate on a fresh (or reset) target and ends in one
of five :class:`Outcome` values, never a boolean. The :class:`Oracle` turns
outcomes into verdicts: a candidate is interesting on its first ``MATCH``;
it is dismissed after ``r`` quiet runs, ``r`` from the crash rate measured so
far (:mod:`replayer.bisect.stats`); ``INFRA`` is retried, then dismissed as
unresolved; so is a trial whose failure was the network's (class
``network``: a healthy server behind a broken way), whatever its runner
called it. ``OTHER_FAILURE`` is a *new bug*: recorded with its witness,
never accepted.

Every trial and every verdict is appended to ``journal.jsonl`` before the
search moves on; a killed bisect resumes by replaying the journal into the
cache, so no finished trial is repeated. The crash rate pools the runs of
every candidate that contains a candidate that matched (by monotonicity,
those hold the culprits); while every such run has crashed (and at least
``deterministic_after`` have), the crash is taken as deterministic and one
quiet run dismisses a candidate.

Trials may run several at once (a pool of servers: :attr:`Oracle.width`):
each gets its number when it starts, is journaled when it ends (so the
journal is in the order trials finished), and one cancelled because another
made it moot is journaled as ``cancelled``, never as evidence.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import orjson

from replayer._clock import REAL, Clock
from replayer.bisect.files import append_journal, journal_events
from replayer.bisect.search import Contradicted, bayes_prefix, binary_prefix, race, width_of
from replayer.bisect.stats import repeats_for, wilson
from replayer.session.verdict import Outcome as Outcome
from replayer.session.verdict import infra_class


@dataclass(frozen=True)
class Candidate:
    """Positions in the source trace's order, plus the timing to replay them
    with and what the shrink stage changed inside them."""

    positions: tuple[int, ...]
    timing: str = "recorded"
    speed: float = 1.0
    edit: str = ""
    """Canonical JSON of a :class:`replayer.bisect.edit.Edit` (empty: the
    recorded bodies). Kept as text so the journal and the key stay plain."""

    def key(self) -> str:
        d: dict[str, Any] = {"p": list(self.positions), "timing": self.timing, "speed": self.speed}
        if self.edit:  # keys of unedited candidates stay what older journals hold
            d["edit"] = self.edit
        return hashlib.sha256(orjson.dumps(d)).hexdigest()[:24]

    @cached_property
    def members(self) -> frozenset[int]:
        return frozenset(self.positions)

    def covers(self, other: Candidate) -> bool:
        """Same policy and a superset of ``other`` (so it holds its culprits)."""
        return (
            (self.timing, self.speed, self.edit) == (other.timing, other.speed, other.edit)
            and len(other.positions) <= len(self.positions)
            and other.members <= self.members
        )


def spans(positions: Sequence[int]) -> list[list[int]]:
    """Positions as sorted ``[start, stop)`` spans: a trial's served requests
    are mostly one run of positions, so a journal line stays small."""
    out: list[list[int]] = []
    for p in sorted(set(positions)):
        if out and out[-1][1] == p:
            out[-1][1] = p + 1
        else:
            out.append([p, p + 1])
    return out


@dataclass
class TrialRecord:
    trial: int
    key: str
    size: int
    stage: str
    outcome: Outcome
    failure_class: str | None = None
    signature: str | None = None
    """Signature hash of the failure, if any."""
    message: str | None = None
    duration_s: float = 0.0
    started_at: float = 0.0
    server: int | None = None
    """Which server of the pool ran it (None: one server, or your own runner)."""
    run: str | None = None
    """The trial's run directory, relative to the bisect directory."""
    failed_request: str | None = None
    suspects: list[str] = field(default_factory=list)
    reached: int | None = None
    """1 + the last position sent by the time of the failure (None: not known)."""
    inflight: list[int] = field(default_factory=list)
    """Positions in flight at the failure."""
    failed_at: int | None = None
    """The position of ``failed_request`` (None: not known)."""
    cleared: list[list[int]] | None = None
    """Positions served in full before ``failed_request`` was sent, as
    ``[start, stop)`` spans (None: not known); see :meth:`Oracle.scattered`."""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["outcome"] = self.outcome.value
        return d


class CandidateRunner(Protocol):
    """Runs one trial of a candidate: the bisect's adapter over a
    :class:`~replayer.bisect.runner.Runner`, or a test's fake. It may have a
    ``width``: how many trials it runs at once (default 1)."""

    async def run(self, candidate: Candidate, trial: int, stage: str) -> TrialRecord: ...


class BudgetExhausted(Exception):
    """The trial or time budget ran out; the best result so far stands."""


@dataclass
class Budget:
    max_trials: int | None = None
    max_time: float | None = None
    """Seconds of wall clock, counted across resumes from the journal."""
    spent_s: float = 0.0

    def check(self, trials: int) -> None:
        if self.max_trials is not None and trials >= self.max_trials:
            raise BudgetExhausted(f"trial budget of {self.max_trials} used")
        if self.max_time is not None and self.spent_s >= self.max_time:
            raise BudgetExhausted(f"time budget of {self.max_time:g} s used")


class Oracle:
    """Verdicts over candidates, from cached and new trials (see module doc).

    **Usage**::

        oracle = Oracle(runner, journal=Path("bisect/journal.jsonl"))
        if await oracle.test(candidate, stage="prefix"): ...
    """

    def __init__(
        self,
        runner: CandidateRunner,
        journal: Path,
        *,
        alpha: float = 0.05,
        deterministic_after: int = 5,
        infra_retries: int = 2,
        p_floor: float = 0.05,
        budget: Budget | None = None,
        clock: Clock = REAL,
    ) -> None:
        self.runner = runner
        self.clock = clock
        self.journal = journal
        self.alpha = alpha
        self.deterministic_after = deterministic_after
        self.infra_retries = infra_retries
        self.p_floor = p_floor
        self.budget = budget or Budget()
        self.records: dict[str, list[TrialRecord]] = {}
        self.candidates: dict[str, Candidate] = {}
        self.verdicts: dict[str, bool] = {}
        self.matched: list[Candidate] = []
        self.bugs: dict[str, TrialRecord] = {}
        """First witness of each OTHER_FAILURE signature."""
        self.trials = 0
        self.marks: dict[str, int] = {}
        """Trial counts at named points of the search (journaled, for resume)."""
        self.stage = ""
        self._issued = 0
        """The last trial number handed out (cancelled ones included)."""
        self._runs = 0
        self._rate_memo: dict[tuple[int | None, int, str | None], tuple[int, int]] = {}
        self.on_trial: list[Any] = []
        self._load()
        self._spent_before = self.budget.spent_s
        self._t0 = clock.now()

    # -- journal ---------------------------------------------------------------

    def _load(self) -> None:
        if not self.journal.exists():
            return
        at = 0
        for end, e in journal_events(self.journal):
            at = end
            if e.get("event") == "trial":
                cand = Candidate(tuple(e["positions"]), e["timing"], e["speed"], e.get("edit", ""))
                rec = TrialRecord(
                    **{k: v for k, v in e["record"].items() if k != "outcome"},
                    outcome=Outcome(e["record"]["outcome"]),
                )
                self._account(cand, rec)
            elif e.get("event") == "verdict":
                self.verdicts[e["key"]] = bool(e["value"])
            elif e.get("event") == "time":
                self.budget.spent_s = float(e["spent_s"])
            elif e.get("event") == "mark":
                self.marks[e["name"]] = int(e["trials"])
            elif e.get("event") == "cancelled":
                self._issued = max(self._issued, int(e["trial"]))
        if at < self.journal.stat().st_size:
            # a torn last line of a killed run: everything before it stands,
            # and it goes, or the next entry appended would be torn with it
            with self.journal.open("r+b") as f:
                f.truncate(at)

    def _append(self, *entries: dict[str, Any], sync: bool = True) -> None:
        """Append ``entries`` all or nothing (a full disk leaves the journal as
        it was). Only trials are synced: a verdict or mark lost with the
        unsynced tail is recomputed from the same records."""
        append_journal(self.journal, entries, sync=sync)

    def _account(self, cand: Candidate, rec: TrialRecord) -> None:
        key = cand.key()
        self.candidates[key] = cand
        self.records.setdefault(key, []).append(rec)
        self._runs += 1
        self.trials = max(self.trials, rec.trial)
        self._issued = max(self._issued, rec.trial)
        if rec.outcome is Outcome.MATCH and not any(m == cand for m in self.matched):
            self.matched.append(cand)
        if rec.outcome is Outcome.OTHER_FAILURE and rec.signature:
            self.bugs.setdefault(rec.signature, rec)

    # -- statistics ------------------------------------------------------------

    def crash_rate(
        self, upto: int | None = None, within: Candidate | None = None
    ) -> tuple[int, int]:
        """Matches and non-INFRA runs pooled over candidates known to hold the
        culprits; with ``upto``, as it stood after trial ``upto``; with
        ``within``, only over candidates inside it (a smaller candidate can
        hold fewer of several triggers and crash less often than the whole
        trace did)."""
        memo = (upto, self._runs, within.key() if within else None)  # a new run: all stale
        if memo in self._rate_memo:
            return self._rate_memo[memo]
        runs = [
            (self.candidates[key], r)
            for key, recs in self.records.items()
            for r in recs
            if (upto is None or r.trial <= upto)
            and (within is None or within.covers(self.candidates[key]))
        ]
        matched = {c for c, r in runs if r.outcome is Outcome.MATCH}
        k = n = 0
        for cand, r in runs:
            if r.outcome is Outcome.INFRA or not any(cand.covers(m) for m in matched):
                continue
            n += 1
            k += r.outcome is Outcome.MATCH
        self._rate_memo = {m: v for m, v in self._rate_memo.items() if m[1] == self._runs}
        self._rate_memo[memo] = (k, n)
        return k, n

    def repeats(
        self,
        alpha: float | None = None,
        upto: int | None = None,
        within: Candidate | None = None,
    ) -> int:
        """Quiet runs needed to dismiss a candidate now (or after trial
        ``upto``). A crash every run so far is deterministic: one. Otherwise
        the rate's lower bound decides, the lower of the pooled one and the
        one of the runs ``within`` the candidate being reduced: shrinking can
        lower the rate, never raise it."""
        k, n = self.crash_rate(upto)
        if n and k == n and k >= self.deterministic_after and not self.scattered(upto):
            return 1
        lo, _ = wilson(k, n)
        if within is not None:
            # only on enough runs: a lower bound from three runs is near zero,
            # and would make every dismissal cost the cap
            kw, nw = self.crash_rate(upto, within)
            if nw >= 2 * self.deterministic_after:
                lo = min(lo, wilson(kw, nw)[0])
        return repeats_for(max(lo, self.p_floor), alpha if alpha is not None else self.alpha)

    def scattered(self, upto: int | None = None) -> bool:
        """Did the crash strike at more than one place? A trace whose every
        request past the trigger adds a 30 % chance crashes on every run, yet
        a candidate holding only the trigger crashes 30 % of the time, and
        one quiet run of it is no evidence it lacks the trigger. The evidence:
        a request named failing in one run that another run served in full
        before its own failing request was sent (it did not crash that one);
        where runs do not say what they served, any two different names;
        where none names one, runs of one candidate that failed at
        different points. Different names alone are no evidence: a
        threshold crash across concurrent sessions meets its first
        qualifying request at a different point on each run. Nor are
        different failure points of runs that had several requests in flight
        when they failed: which of them was sent last moves with the load."""
        named: list[TrialRecord] = []
        points: dict[str, set[int]] = {}
        for key, recs in self.records.items():
            for r in recs:
                if r.outcome is not Outcome.MATCH or (upto is not None and r.trial > upto):
                    continue
                if r.failed_request is not None:
                    named.append(r)
                elif r.reached is not None and len(r.inflight) <= 1:
                    points.setdefault(key, set()).add(r.reached)
        if named:
            if len({r.failed_request for r in named}) == 1:
                return False
            if any(r.failed_at is None or r.cleared is None for r in named):
                return True
            at = {r.failed_at for r in named}
            return any(
                x != r.failed_at and any(a <= x < b for a, b in r.cleared or ())
                for r in named
                for x in at
                if x is not None
            )
        return any(len(v) > 1 for v in points.values())

    def counts(self, cand: Candidate) -> dict[Outcome, int]:
        out = {o: 0 for o in Outcome}
        for r in self.records.get(cand.key(), []):
            out[r.outcome] += 1
        return out

    # -- verdicts --------------------------------------------------------------

    @property
    def width(self) -> int:
        """Trials the runner runs at once (its free servers)."""
        return width_of(self.runner)

    def _spent(self) -> float:
        return self._spent_before + (self.clock.now() - self._t0)

    async def run_once(self, cand: Candidate, stage: str) -> TrialRecord:
        """One more trial of ``cand`` (journaled before it is used)."""
        self.budget.spent_s = self._spent()
        self.budget.check(self._issued)
        self._issued += 1
        number = self._issued
        try:
            rec = await self.runner.run(cand, number, stage)
        except asyncio.CancelledError:
            # made moot by another trial's answer: evidence of nothing
            self._append(
                {"event": "cancelled", "trial": number, "stage": stage, "key": cand.key()},
                sync=False,
            )
            raise
        self.budget.spent_s = self._spent()
        if infra_class(rec.failure_class) and rec.outcome is not Outcome.INFRA:
            # the way to a healthy server broke: no evidence about the crash
            rec.outcome = Outcome.INFRA
        self._account(cand, rec)
        self._append(
            {
                "event": "trial",
                "positions": list(cand.positions),
                "timing": cand.timing,
                "speed": cand.speed,
                **({"edit": cand.edit} if cand.edit else {}),
                "record": rec.to_json(),
            },
            {"event": "time", "spent_s": self.budget.spent_s},
        )
        for cb in self.on_trial:
            cb(rec, cand)
        return rec

    async def run_many(
        self,
        cand: Candidate,
        n: int,
        stage: str,
        *,
        until: Callable[[TrialRecord], bool] | None = None,
    ) -> list[TrialRecord]:
        """``n`` trials of ``cand``, as many at once as the runner runs; when
        one ends with ``until(record)`` true, the others are cancelled. The
        finished records, in the order they finished."""
        if n <= 0:
            return []
        got = await race(
            list(range(n)),
            lambda _: self.run_once(cand, stage),
            (lambda _i, rec, _j: until(rec)) if until is not None else None,
            limit=self.width,  # never more trials at once than servers
        )
        return [rec for _, rec in got]

    async def test(
        self,
        cand: Candidate,
        *,
        stage: str = "",
        alpha: float | None = None,
        within: Candidate | None = None,
    ) -> bool:
        """Is ``cand`` interesting? Cached verdicts are final. ``within``: the
        candidate being reduced (see :meth:`repeats`)."""
        key = cand.key()
        if key in self.verdicts:
            return self.verdicts[key]
        infra_row = 0
        for _ in range(1000):  # bounded: each pass runs a trial or decides
            c = self.counts(cand)
            if c[Outcome.MATCH]:
                return self._decide(key, True)
            quiet = c[Outcome.PASS] + c[Outcome.OTHER_FAILURE] + c[Outcome.INVALID]
            need = self.repeats(alpha, within=within) - quiet
            if need <= 0:
                return self._decide(key, False)
            if infra_row > self.infra_retries:
                return self._decide(key, False)  # unresolved counts as not interesting
            # the quiet runs still needed, at once on free servers; a crash ends them
            recs = await self.run_many(
                cand, min(need, self.width), stage, until=lambda r: r.outcome is Outcome.MATCH
            )
            for rec in recs:
                infra_row = infra_row + 1 if rec.outcome is Outcome.INFRA else 0
        return self._decide(key, False)

    def mark(self, name: str) -> int:
        """The trial count when the search first reached ``name`` (journaled)."""
        if name not in self.marks:
            self.marks[name] = self.trials
            self._append({"event": "mark", "name": name, "trials": self.trials}, sync=False)
        return self.marks[name]

    async def flaky_prefix(
        self,
        n: int,
        make: Callable[[int], Candidate],
        *,
        stage: str = "prefix",
        binary_first: bool = False,
        recheck: int = 2,
        length_of: Callable[[int], int] | None = None,
    ) -> int:
        """The shortest crashing prefix by Bayesian bisection (one run per probe,
        :func:`~replayer.bisect.search.bayes_prefix`).

        The runs of the full selection before the search are its first data
        (as runs of prefix n). With ``binary_first`` (a crash that looked
        deterministic) a plain binary search of one run per probe goes first,
        then ``recheck`` more runs of the longest prefix it found quiet: if
        none crashes, its answer stands (a deterministic crash pays
        ``recheck`` runs over the binary search); if one does, the crash is
        flaky at the shorter lengths (a prefix with fewer of several triggers
        than the whole trace) and the Bayesian search takes over with every
        run so far as data. ``length_of`` maps a crashing run's failure point
        (1 + the last position sent before the failure) to a prefix length:
        nothing sent after it can have caused the crash, so the run counts as
        a crash of that shorter prefix. A probe first consumes the candidate's
        runs journaled after the stage began, oldest first, so a resumed search
        takes the same path and repeats no run."""
        clock = self.mark(stage)
        used: dict[str, int] = {}
        seen: list[tuple[int, bool]] = []

        async def run(j: int) -> int | None:
            """One run of prefix j: the prefix length it shows crashing, or None."""
            cand = make(j)
            key = cand.key()
            known = sorted(
                (r for r in self.records.get(key, []) if r.trial > clock), key=lambda r: r.trial
            )
            for _ in range(self.infra_retries + 1):
                i = used.get(key, 0)
                used[key] = i + 1  # taken before the await: runs of one j may overlap
                rec = known[i] if i < len(known) else await self.run_once(cand, stage)
                if rec.outcome is Outcome.INFRA:
                    continue
                if rec.outcome is not Outcome.MATCH:
                    seen.append((j, False))
                    return None
                at = j
                if length_of is not None and rec.reached is not None:
                    at = max(1, min(j, length_of(rec.reached)))
                seen.append((at, True))
                return at
            return None  # unresolved: taken as quiet, which only lengthens the search

        full = make(n)
        before = [
            (n, r.outcome is Outcome.MATCH)
            for r in self.records.get(full.key(), [])
            if r.trial <= clock and r.outcome is not Outcome.INFRA
        ]
        costs = self.trial_costs()
        crash_cost = costs[0] / costs[1] if costs and costs[1] > 0 else 1.0
        width = self.width
        if binary_first:
            try:
                lo, hi = await binary_prefix(n, run, width=width)
            except Contradicted:
                lo = hi = 0  # every run so far goes to the Bayesian search
            # Re-run the longest prefix found quiet, once dismissed on one run:
            # it holds the trigger whenever the search overshot (every later
            # probe was longer), so a crash flaky at that length shows there,
            # and a deterministic one pays only these runs (at once, on free
            # servers; the first crash ends the others).
            checks = await race(
                [lo] * (recheck if lo else 0),
                run,
                lambda _j, at, _k: at is not None,
                limit=width,
            )
            if hi and not any(at is not None for _, at in checks):
                return hi
        return await bayes_prefix(
            n, run, [*before, *seen], crash_cost=max(1.0, crash_cost), width=width
        )

    @property
    def issued(self) -> int:
        """The highest trial number handed out (journaled ones included)."""
        return self._issued

    def trial_costs(self) -> tuple[float, float] | None:
        """Mean seconds of a trial that follows a failure (it restarts the
        server first: a model load) and of one that follows a pass, from the
        journal; a kind not seen yet takes the mean of all. None with fewer
        than two timed trials."""
        hist = [r for r in self.history() if r.duration_s > 0]
        if len(hist) < 2:
            return None
        failed = (Outcome.MATCH, Outcome.OTHER_FAILURE)
        pairs = list(itertools.pairwise(hist))
        after_fail = [b.duration_s for a, b in pairs if a.outcome in failed]
        after_pass = [b.duration_s for a, b in pairs if a.outcome not in failed]
        every = [r.duration_s for r in hist]

        def mean(xs: list[float]) -> float:
            return sum(xs or every) / len(xs or every)

        return mean(after_fail), mean(after_pass)

    def pool_costs(self) -> tuple[float, float] | None:
        """:meth:`trial_costs` on a pool, where a crashed server restarts in
        the background: per server, from the end of a failed trial to the end
        of its next one (the restart, any wait, the trial), and a trial
        after a pass. None until some server has been seen after a failure."""
        by_server: dict[int, list[TrialRecord]] = {}
        for r in self.history():
            if r.server is not None and r.duration_s > 0:
                by_server.setdefault(r.server, []).append(r)
        failed = (Outcome.MATCH, Outcome.OTHER_FAILURE)
        after_fail: list[float] = []
        after_pass: list[float] = []
        for recs in by_server.values():
            recs.sort(key=lambda r: r.started_at)
            for a, b in itertools.pairwise(recs):
                if a.outcome in failed:
                    after_fail.append(b.started_at + b.duration_s - a.started_at - a.duration_s)
                else:
                    after_pass.append(b.duration_s)
        if not after_fail:
            return None
        every = after_fail + after_pass
        return sum(after_fail) / len(after_fail), sum(after_pass or every) / len(
            after_pass or every
        )

    def _decide(self, key: str, value: bool) -> bool:
        self.verdicts[key] = value
        self._append({"event": "verdict", "key": key, "value": value}, sync=False)
        return value

    def history(self) -> Sequence[TrialRecord]:
        return sorted((r for recs in self.records.values() for r in recs), key=lambda r: r.trial)
