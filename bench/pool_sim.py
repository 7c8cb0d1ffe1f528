"""A bisect on a pool of k servers, on a virtual clock: real-hardware economics.

``python -m bench pool_sim [-- --seeds N --servers 1,2,4,8 --modes det,flaky]``

A #50347-shaped case: 3,000 requests of 40 overlapping agent sessions whose
contexts grow turn by turn; the first request whose context passes a
threshold (~337K tokens, about request 2,400) crashes the server, every time
(``det``) or with p = 0.5 (``flaky``, the draws seeded per run). A trial
costs 0.5 virtual seconds per request it replays (a crashing one replays
what was sent by the crash: the trigger and two more); a crash costs that
server a 900 s restart in the background while the others go on. The same
bisect (same options) on 1, 2, 4 and 8 servers: virtual wall time, trials
and whether the result is exactly the trigger, against one server's, with
the targets of the pool's issue (4 servers <= 0.4x one server's wall time,
8 <= 0.25x; exact-result rate no lower; trials <= 2x). Where the wall time
goes is broken down per stage from each trial's stage, server and times.
One run per (k, mode) keeps its journal under ``bench/out/pool_sim/``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from replayer.bisect.oracle import Outcome
from replayer.bisect.pipeline import Bisect, BisectOptions, run_bisect
from replayer.bisect.runner import Observation, Trial
from replayer.replay.plan import select
from replayer.testing import VirtualClock
from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter

REQUESTS, SESSIONS = 3000, 40
TRIGGER_AT = 2400
"""The trigger is the context record-setter nearest this position."""
TRIGGER_TOKENS = 337_000
PER_REQUEST_S = 0.5
RESTART_S = 900.0
P_FLAKY = 0.5
LATE = 2
"""Requests sent after the trigger by the time the crash is seen."""
OPTS = BisectOptions(
    # shrink edits the request bodies, which here are stand-ins (the crash is
    # keyed on the trigger's id): it would only measure restarts
    stages=("calibrate", "cut", "prefix", "sessions", "turns", "timing"),
    calibrate_matches=5,
    calibrate_runs=12,
    confirm=10,
    bundle=False,
)
"""The flaky tests' options (tests/bisect/test_runner.py), the same for every k and mode."""
TARGETS = {4: 0.4, 8: 0.25}
"""wall(k) / wall(1) at most this (the pool's acceptance targets)."""
OUT = Path(__file__).resolve().parent / "out" / "pool_sim"


# -- the trace ----------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    trace: Trace
    trigger: str
    """The trigger's request id."""
    position: int
    """Its position in trace order (0-based)."""
    threshold: int


def write_case(path: Path, seed: int = 0) -> Case:
    """40 agent sessions of 3,000 requests in all, arriving as a Poisson
    process and overlapping; each turn's context is the last one's plus a
    log-normal tool output. Rescaled so that the context record-setter
    nearest request 2,400 (in trace order) has 337K tokens: the threshold."""
    rng = random.Random(seed)
    weights = [rng.lognormvariate(0.0, 0.6) for _ in range(SESSIONS)]
    turns = [max(5, round(REQUESTS * w / sum(weights))) for w in weights]
    turns[max(range(SESSIONS), key=turns.__getitem__)] += REQUESTS - sum(turns)
    rows: list[tuple[int, str, int, int]] = []  # start_us, session, turn, tokens
    arrive = 0.0
    for s in range(SESSIONS):
        arrive += rng.expovariate(1 / 90.0)  # a session every 1.5 min
        t, ctx = arrive, rng.randint(9_000, 14_000)  # system prompt + tools
        growth = rng.lognormvariate(7.2, 0.4)  # per-session median tool output
        for turn in range(turns[s]):
            rows.append((round(t * 1e6), f"s{s:02d}", turn, ctx))
            t += 8.0 + rng.expovariate(1 / 25.0)  # model time + think time
            ctx += round(growth * rng.lognormvariate(0.0, 1.0))
    rows.sort()
    record = -1
    setters: list[int] = []
    for i, (_, _, _, ctx) in enumerate(rows):
        if ctx > record:
            record = ctx
            setters.append(i)
    pos = min(setters, key=lambda i: abs(i - TRIGGER_AT))
    scale = TRIGGER_TOKENS / rows[pos][3]
    tokens = [round(ctx * scale) for _, _, _, ctx in rows]
    threshold = tokens[pos]
    assert max(tokens[:pos]) < threshold, "the trigger must be the first past the threshold"
    with TraceWriter(path, TraceMeta(source="bench pool_sim")) as w:
        for (start, sid, turn, _), ctx in zip(rows, tokens, strict=True):
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"{sid} turn {turn}"}],
                "max_tokens": 64,
            }
            rec = RequestRecord.from_body(
                body,
                request_id=f"{sid}-{turn}",
                session_id=sid,
                turn=turn,
                start_us=start,
                end_us=start + 5_000_000,
                input_tokens=ctx,
            )
            w.add(rec)
    trace = Trace.open(path)
    ids = trace.column("request_id")
    order = list(trace.order)
    sid, turn = rows[pos][1], rows[pos][2]
    assert ids[order[pos]] == f"{sid}-{turn}"
    return Case(trace, f"{sid}-{turn}", pos, threshold)


# -- the pool -----------------------------------------------------------------------


@dataclass
class Span:
    """One trial as the pool ran it (virtual seconds)."""

    number: int
    stage: str
    asked: float
    began: float = -1.0
    """When a server was ready for it (-1: cancelled before one was)."""
    ended: float = -1.0
    server: int = -1
    crashed: bool = False
    cancelled: bool = False
    size: int = 0


@dataclass
class PooledTrigger:
    """``width`` servers on a virtual clock, leased as
    :class:`replayer.session.pool.Pool` does (a ready server, else whichever
    is ready first; a crashed one restarts in the background), crashing iff
    ``trigger`` is replayed, with
    probability ``p``. A trial takes ``per_request`` seconds per request it
    replays: all of them, or those sent by the crash. ``spans`` logs each trial."""

    trigger: str
    width: int
    clock: VirtualClock
    p: float = 1.0
    seed: int = 0
    per_request: float = PER_REQUEST_S
    restart: float = RESTART_S
    spans: list[Span] = field(default_factory=list)
    peak: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._ready_at = [0.0] * self.width
        self._busy = [False] * self.width
        self._wake: list[asyncio.Event] = []
        self._ids: dict[int, list[str]] = {}

    async def _take(self) -> int:
        # replayer.session.pool.Pool: a ready server, else wait for any to be
        while True:
            now = self.clock.now()
            idle = [i for i in range(self.width) if not self._busy[i]]
            ready = [i for i in idle if self._ready_at[i] <= now]
            if ready:
                self._busy[ready[0]] = True
                return ready[0]
            woken = asyncio.Event()
            self._wake.append(woken)
            try:
                if idle:
                    await self.clock.sleep_until(min(self._ready_at[i] for i in idle), woken)
                else:
                    await woken.wait()
            finally:
                self._wake.remove(woken)

    def _give(self, server: int) -> None:
        self._busy[server] = False
        for woken in self._wake:
            woken.set()

    def _request_ids(self, trial: Trial) -> list[str]:
        ids = self._ids.get(id(trial.trace))
        if ids is None:
            ids = self._ids[id(trial.trace)] = list(trial.trace.column("request_id"))
        return ids

    async def run(self, trial: Trial) -> Observation:
        span = Span(trial.number, trial.stage, self.clock.now(), size=len(trial.rows))
        self.spans.append(span)
        try:
            server = await self._take()
        except BaseException:
            span.cancelled = True
            raise
        span.began, span.server = self.clock.now(), server
        self.peak = max(self.peak, sum(self._busy))
        try:
            ids = self._request_ids(trial)
            at = next((i for i, r in enumerate(trial.rows) if ids[r] == self.trigger), None)
            crash = at is not None and self.rng.random() < self.p
            sent = trial.rows[: at + 1 + LATE] if crash and at is not None else trial.rows
            try:
                await self.clock.sleep(self.per_request * len(sent))
            except BaseException:
                span.cancelled = True
                raise
            span.ended = self.clock.now()
            if not crash or at is None:
                return Observation(Outcome.PASS, server=server)
            span.crashed = True
            self._ready_at[server] = self.clock.now() + self.restart
            return Observation(
                Outcome.MATCH,
                failure_class="process_exit",
                signature="context-threshold",
                failed_request=self.trigger,
                suspects=(self.trigger,),
                sent=sent,
                in_flight=trial.rows[at : at + 1 + LATE],
                server=server,
            )
        finally:
            if span.cancelled:
                span.ended = self.clock.now()
            self._give(server)


# -- one bisect ---------------------------------------------------------------------


@dataclass
class Run:
    k: int
    mode: str
    seed: int
    wall_s: float
    cpu_s: float
    trials: int
    """The bisect's count (trial numbers issued and finished, cancelled ones included)."""
    finished: int
    cancelled: int
    exact: bool
    status: str
    requests: list[str]
    prefix: int | None
    peak: int
    spans: list[Span]


async def _bisect(case: Case, k: int, mode: str, seed: int, out: Path) -> Run:
    clock = VirtualClock()
    p = 1.0 if mode == "det" else P_FLAKY
    runner = PooledTrigger(case.trigger, k, clock, p=p, seed=seed)
    b = Bisect(case.trace, select(case.trace), runner, out, OPTS, say=lambda m: None, clock=clock)
    c0 = time.process_time()
    res = await run_bisect(b)
    cpu = time.process_time() - c0
    exact = (
        res.status == "complete"
        and res.requests == [case.trigger]
        and b.prefix_length == case.position + 1
    )
    return Run(
        k, mode, seed, clock.now(), cpu, res.trials,
        sum(not s.cancelled for s in runner.spans), sum(s.cancelled for s in runner.spans),
        exact, res.status, res.requests, b.prefix_length, runner.peak, runner.spans,
    )  # fmt: skip


def _journal_check(out: Path, run: Run) -> None:
    """The journal says what the runner's log does: each trial's stage and server."""
    seen = {}
    for line in (out / "journal.jsonl").read_bytes().splitlines():
        e = orjson.loads(line)
        if e.get("event") == "trial":
            r = e["record"]
            seen[r["trial"]] = (r["stage"], r["server"])
    mine = {s.number: (s.stage, s.server) for s in run.spans if not s.cancelled}
    assert seen == mine, "the journal and the pool's log disagree"


# -- figures ------------------------------------------------------------------------


STAGE_ORDER = ("calibrate", "cut", "prefix", "sessions", "turns", "timing", "confirm", "revisit")


def stage_rows(runs: Sequence[Run], k: int) -> dict[str, dict[str, float]]:
    """Per stage, means over runs: wall span (first trial asked to last
    ended), trials, cancelled, crashes, rounds (distinct instants the search
    asked for trials at: one per round of a race), thin rounds (fewer trials
    asked than the k servers), the seconds a trial waited for a server (a
    restart, mostly)."""
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        by: dict[str, list[Span]] = defaultdict(list)
        for s in run.spans:
            by[s.stage].append(s)
        for stage in STAGE_ORDER:
            spans = by.get(stage, [])
            a = acc[stage]
            if not spans:
                for key in ("wall", "trials", "cancelled", "crashes", "rounds", "thin", "wait"):
                    a[key].append(0.0)
                continue
            ran = [s for s in spans if s.began >= 0]
            a["wall"].append(max(s.ended for s in spans) - min(s.asked for s in spans))
            a["trials"].append(sum(not s.cancelled for s in spans))
            a["cancelled"].append(sum(s.cancelled for s in spans))
            a["crashes"].append(sum(s.crashed for s in spans))
            per_round: dict[float, int] = defaultdict(int)
            for s in spans:
                per_round[round(s.asked, 6)] += 1
            a["rounds"].append(len(per_round))
            a["thin"].append(sum(n < k for n in per_round.values()))
            a["wait"].append(sum(s.began - s.asked for s in ran) / max(1, len(ran)))
    return {
        stage: {key: statistics.fmean(v) for key, v in a.items()}
        for stage, a in acc.items()
        if any(a["trials"]) or any(a["cancelled"])
    }


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


def main(argv: list[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="bench pool_sim")
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--servers", default="1,2,4,8")
    ap.add_argument("--modes", default="det,flaky")
    ap.add_argument("--trace-seed", type=int, default=0)
    args = ap.parse_args(argv)
    widths = [int(x) for x in args.servers.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    assert set(modes) <= {"det", "flaky"}, modes
    OUT.mkdir(parents=True, exist_ok=True)
    runs: dict[tuple[int, str], list[Run]] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        case = write_case(Path(tmp) / "t.arrow", args.trace_seed)
        print(
            f"trace: {len(case.trace):,} requests, {SESSIONS} sessions; trigger "
            f"{case.trigger} at position {case.position + 1:,}, context "
            f"{case.threshold:,} tokens (the first past the threshold)\n"
        )
        for mode in modes:
            for k in widths:
                got = runs[(k, mode)] = []
                for seed in range(args.seeds):
                    out = Path(tmp) / f"b-{mode}-{k}-{seed}"
                    run = asyncio.run(_bisect(case, k, mode, seed, out))
                    _journal_check(out, run)
                    if seed == 0:
                        keep = OUT / f"journal-{mode}-k{k}.jsonl"
                        keep.write_bytes((out / "journal.jsonl").read_bytes())
                    got.append(run)
    real_s = time.perf_counter() - t0

    figures: dict[str, Any] = {"cases": {}, "targets": {}, "stages": {}}
    print("| servers | mode | wall mean (max) | wall / 1 server | trials mean | trials / 1 "
          "server | exact | CPU per bisect |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for mode in modes:
        base = runs.get((1, mode))
        for k in widths:
            rs = runs[(k, mode)]
            wall = statistics.fmean(r.wall_s for r in rs)
            trials = statistics.fmean(r.trials for r in rs)
            exact = sum(r.exact for r in rs) / len(rs)
            cpu = statistics.fmean(r.cpu_s for r in rs)
            w_ratio = t_ratio = None
            if base is not None:
                w_ratio = wall / statistics.fmean(r.wall_s for r in base)
                t_ratio = trials / statistics.fmean(r.trials for r in base)
            figures["cases"][f"{mode}-k{k}"] = {
                "wall_mean_s": wall,
                "wall_max_s": max(r.wall_s for r in rs),
                "trials_mean": trials,
                "finished_mean": statistics.fmean(r.finished for r in rs),
                "cancelled_mean": statistics.fmean(r.cancelled for r in rs),
                "exact_rate": exact,
                "wall_ratio": w_ratio,
                "trials_ratio": t_ratio,
                "cpu_mean_s": cpu,
                "peak": max(r.peak for r in rs),
                "not_exact": [
                    {"seed": r.seed, "requests": r.requests, "prefix": r.prefix, "status": r.status}
                    for r in rs
                    if not r.exact
                ],
            }
            fw = f"{w_ratio:.2f}x" if w_ratio is not None else "-"
            ft = f"{t_ratio:.2f}x" if t_ratio is not None else "-"
            print(
                f"| {k} | {mode} | {wall:,.0f} s = {_h(wall)} ({_h(max(r.wall_s for r in rs))}) "
                f"| {fw} | {trials:.1f} | {ft} | {exact:.0%} | {cpu:.2f} s |"
            )
            if base is not None and k in TARGETS:
                base_exact = sum(r.exact for r in base) / len(base)
                met = {
                    "wall": w_ratio is not None and w_ratio <= TARGETS[k],
                    "exact": exact >= base_exact,
                    "trials": t_ratio is not None and t_ratio <= 2.0,
                }
                figures["targets"][f"{mode}-k{k}"] = met
            figures["stages"][f"{mode}-k{k}"] = stage_rows(runs[(k, mode)], k)
    if figures["targets"]:
        print("\n| target | " + " | ".join(figures["targets"]) + " |")
        print("|---|" + "---|" * len(figures["targets"]))
        for what, label in (("wall", "wall(k)/wall(1) <= 0.4 (k=4), 0.25 (k=8)"),
                            ("exact", "exact rate >= serial's"),
                            ("trials", "trials(k)/trials(1) <= 2")):  # fmt: skip
            cells = ["met" if t[what] else "**missed**" for t in figures["targets"].values()]
            print(f"| {label} | " + " | ".join(cells) + " |")
    print("\nPer stage, means over the seeds: wall span h (rounds, of them thin: fewer trials "
          "than servers; trials, cancelled; crashes; mean wait for a server s)\n")  # fmt: skip
    stages = [s for s in STAGE_ORDER if any(s in v for v in figures["stages"].values())]
    print("| case | " + " | ".join(stages) + " |")
    print("|---|" + "---|" * len(stages))
    for name, per in figures["stages"].items():
        cells = []
        for s in stages:
            v = per.get(s)
            cells.append(
                "-" if v is None else
                f"{v['wall'] / 3600:.2f} ({v['rounds']:.1f}, {v['thin']:.1f}; {v['trials']:.1f}, "
                f"{v['cancelled']:.1f}; {v['crashes']:.1f}; {v['wait']:.0f})"
            )  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |")
    cpu_all = sum(r.cpu_s for rs in runs.values() for r in rs)
    n_all = sum(len(rs) for rs in runs.values())
    print(f"\n{n_all} bisects: CPU {cpu_all:.1f} s ({cpu_all / n_all:.2f} s each), "
          f"real {real_s:.1f} s")  # fmt: skip
    figures["trace"] = {"trigger": case.trigger, "position": case.position,
                        "threshold": case.threshold}  # fmt: skip
    figures["cpu_s"], figures["real_s"], figures["bisects"] = cpu_all, real_s, n_all
    figures["seeds"] = args.seeds
    return figures
