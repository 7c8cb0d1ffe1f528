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
6. **timing**: faster replay (x2, x4 ... of the speed, then ``asap``), kept
   only while the crash survives: every later run of the bundle is cheaper.

Then **confirm**: N runs of the result (k/N with a Wilson interval), and the
same on the control target if there is one. The best-so-far bundle is
rewritten after every improvement, so a stopped bisect leaves a usable one.
Every trial is journaled (``journal.jsonl``) before the search moves on;
``--resume`` replays the journal and continues without repeating a trial.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from replayer.bundle.export import write_bundle
from replayer.minimize.oracle import (
    Budget,
    BudgetExhausted,
    Candidate,
    Oracle,
    Outcome,
    TrialRecord,
)
from replayer.minimize.search import bisect_reduce, shortest_prefix
from replayer.minimize.stats import describe_rate, wilson, zero_upper
from replayer.minimize.trial import NotExercised, TrialEnv
from replayer.monitor.signature import Signature
from replayer.replay.policy import Timing
from replayer.replay.results import read_results
from replayer.replay.run import sha256_file
from replayer.trace.reader import Trace

log = logging.getLogger("replayer.minimize")

STAGES = ("calibrate", "cut", "prefix", "sessions", "turns", "timing")


class NotReproducible(Exception):
    """Calibration saw no crash of the full trace."""


@dataclass
class BisectOptions:
    stages: tuple[str, ...] = STAGES
    calibrate_matches: int = 5
    calibrate_runs: int = 10
    confirm: int = 10
    alpha: float = 0.05
    max_trials: int | None = None
    max_time: float | None = None
    speedups: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0)
    try_asap: bool = True


@dataclass
class Control:
    """The platform that runs clean (e.g. B300): the repro is replayed there too."""

    name: str
    env: TrialEnv


@dataclass
class BisectResult:
    status: str
    """``complete``, ``budget_exhausted`` or ``not_reproducible``."""
    best: Candidate
    bundle: Path | None
    trials: int
    reproduction: tuple[int, int] = (0, 0)
    control: tuple[int, int] | None = None
    signature: Signature | None = None
    stages_done: list[str] = field(default_factory=list)


class _Runner:
    """The oracle's runner: a candidate becomes a trial on the real target."""

    def __init__(self, bisect: Bisect) -> None:
        self.b = bisect

    async def run(self, cand: Candidate, trial: int, stage: str) -> TrialRecord:
        b = self.b
        rows = [b.rows[p] for p in cand.positions]
        policy = replace(b.env.policy, timing=Timing(cand.timing), speed=cand.speed)
        rel = f"trials/{trial:04d}"
        started = time.time()
        t0 = time.monotonic()
        res = await b.env.run(rows, b.out / rel, policy=policy)
        if res.unexercised and stage == "calibrate":
            raise NotExercised(res.unexercised)
        sig = res.signature
        rec = TrialRecord(
            trial=trial,
            key=cand.key(),
            size=len(rows),
            stage=stage,
            outcome=res.outcome,
            failure_class=res.failure_class,
            signature=sig.hash if sig else None,
            message=res.message,
            duration_s=round(time.monotonic() - t0, 3),
            started_at=started,
            run=rel,
            failed_request=(res.failure or {}).get("request_id"),
            suspects=list(sig.suspects) if sig else [],
        )
        if res.outcome is Outcome.MATCH and not b.env.chase.pinned:
            # the first crash of the full trace is the one this bisect chases
            b.env.chase.failure_class = res.failure_class
            b.env.chase.signature = sig.hash if sig else None
            b.signature = sig
        if res.outcome is Outcome.MATCH and sig is not None and b.signature is None:
            b.signature = sig
        return rec


class Bisect:
    """One minimization of one trace against one target (see the module doc).

    **Usage**::

        b = Bisect(trace, rows, env, out, BisectOptions(confirm=10))
        result = await b.run()
    """

    def __init__(
        self,
        trace: Trace,
        rows: Sequence[int],
        env: TrialEnv,
        out: Path,
        opts: BisectOptions | None = None,
        *,
        control: Control | None = None,
        facts: dict[str, Any] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.trace = trace
        self.rows = list(rows)
        self.env = env
        self.out = out
        self.opts = opts or BisectOptions()
        self.control = control
        self.facts = facts or {}
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.signature: Signature | None = None
        self.started = time.monotonic()
        self.oracle = Oracle(
            _Runner(self),
            out / "journal.jsonl",
            alpha=self.opts.alpha,
            # a crash seen on every calibration run is taken as deterministic
            deterministic_after=self.opts.calibrate_matches,
            budget=Budget(self.opts.max_trials, self.opts.max_time),
        )
        self.oracle.on_trial.append(self._progress)
        self.sessions = trace.column("session_id")
        self.ids = trace.column("request_id")
        base = replace(env.policy)
        self.timing, self.speed = base.timing.value, base.speed
        self.best = Candidate(tuple(range(len(self.rows))), self.timing, self.speed)
        self.prefix_length: int | None = None
        self.stages_done: list[str] = []
        self.trace_sha = ""
        self._restore_chase()

    # -- bookkeeping -------------------------------------------------------------

    def _restore_chase(self) -> None:
        """On resume, the chased failure is the first journaled match's."""
        if self.env.chase.pinned:
            return
        for rec in self.oracle.history():
            if rec.outcome is Outcome.MATCH:
                self.env.chase.failure_class = rec.failure_class
                self.env.chase.signature = rec.signature
                sig_path = self.out / (rec.run or "") / "signature.json"
                if rec.run and sig_path.exists():
                    self.signature = Signature.from_dict(orjson.loads(sig_path.read_bytes()))
                return

    def _progress(self, rec: TrialRecord, cand: Candidate) -> None:
        k, n = self.oracle.crash_rate()
        what = f"{rec.outcome.value}"
        if rec.failure_class:
            what += f" ({rec.failure_class}" + (f" {rec.signature}" if rec.signature else "") + ")"
        elapsed = time.monotonic() - self.started
        self.say(
            f"trial {rec.trial:>3} [{rec.stage}] {rec.size:,} requests -> {what} in "
            f"{rec.duration_s:.1f}s | best {len(self.best.positions):,} requests | crash rate "
            f"{k}/{n}, dismiss after {self.oracle.repeats()} quiet | "
            f"~{self._projection()} trials left | {elapsed:,.0f}s"
        )

    def _projection(self) -> int:
        """A rough count of trials left (binary searches over what remains)."""
        n = len(self.best.positions)
        per_probe = 1 + (self.oracle.repeats() - 1) / 2
        stages_left = [s for s in STAGES if s in self.opts.stages and s not in self.stages_done]
        probes = 0.0
        for s in stages_left:
            if s in ("prefix", "sessions", "turns"):
                probes += math.ceil(math.log2(max(n, 2)))
            elif s == "timing":
                probes += len(self.opts.speedups) + max(2, self.opts.calibrate_matches)
        return (
            round(probes * per_probe)
            + self.opts.confirm * (self.control is not None)
            + (self.opts.confirm if self.opts.confirm else 0)
        )

    def candidate(self, positions: Sequence[int]) -> Candidate:
        return Candidate(tuple(sorted(positions)), self.best.timing, self.best.speed)

    async def test(self, positions: Sequence[int], stage: str) -> bool:
        return await self.oracle.test(self.candidate(positions), stage=stage)

    def _improve(self, cand: Candidate, stage: str) -> None:
        if cand != self.best:
            self.best = cand
            self.say(
                f"== {stage}: best repro now {len(cand.positions):,} requests "
                f"({cand.timing}, speed {cand.speed:g})"
            )
            self._write_bundle("in_progress")

    # -- stages ------------------------------------------------------------------

    async def calibrate(self) -> None:
        full = self.best
        o = self.opts
        for _ in range(o.calibrate_runs + o.calibrate_matches):
            c = self.oracle.counts(full)
            runs = (
                c[Outcome.MATCH] + c[Outcome.PASS] + c[Outcome.OTHER_FAILURE] + c[Outcome.INVALID]
            )
            if c[Outcome.MATCH] >= o.calibrate_matches or runs >= o.calibrate_runs:
                break
            if c[Outcome.INFRA] > 3:
                raise NotReproducible("the target failed to launch repeatedly (see trials/)")
            await self.oracle.run_once(full, "calibrate")
        c = self.oracle.counts(full)
        if not c[Outcome.MATCH]:
            runs = sum(c.values()) - c[Outcome.INFRA]
            others = (
                f"; {len(self.oracle.bugs)} other failure(s) recorded" if self.oracle.bugs else ""
            )
            raise NotReproducible(
                f"the full trace did not crash in {runs} run(s) (95% upper bound on the crash "
                f"rate {zero_upper(runs):.0%}){others}"
            )
        k, n = self.oracle.crash_rate()
        self.say(
            f"== calibrate: {describe_rate(k, n)}; chasing {self.env.chase.failure_class}"
            + (f" {self.env.chase.signature}" if self.env.chase.signature else "")
        )

    def _first_match(self) -> TrialRecord | None:
        for rec in self.oracle.history():
            if rec.outcome is Outcome.MATCH and rec.key == self.best.key():
                return rec
        return next((r for r in self.oracle.history() if r.outcome is Outcome.MATCH), None)

    def _failure_point(self) -> tuple[int | None, list[int]]:
        """(1 + last position dispatched at or before the failure, positions in
        flight then), from the first matching run of the current best."""
        rec = self._first_match()
        if rec is None or rec.run is None:
            return None, []
        run = self.out / rec.run
        summary = orjson.loads((run / "summary.json").read_bytes())
        f = summary["targets"][self.env.name]["failure"]
        at_us = round(f["at_s"] * 1e6)
        pos_of = {self.rows[p]: p for p in self.best.positions}
        upto = None
        inflight = []
        for r in read_results(run / "results.arrow"):
            p = pos_of.get(r["row"])
            if p is None or r["dispatched_us"] is None:
                continue
            if r["dispatched_us"] <= at_us:
                upto = p if upto is None else max(upto, p)
                if (
                    r["done_us"] is None
                    or r["done_us"] >= at_us
                    or r["request_id"] == f["request_id"]
                ):
                    inflight.append(p)
        return (None if upto is None else upto + 1), inflight

    async def cut(self) -> None:
        end, _ = self._failure_point()
        positions = self.best.positions
        if end is None or end >= len(positions):
            return
        cand = self.candidate(positions[:end])
        if await self.oracle.test(cand, stage="cut"):
            self._improve(cand, "cut")

    async def prefix(self) -> None:
        items = list(self.best.positions)

        async def probe(prefix: tuple[int, ...]) -> bool:
            return await self.test(prefix, "prefix")

        if self.oracle.repeats(upto=self.oracle.mark("prefix")) > 1:
            # flaky: one run per probe, weighed by a posterior, beats r runs per probe
            h = await self.oracle.flaky_prefix(
                len(items), lambda j: self.candidate(items[:j]), stage="prefix"
            )
        else:
            h = await shortest_prefix(items, (), probe)
        self.prefix_length = h
        self._improve(self.candidate(items[:h]), "prefix")

    def _session_order(self, positions: Sequence[int], pinned: str) -> list[str]:
        """Other sessions, likely culprits first: named in the crash dump, in
        flight at the crash, then by how recently they sent a request."""
        sess = [self.sessions[self.rows[p]] for p in positions]
        last_seen: dict[str, int] = {}
        for p, s in zip(positions, sess, strict=True):
            last_seen[s] = p
        rank: dict[str, tuple[int, int]] = {
            s: (2, -last) for s, last in last_seen.items() if s != pinned
        }
        _, inflight = self._failure_point()
        for p in inflight:
            s = self.sessions[self.rows[p]]
            if s in rank:
                rank[s] = (1, rank[s][1])
        sig = self.signature
        if sig is not None:
            ids = {self.ids[self.rows[p]]: p for p in positions}
            for rid in sig.suspects:
                if rid in ids:
                    s = self.sessions[self.rows[ids[rid]]]
                    if s in rank:
                        rank[s] = (0, rank[s][1])
        return sorted(rank, key=rank.__getitem__)

    async def sessions_stage(self) -> None:
        positions = list(self.best.positions)
        last = positions[-1]
        pinned = self.sessions[self.rows[last]]
        order = self._session_order(positions, pinned)
        by_session: dict[str, list[int]] = {}
        for p in positions:
            by_session.setdefault(self.sessions[self.rows[p]], []).append(p)

        async def probe(group: tuple[str, ...]) -> bool:
            return await self.test([p for s in group for p in by_session[s]], "sessions")

        kept = await bisect_reduce(order, (pinned,), probe)
        keep = {pinned, *kept}
        self._improve(
            self.candidate([p for p in positions if self.sessions[self.rows[p]] in keep]),
            "sessions",
        )

    async def turns(self) -> None:
        positions = list(self.best.positions)
        last = positions[-1]
        items = sorted(positions[:-1], reverse=True)  # newest first

        async def probe(group: tuple[int, ...]) -> bool:
            return await self.test(group, "turns")

        kept = await bisect_reduce(items, (last,), probe)
        self._improve(self.candidate([last, *kept]), "turns")

    async def timing_stage(self) -> None:
        base = self.best
        if base.timing == Timing.ASAP.value:
            return  # nothing left to compress
        for factor in self.opts.speedups:
            cand = Candidate(base.positions, base.timing, base.speed * factor)
            if not await self.oracle.test(cand, stage="timing"):
                break
            self._improve(cand, "timing")
        if self.opts.try_asap and self.best.timing != Timing.ASAP.value:
            cand = Candidate(self.best.positions, Timing.ASAP.value, self.best.speed)
            if await self.oracle.test(cand, stage="timing"):
                self._improve(cand, "timing")
        if self.best != base and not await self._reproduces(self.best, "timing"):
            # a faster replay changes the races a crash may need: one crash
            # does not trade away the timing that reproduced reliably
            self.say(
                f"== timing: {self.best.timing} at {self.best.speed:g}x did not crash on every "
                f"run; keeping {base.timing} at {base.speed:g}x"
            )
            self.best = base
            self._write_bundle("in_progress")

    async def _reproduces(self, cand: Candidate, stage: str) -> bool:
        """``cand`` crashed on each of ``calibrate_matches`` (at least 2) runs of
        ``stage``; journaled runs count first, so a resumed bisect repeats none."""
        need = max(2, self.opts.calibrate_matches)
        for _ in range(2 * need):  # bounded: infrastructure failures do not count
            recs = self._stage_runs(cand, stage)
            if any(r.outcome is not Outcome.MATCH for r in recs):
                return False
            if len(recs) >= need:
                return True
            await self.oracle.run_once(cand, stage)
        return False

    async def confirm(self) -> None:
        n = self.opts.confirm
        for _ in range(max(0, n - self._confirm_counts()[1])):
            await self.oracle.run_once(self.best, "confirm")
        if self.control is not None:
            await self._control_runs(n)

    def _stage_runs(self, cand: Candidate, stage: str) -> list[TrialRecord]:
        """``cand``'s journaled runs in ``stage`` that reached a verdict (not INFRA)."""
        return [
            r
            for r in self.oracle.records.get(cand.key(), [])
            if r.stage == stage and r.outcome is not Outcome.INFRA
        ]

    def _confirm_counts(self) -> tuple[int, int]:
        ok = self._stage_runs(self.best, "confirm")
        return sum(r.outcome is Outcome.MATCH for r in ok), len(ok)

    async def _control_runs(self, n: int) -> None:
        assert self.control is not None
        done_path = self.out / "control.jsonl"
        done = []
        if done_path.exists():
            done = [orjson.loads(x) for x in done_path.read_bytes().splitlines() if x.strip()]
        env = self.control.env
        env.chase = replace(self.env.chase)
        policy = replace(env.policy, timing=Timing(self.best.timing), speed=self.best.speed)
        rows = [self.rows[p] for p in self.best.positions]
        for i in range(len(done), n):
            res = await env.run(rows, self.out / f"control/{i + 1:03d}", policy=policy)
            entry = {"run": i + 1, "outcome": res.outcome.value, "failure_class": res.failure_class}
            with done_path.open("ab") as f:
                f.write(orjson.dumps(entry) + b"\n")
            done.append(entry)
            self.say(f"control {self.control.name} {i + 1}/{n}: {res.outcome.value}")

    def control_counts(self) -> tuple[int, int] | None:
        path = self.out / "control.jsonl"
        if self.control is None or not path.exists():
            return None
        rows = [orjson.loads(x) for x in path.read_bytes().splitlines() if x.strip()]
        ok = [r for r in rows if r["outcome"] != "INFRA"]
        return sum(r["outcome"] in ("MATCH", "OTHER_FAILURE") for r in ok), len(ok)

    # -- the bundle --------------------------------------------------------------

    def _write_bundle(self, status: str) -> Path:
        rows = [self.rows[p] for p in self.best.positions]
        k, n = self._confirm_counts()
        manifest: dict[str, Any] = {
            "status": status,
            "prefix_length": self.prefix_length,
            "signature": self._signature_dict(),
            "reproduction": _rate(k, n),
            "control": None,
            "trials": self.oracle.trials,
            "bugs": [r.to_json() for r in self.oracle.bugs.values()],
            "policy": {
                **self.env.policy.to_dict(),
                "timing": self.best.timing,
                "speed": self.best.speed,
            },
            "target": self.facts,
            "stages": self.stages_done,
        }
        cc = self.control_counts()
        if cc is not None and self.control is not None:
            manifest["control"] = {
                "name": self.control.name,
                **_rate(*cc),
                "p_value": fisher_one_sided(k, n, cc[0], cc[1]),
            }
        log_text = metrics = None
        rec = next(
            (r for r in reversed(self.oracle.history()) if r.outcome is Outcome.MATCH and r.run),
            None,
        )
        if rec is not None:
            run = self.out / (rec.run or "")
            if (run / "server.log").exists():
                log_text = (run / "server.log").read_text(errors="replace")
            snaps = sorted(run.glob("metrics-before-failure-*.txt"))
            if snaps:
                metrics = snaps[0].read_text()
        if not self.trace_sha:
            self.trace_sha = sha256_file(self.trace.path)
        return write_bundle(
            self.out / "bundle",
            trace=self.trace,
            trace_sha256=self.trace_sha,
            rows=rows,
            manifest=manifest,
            server_log=log_text,
            metrics_snapshot=metrics,
            trials=[r.to_json() for r in self.oracle.history()],
        )

    def _signature_dict(self) -> dict[str, Any] | None:
        c = self.env.chase
        if self.signature is not None:
            d = self.signature.to_dict()
            return {
                "hash": self.signature.hash,
                "class": self.signature.failure_class,
                "text": self.signature.text,
                "suspects": d.get("suspects", []),
            }
        if c.failure_class or c.regex:
            return {
                "hash": c.signature,
                "class": c.failure_class,
                "text": f"regex {c.regex.pattern}" if c.regex else None,
                "suspects": [],
            }
        return None

    # -- the whole run ------------------------------------------------------------

    async def run(self) -> BisectResult:
        stages = {
            "calibrate": self.calibrate,
            "cut": self.cut,
            "prefix": self.prefix,
            "sessions": self.sessions_stage,
            "turns": self.turns,
            "timing": self.timing_stage,
        }
        status = "complete"
        try:
            for name in STAGES:
                if name not in self.opts.stages:
                    continue
                if name != "calibrate" and not self.oracle.matched:
                    # without calibration, the full selection is taken as crashing
                    await self.calibrate()
                await stages[name]()
                self.stages_done.append(name)
            if self.opts.confirm:
                await self.confirm()
                self.stages_done.append("confirm")
        except NotReproducible as exc:
            self.say(f"== not reproducible: {exc}")
            return BisectResult("not_reproducible", self.best, None, self.oracle.trials)
        except NotExercised as exc:
            self.say(f"== NOT EXERCISED, refusing to bisect: {exc}")
            return BisectResult("not_exercised", self.best, None, self.oracle.trials)
        except BudgetExhausted as exc:
            status = "budget_exhausted"
            self.say(f"== stopped: {exc}; the best repro so far stands")
        bundle = self._write_bundle(status)
        k, n = self._confirm_counts()
        return BisectResult(
            status,
            self.best,
            bundle,
            self.oracle.trials,
            (k, n),
            self.control_counts(),
            self.signature,
            self.stages_done,
        )


def _rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n) if n else (0.0, 1.0)
    if n and k == 0:
        hi = zero_upper(n)
    return {
        "crashes": k,
        "runs": n,
        "low": round(lo, 4),
        "high": round(hi, 4),
        "text": describe_rate(k, n),
    }


def fisher_one_sided(k1: int, n1: int, k2: int, n2: int) -> float | None:
    """P(target shows >= k1 crashes if both platforms crashed at one rate):
    Fisher's exact test, one-sided, on the 2x2 table of crashes and runs."""
    if not n1 or not n2:
        return None
    total, crashes = n1 + n2, k1 + k2
    denom = math.comb(total, crashes)
    p = (
        sum(math.comb(n1, i) * math.comb(n2, crashes - i) for i in range(k1, min(n1, crashes) + 1))
        / denom
    )
    return round(p, 6)


async def run_bisect(b: Bisect) -> BisectResult:
    """Run ``b`` and always stop the targets it started."""
    try:
        return await b.run()
    finally:
        await asyncio.gather(
            b.env.target.stop(),
            *([b.control.env.target.stop()] if b.control is not None else []),
            return_exceptions=True,
        )
