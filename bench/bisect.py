"""Bisect trial counts and accuracy (issue 6), against real emulator
subprocesses with planted faults whose ground truth the emulator defines.

1. **Deterministic, 1,000 requests in 100 sessions**: a prefix-cache crash
   (the engine dies when a long request gets a large cache hit: the trigger
   and the previous turn of its session). Trials per stage and in total
   (targets: prefix <= ceil(log2 n) + 2, the whole pipeline without
   confirmation runs <= 45), and whether the result is exactly those two
   requests.
2. **Flaky, p = 0.5**: the engine dies on the 40th request with probability
   0.5 per run (a fresh seed every launch). Over 20 seeded bisects of the
   prefix stage, how often the exact minimal prefix (40) is found, and the
   trials it took.
3. The same flaky model with the fake runner (no server), 200 seeds, to show
   the statistics alone.
4. **Racing** (``--cases racing``): a deterministic threshold crash that six
   requests meet, in sessions racing at asap, so the request that gets there
   first moves from run to run; trials of the whole pipeline over 10 bisects.

Run: ``python -m bench bisect`` (``-- --quick``: 5 flaky runs instead of 20).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shlex
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL = "moonshotai/Kimi-K3"
LAUNCHER = Path(__file__).with_name("bisect_launcher.py")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _bisect(trace_path: Path, out: Path, launch: str, opts: Any, timing: str) -> Any:
    from replayer.bisect.pipeline import Bisect, run_bisect
    from replayer.options import ReplayPolicy, Server, Timing, WatchConfig
    from replayer.session import Session

    watch = WatchConfig(
        health_interval=0.1, scrape_interval=5.0, stall_timeout=10.0, settle=3.0, grace=0.5
    )
    env = Session.open(
        trace_path,
        policy=ReplayPolicy(timing=Timing(timing)),
        watch=watch,
        server=Server(launch=launch),
        logs=out,
    )
    trace, rows = env.trace, env.rows
    b = Bisect(trace, rows, env, out, opts, say=lambda m: None)
    t0 = time.monotonic()
    res = await run_bisect(b)
    return b, res, time.monotonic() - t0, trace


def deterministic(tmp: Path) -> dict[str, Any]:
    from replayer.bisect.pipeline import BisectOptions
    from replayer.trace.synth import SynthOptions, write_trace

    trace_path = tmp / "det.arrow"
    write_trace(
        trace_path,
        SynthOptions(
            sessions=100,
            turns=10,
            context=30_000,
            max_tokens=4,
            rate=2.0,
            think=1.0,
            model=MODEL,
            seed=21,
        ),
    )
    fault = "exit after=0.1 when cached_tokens>=20000 and prompt_tokens>=25000"
    launch = shlex.join(
        [
            sys.executable,
            "-m",
            "replayer.emulator",
            "--port",
            str(_port()),
            "--speed",
            "instant",
            "--fault",
            fault,
        ]
    )
    opts = BisectOptions(confirm=0)
    b, res, secs, trace = asyncio.run(_bisect(trace_path, tmp / "det", launch, opts, "asap"))
    hist = b.oracle.history()
    per_stage: dict[str, int] = {}
    for r in hist:
        per_stage[r.stage] = per_stage.get(r.stage, 0) + 1
    ids = [trace.column("request_id")[trace.order[p]] for p in res.best.positions]
    # ground truth from the emulator's rule: the first long request with a big
    # cache hit, i.e. a turn whose previous turn (same session) was long enough
    truth = None
    order = trace.order
    sess, tok = trace.column("session_id"), trace.column("input_tokens")
    prev: dict[str, int] = {}
    for p, r in enumerate(order):
        s = sess[r]
        if tok[r] >= 25_000 and s in prev and tok[order[prev[s]]] >= 20_000:
            truth = [trace.column("request_id")[order[prev[s]]], trace.column("request_id")[r]]
            break
        prev[s] = p
    n_cut = next((r.size for r in hist if r.stage == "cut"), len(order))
    return {
        "requests": len(order),
        "sessions": 100,
        "result": ids,
        "expected": truth,
        "exact": ids == truth,
        "prefix_length": b.prefix_length,
        "trials_total": len(hist),
        "trials_by_stage": per_stage,
        "prefix_bound": math.ceil(math.log2(n_cut)) + 2,
        "cut_size": n_cut,
        "seconds": round(secs, 1),
    }


ONE_TRIGGER = "exit after=0.1 when request=40 p=0.5"
FIVE_TRIGGERS = "exit after=0.1 when request>=40 and request<=44 p=0.5"
"""Each of requests 40-44 kills the engine with p = 0.5, independently: the
full trace crashes 97% of runs, the minimal prefix (40) 50%."""


CHANCES = "exit after=0.1 when request>=35 p=0.3"
"""One flaky trigger at the 35th request, each later request another chance
(the issue's independent fault server): the full trace crashes on nearly
every run, a prefix of 35 on 30 % of them."""


def flaky(tmp: Path, runs: int, fault: str = ONE_TRIGGER, exact_at: int = 40) -> dict[str, Any]:
    from replayer.bisect.pipeline import BisectOptions
    from replayer.trace.synth import SynthOptions, write_trace

    trace_path = tmp / "flaky.arrow"
    write_trace(
        trace_path,
        SynthOptions(
            sessions=6,
            turns=10,
            context=8_000,
            max_tokens=4,
            rate=20.0,
            think=0.0,
            model=MODEL,
            seed=22,
        ),
    )
    exact = 0
    trials = []
    found = []
    for seed in range(runs):
        counter = tmp / f"launches-{seed}"
        launch = shlex.join(
            [
                sys.executable,
                str(LAUNCHER),
                str(counter),
                str(seed * 1000),
                "--port",
                str(_port()),
                "--speed",
                "instant",
                "--fault",
                fault,
            ]
        )
        opts = BisectOptions(
            stages=("calibrate", "cut", "prefix"), calibrate_matches=5, calibrate_runs=12, confirm=0
        )
        out = tmp / f"flaky-{abs(hash(fault)) % 1000}-{seed}"
        b, res, _, _ = asyncio.run(_bisect(trace_path, out, launch, opts, "asap"))
        found.append(b.prefix_length)
        exact += b.prefix_length == exact_at
        trials.append(len(b.oracle.history()))
        print(
            f"  flaky run {seed + 1}/{runs}: prefix {b.prefix_length} in {trials[-1]} trials",
            file=sys.stderr,
            flush=True,
        )
    return {
        "runs": runs,
        "exact": exact,
        "prefixes": found,
        "trials_mean": round(statistics.mean(trials), 1),
        "trials_max": max(trials),
    }


RACING = "exit after=0.2 when cached_tokens>=5000 and prompt_tokens>=7000"
"""A threshold crash: any turn over 7,000 prompt tokens with a 5,000-token
cache hit kills the engine: six such turns, in four of six sessions racing at asap,
so which one gets there first moves from run to run."""


def racing(tmp: Path, runs: int) -> dict[str, Any]:
    """A deterministic crash met at a different request on different runs:
    the whole pipeline (calibrate, cut, prefix, sessions, turns), how many
    trials, which result."""
    from replayer.bisect.pipeline import BisectOptions
    from replayer.trace.synth import SynthOptions, write_trace

    trace_path = tmp / "racing.arrow"
    write_trace(
        trace_path,
        SynthOptions(
            sessions=6, turns=5, context=8_000, rate=50.0, think=0.0, max_tokens=4,
            model=MODEL, seed=3,
        ),
    )  # fmt: skip
    trials, sizes, named = [], [], []
    for k in range(runs):
        launch = shlex.join(
            [sys.executable, "-m", "replayer.emulator", "--port", str(_port()), "--speed",
             "instant", "--fault", RACING]
        )  # fmt: skip
        opts = BisectOptions(
            stages=("calibrate", "cut", "prefix", "sessions", "turns"),
            calibrate_matches=2, calibrate_runs=4, confirm=1,
        )  # fmt: skip
        b, res, _, _ = asyncio.run(_bisect(trace_path, tmp / f"racing-{k}", launch, opts, "asap"))
        hist = b.oracle.history()
        trials.append(len(hist))
        sizes.append(len(res.best.positions))
        named.append(len({r.failed_request for r in hist if r.failed_request}))
        print(
            f"  racing run {k + 1}/{runs}: {sizes[-1]} requests in {trials[-1]} trials",
            file=sys.stderr,
            flush=True,
        )
    return {
        "runs": runs,
        "sizes": sizes,
        "trials": trials,
        "trials_mean": round(statistics.mean(trials), 1),
        "trials_max": max(trials),
        "failing_requests_named": named,
    }


async def _calibrated(o: Any, runner: Any, full: Any) -> bool:
    """The pipeline's calibration (5 matches or 12 runs of the full trace);
    the runner's call count then starts at the search."""
    from replayer.bisect.oracle import Outcome

    for _ in range(12):
        if o.counts(full)[Outcome.MATCH] >= 5:
            break
        await o.run_once(full, "calibrate")
    runner.calls.clear()
    return bool(o.matched)


def simulated(seeds: int, n: int = 1000) -> dict[str, Any]:
    """Bayesian bisection against binary search with the repeat rule, on the
    fake runner (one culprit, crash probability p), same seeds for both."""
    import random

    from replayer.bisect.oracle import Candidate, Oracle
    from replayer.bisect.search import shortest_prefix
    from replayer.testing.fakes import FakeRunner

    def prefixes(j: int) -> Candidate:
        return Candidate(tuple(range(j)))

    async def one(d: Path, seed: int, p: float, bayes: bool) -> tuple[bool, int] | None:
        culprit = random.Random(seed).randrange(n)
        runner = FakeRunner(frozenset({culprit}), p=p, seed=seed)
        o = Oracle(runner, d / f"{bayes}-{p}-{seed}.jsonl")
        if not await _calibrated(o, runner, prefixes(n)):
            return None
        if bayes:
            h = await o.flaky_prefix(n, prefixes)
        else:

            async def probe(prefix: tuple[int, ...]) -> bool:
                return await o.test(Candidate(prefix))

            h = await shortest_prefix(list(range(n)), (), probe)
        return h == culprit + 1, len(runner.calls)

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        for p in (0.3, 0.5, 0.8):
            for bayes in (False, True):
                got = [r for s in range(seeds) if (r := asyncio.run(one(Path(d), s, p, bayes)))]
                out[f"{'bayes' if bayes else 'repeats'} p={p}"] = {
                    "searches": len(got),
                    "exact": sum(e for e, _ in got),
                    "trials_mean": round(statistics.mean(t for _, t in got), 1),
                    "trials_max": max(t for _, t in got),
                }
    return out


def simulated_triggers(seeds: int) -> dict[str, Any]:
    """Per-trigger flaky crashes (k triggers, each firing with p), on the fake
    runner: the prefix stage as the pipeline runs it, against the repeat-rule
    binary search it ran before issue 16 whenever calibration looked steady
    (five triggers at p = 0.5 crash 97% of runs), same seeds for both. A
    crash's failure point is two requests past the trigger that fired."""
    import random

    from replayer.bisect.oracle import Candidate, Oracle, Outcome
    from replayer.bisect.search import shortest_prefix
    from replayer.testing.fakes import FakeRunner

    def prefixes(j: int) -> Candidate:
        return Candidate(tuple(range(j)))

    async def one(
        d: Path, seed: int, n: int, k: int, p: float, now: bool, restart: float = 0.0
    ) -> Any:
        rng = random.Random(seed)
        trig = sorted(rng.sample(range(n // 4, n), k))
        runner = FakeRunner(
            frozenset(), p=p, seed=seed, triggers=frozenset(trig), lag=2, restart=restart
        )
        o = Oracle(runner, d / f"{now}-{n}-{k}-{p}-{seed}-{restart}.jsonl")
        if not await _calibrated(o, runner, prefixes(n)):
            return None
        steady = o.repeats(upto=o.mark("prefix")) == 1
        if now:
            h = await o.flaky_prefix(
                n, prefixes, binary_first=steady, length_of=lambda reached: reached
            )
        elif steady:

            async def probe(prefix: tuple[int, ...]) -> bool:
                return await o.test(Candidate(prefix))

            h = await shortest_prefix(list(range(n)), (), probe)
        else:
            h = await o.flaky_prefix(n, prefixes)
        restarts = sum(r.outcome is Outcome.MATCH for r in o.history()[-len(runner.calls) :])
        return h == trig[0] + 1, len(runner.calls), restarts

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        for n, k, p in (
            (1000, 1, 1.0),
            (1000, 1, 0.5),
            (60, 5, 0.5),
            (1000, 5, 0.5),
            (200, 8, 0.3),
        ):
            # restart 12: a trial after a crash costs 12 quiet ones (vLLM on CPU:
            # ~55 s against ~4.5 s after a pass), for the tie-break among probes
            for label, now, restart in (
                ("before", False, 0),
                ("now", True, 0),
                ("now, restart x12", True, 12),
            ):
                got = [
                    r
                    for s in range(seeds)
                    if (r := asyncio.run(one(Path(d), s, n, k, p, now, restart)))
                ]
                out[f"n={n} k={k} p={p} {label}"] = {
                    "searches": len(got),
                    "exact": sum(e for e, _, _ in got),
                    "trials_mean": round(statistics.mean(t for _, t, _ in got), 1),
                    "trials_max": max(t for _, t, _ in got),
                    "restarts_mean": round(statistics.mean(c for _, _, c in got), 2),
                }
    return out


def simulated_chances(seeds: int) -> dict[str, Any]:
    """One flaky trigger at a seeded position, each later request another
    chance at the same p (the failure seen ``lag`` requests late), on the
    fake runner: the prefix stage as the pipeline runs it."""
    import random

    from replayer.bisect.oracle import Candidate, Oracle
    from replayer.testing.fakes import FakeRunner

    async def one(d: Path, seed: int, n: int, p: float, lag: int) -> Any:
        rng = random.Random(seed)
        trig = rng.randrange(n // 4, n - 5)
        runner = FakeRunner(
            frozenset(), p=p, seed=seed, triggers=frozenset(range(trig, n)), lag=lag
        )
        o = Oracle(runner, d / f"{seed}-{n}-{p}-{lag}.jsonl")
        if not await _calibrated(o, runner, Candidate(tuple(range(n)))):
            return None
        steady = o.repeats(upto=o.mark("prefix")) == 1
        h = await o.flaky_prefix(
            n,
            lambda j: Candidate(tuple(range(j))),
            binary_first=steady,
            length_of=lambda reached: reached,
        )
        return h == trig + 1, len(runner.calls)

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        for n, p, lag in ((60, 0.3, 0), (60, 0.3, 2), (200, 0.3, 2), (60, 0.1, 2), (60, 1.0, 0)):
            got = [g for s in range(seeds) if (g := asyncio.run(one(Path(d), s, n, p, lag)))]
            trials = [t for _, t in got]
            out[f"n = {n}, p = {p}, seen {lag} late"] = {
                "searches": len(got),
                "exact": sum(e for e, _ in got),
                "trials_mean": round(statistics.mean(trials), 1),
                "trials_max": max(trials),
            }
    return out


def simulated_shrink(seeds: int) -> dict[str, Any]:
    """The shrink stage in-process (issue 16): a token-id prompt of 111
    16-token blocks crashes when it keeps >= N tokens *and* shares >= C with
    the request before it (80 blocks, 50 shared), N and C drawn per seed, with
    probability p per run. Exact means the bundle holds ceil(N/16) and
    ceil(C/16) blocks: the thresholds to one block. The limit beside it is
    what two plain binary searches and max_tokens cost a steady crash."""
    import random

    from replayer.bisect.oracle import Outcome
    from replayer.bisect.pipeline import Bisect, BisectOptions, run_bisect
    from replayer.bisect.runner import FunctionRunner, Observation, Trial
    from replayer.replay.plan import select
    from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter
    from replayer.trace.schema import Kind

    bs = 16

    def trace(d: Path) -> Trace:
        p = d / "pair.arrow"
        with TraceWriter(p, TraceMeta(source="bench")) as w:
            for i, (rid, blocks) in enumerate(
                (("a", list(range(1, 81))), ("b", [*range(1, 51), *range(200, 261)]))
            ):
                w.add(
                    RequestRecord(
                        request_id=rid, session_id=rid, turn=0, start_us=i * 10_000,
                        kind=Kind.BLOCKS, params={"model": "m", "max_tokens": 8},
                        content=blocks, block_size=bs, input_tokens=len(blocks) * bs,
                    )
                )  # fmt: skip
        return Trace.open(p)

    def common(x: list[int], y: list[int]) -> int:
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        return n

    async def one(d: Path, t: Trace, seed: int, p: float) -> tuple[bool, int, int, int] | None:
        rng = random.Random(seed)
        need, hit = rng.randrange(900, 1700), rng.randrange(100, 790)
        draws = random.Random(seed + 1)

        def oracle(trial: Trial) -> Observation:
            a, b = (x["prompt"] for x in trial.bodies())
            if len(b) >= need and common(a, b) >= hit and draws.random() < p:
                return Observation(Outcome.MATCH, signature="planted")
            return Observation(Outcome.PASS)

        out = d / f"{p}-{seed}"
        opts = BisectOptions(stages=("calibrate", "shrink"), confirm=0, bundle=False)
        b = Bisect(t, select(t), FunctionRunner(oracle), out, opts, say=lambda m: None)
        res = await run_bisect(b)
        if res.status != "complete" or b.shrunk is None:
            return None
        ctx = b.shrunk.get("context", {}).get("crashes_at", {}).get("units")
        src = [x for x in b.shrunk.get("providers", ()) if x["request"] == "a"]
        got = (ctx, src[0]["crashes_at"]["units"] if src else None)
        # the search's runs and the rate guard's (a cut may not make it rarer)
        shrink = sum(r.stage in ("shrink", "shrink-rate") for r in b.oracle.history())
        guard = sum(r.stage == "shrink-rate" for r in b.oracle.history())
        exact = got == (math.ceil(need / bs), math.ceil(hit / bs))
        return exact, shrink, res.trials, guard

    out: dict[str, Any] = {}
    limit = 1 + (math.ceil(math.log2(111)) + 1) + (math.ceil(math.log2(80)) + 1)
    with tempfile.TemporaryDirectory() as d:
        t = trace(Path(d))
        for p in (1.0, 0.5):
            got = [r for s in range(seeds) if (r := asyncio.run(one(Path(d), t, s, p)))]
            out[f"p={p}"] = {
                "searches": len(got),
                "exact": sum(e for e, _, _, _ in got),
                "shrink_trials_mean": round(statistics.mean(x for _, x, _, _ in got), 1),
                "shrink_trials_max": max(x for _, x, _, _ in got),
                "guard_trials_mean": round(statistics.mean(g for _, _, _, g in got), 1),
                "limit_steady": limit,
            }
    return out


def main(argv: list[str]) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="bench bisect")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--cases",
        default="deterministic,flaky1,flaky5,chances,racing,simulated,triggers,chances_sim,shrink",
        help="comma-separated: deterministic, flaky1, flaky5, chances, racing, simulated, "
        "triggers, chances_sim, shrink",
    )
    opts = ap.parse_args(argv)
    cases = set(opts.cases.split(","))
    out: dict[str, Any] = {}
    runs = 5 if opts.quick else 20
    with tempfile.TemporaryDirectory(prefix="replayer-bench-bisect-") as d:
        tmp = Path(d)
        if "deterministic" in cases:
            det = out["deterministic"] = deterministic(tmp)
            print("| deterministic prefix-cache crash, 1,000 requests / 100 sessions | value |")
            print("|---|---|")
            print(f"| result | {', '.join(det['result'])} (exact: {det['exact']}) |")
            print(
                f"| trials, total without confirmation | **{det['trials_total']}** (target <= 45) |"
            )
            print(f"| trials by stage | {det['trials_by_stage']} |")
            print(
                f"| prefix trials | {det['trials_by_stage'].get('prefix', 0)} (target <= "
                f"ceil(log2 {det['cut_size']}) + 2 = {det['prefix_bound']}) |"
            )
            print(f"| wall time | {det['seconds']} s |")
        for case, fault, what, at, n in (
            ("flaky1", ONE_TRIGGER, "(p = 0.5) crash on the 40th request", 40, runs),
            ("flaky5", FIVE_TRIGGERS, "(p = 0.5) crash on each of requests 40-44", 40, runs),
            ("chances", CHANCES, "(p = 0.3) from the 35th request on, each a chance", 35, 10),
        ):
            if case not in cases:
                continue
            fl = out[case] = flaky(tmp, n, fault, at)
            print(f"\n| flaky {what}, prefix stage | value |")
            print("|---|---|")
            want = n - n // 10
            print(
                f"| exact minimal prefix | **{fl['exact']} / {fl['runs']}** "
                f"(target >= {want} of {n}) |"
            )
            print(f"| prefixes found | {fl['prefixes']} |")
            print(f"| trials per bisect | mean {fl['trials_mean']}, max {fl['trials_max']} |")
    if "racing" in cases:
        with tempfile.TemporaryDirectory(prefix="replayer-bench-racing-") as d:
            rc = out["racing"] = racing(Path(d), 10)
        print("\n| threshold crash met by racing sessions, whole pipeline, 10 bisects | value |")
        print("|---|---|")
        print(f"| result sizes | {rc['sizes']} |")
        print(f"| trials per bisect | mean {rc['trials_mean']}, max {rc['trials_max']} |")
        print(f"| different failing requests named per bisect | {rc['failing_requests_named']} |")
    for case, fn, title in (
        ("simulated", simulated, "prefix search, fake runner, n = 1,000, one culprit, 100 seeds"),
        ("triggers", simulated_triggers, "prefix stage, fake runner, k triggers at p, 100 seeds"),
        ("chances_sim", simulated_chances, "one trigger, each later request a chance, 100 seeds"),
    ):
        if case not in cases:
            continue
        sim = out[case] = fn(100)
        print(f"\n| {title} | searches | exact | trials mean | max | crashes mean |")
        print("|---|---|---|---|---|---|")
        for name, r in sim.items():
            print(
                f"| {name} | {r['searches']} | {r['exact']} | {r['trials_mean']} | "
                f"{r['trials_max']} | {r.get('restarts_mean', '-')} |"
            )
    if "shrink" in cases:
        sh = out["shrink"] = simulated_shrink(100)
        print("\n| shrink stage, fake runner, N and C per seed, 100 seeds | searches | exact "
              "thresholds | shrink trials mean | max | of them the rate guard's | steady "
              "limit |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for name, r in sh.items():
            print(
                f"| {name} | {r['searches']} | {r['exact']} | {r['shrink_trials_mean']} | "
                f"{r['shrink_trials_max']} | {r['guard_trials_mean']} | {r['limit_steady']} |"
            )
    return out
