"""What the bisect tests share (and ``python -m bench bisect_fake``): a small
trace of sessions arriving in rounds, a fake runner that crashes iff a
planted pair of its requests is replayed no faster than 4x, a bisect over
it, the probes a binary search spends, and an emulator launch command on a
free port."""

from __future__ import annotations

import random
import shlex
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from replayer._async import Signal
from replayer.bisect.oracle import Candidate, Oracle, Outcome
from replayer.bisect.pipeline import Bisect, BisectOptions
from replayer.bisect.runner import Observation, Trial
from replayer.replay.plan import select
from replayer.replay.policy import Timing
from replayer.testing.fakes import FakeRunner
from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace.schema import Kind
from tests.helpers.net import free_port

SESSIONS, TURNS = 6, 5
PAIR = ("s1-1", "s3-2")
"""Positions 7 and 15 of 30: sessions arrive in order, turns in rounds."""
LATE = 2
"""The fake notices its crash this many requests after the trigger."""
OPTS = BisectOptions(calibrate_matches=3, calibrate_runs=6, confirm=4)


class Killed(Exception):
    """The bisect's process dying mid-trial."""


@dataclass
class PlantedPair:
    """Crashes iff both ``pair`` requests are replayed, at 4x or slower (never
    asap), with probability ``p``; reports what was sent by the crash, as
    the real runner does. ``kill_at`` raises on that call, as a killed bisect."""

    pair: tuple[str, ...] = PAIR
    p: float = 1.0
    seed: int = 0
    kill_at: int | None = None
    calls: list[Trial] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    async def run(self, trial: Trial) -> Observation:
        if self.kill_at is not None and len(self.calls) + 1 == self.kill_at:
            raise Killed(f"killed at call {self.kill_at}")
        self.calls.append(trial)
        assert trial.out.is_dir()
        ids = trial.request_ids()
        slow = trial.timing is not Timing.ASAP and trial.speed <= 4.0
        if set(self.pair) <= set(ids) and slow and self.rng.random() < self.p:
            i = max(ids.index(x) for x in self.pair)
            return Observation(
                Outcome.MATCH,
                failure_class="process_exit",
                signature="planted",
                failed_request=ids[i],
                suspects=self.pair,  # the crashing batch, as vLLM's scheduler dump names it
                sent=trial.rows[: i + 1 + LATE],
            )
        return Observation(Outcome.PASS)


def bisect(trace, out, runner, opts=OPTS, **kw) -> Bisect:
    return Bisect(trace, select(trace), runner, out, opts, say=lambda m: None, **kw)


def write_trace(tmp_path) -> Trace:
    p = tmp_path / "t.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for t in range(TURNS):
            for s in range(SESSIONS):
                i = t * SESSIONS + s
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": f"s{s} turn {t}"}],
                    "max_tokens": 2,
                }
                w.add(
                    RequestRecord.from_body(
                        body,
                        request_id=f"s{s}-{t}",
                        session_id=f"s{s}",
                        turn=t,
                        start_us=i * 10_000,
                        end_us=i * 10_000 + 5_000,
                    )
                )
    return Trace.open(p)


def probes_of_binary_search(n: int, h_star: int) -> int:
    """The probes :func:`shortest_prefix` spends on n items when h* is the answer."""
    lo, hi, probes = 0, n, 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probes += 1
        lo, hi = (lo, mid) if mid >= h_star else (mid, hi)
    return probes


def emulator_cmd(*faults, extra=()):
    args = [
        sys.executable,
        "-m",
        "replayer.emulator",
        "--port",
        str(free_port()),
        "--speed",
        "instant",
        *extra,
    ]
    for f in faults:
        args += ["--fault", f]
    return shlex.join(args)


@dataclass
class PooledPair(PlantedPair):
    """:class:`PlantedPair` on ``width`` servers in virtual time, as a pool
    runs them: a trial takes ``per_request`` seconds a replayed request; a
    server whose trial crashed restarts in the background (``restart``
    seconds, a model load) and is lent out again once ready, a ready server
    first. ``started`` holds each trial's start (virtual seconds), ``peak``
    the most trials that ran at once."""

    width: int = 1
    clock: Any = None
    per_request: float = 0.5
    restart: float = 900.0
    started: list[float] = field(default_factory=list)
    peak: int = 0
    asked_peak: int = 0
    """The most trials the bisect asked for at once (before any wait for a
    server): never more than ``width``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._ready_at = [0.0] * self.width
        self._busy = [False] * self.width
        self._free = Signal()
        self._asked = 0

    async def _take(self) -> int:
        while all(self._busy):
            await self._free.wait()
        free = [i for i in range(self.width) if not self._busy[i]]
        server = min(free, key=lambda i: (self._ready_at[i], i))
        self._busy[server] = True
        try:
            await self.clock.sleep_until(self._ready_at[server])
        except BaseException:
            self._give(server)  # cancelled while the server started
            raise
        return server

    def _give(self, server: int) -> None:
        self._busy[server] = False
        self._free.fire()

    async def run(self, trial: Trial) -> Observation:
        self._asked += 1
        self.asked_peak = max(self.asked_peak, self._asked)
        try:
            server = await self._take()
        finally:
            self._asked -= 1
        self.peak = max(self.peak, sum(self._busy))
        try:
            self.started.append(self.clock.now())
            await self.clock.sleep(self.per_request * len(trial.rows))
            obs = await super().run(trial)
            if obs.outcome is Outcome.MATCH:
                self._ready_at[server] = self.clock.now() + self.restart
            return replace(obs, server=server)
        finally:
            self._give(server)


# -- the oracle on a fake runner (tests/bisect/test_search.py and others) --


def make_oracle(tmp_path, culprits, p=1.0, seed=0, **kw):
    tmp_path.mkdir(exist_ok=True)
    runner = FakeRunner(frozenset(culprits), p=p, seed=seed, **kw)
    return Oracle(runner, tmp_path / f"journal-{seed}-{len(culprits)}.jsonl"), runner


async def calibrate(oracle, runner, items, matches=5, runs=12):
    """As the pipeline does first: the full set until 5 matches or 12 runs."""
    full = Candidate(tuple(sorted(items)))
    for _ in range(runs):
        if oracle.counts(full)[Outcome.MATCH] >= matches:
            break
        await oracle.run_once(full, "calibrate")
    runner.calls.clear()
    return bool(oracle.matched)


def prefixes(j):
    return Candidate(tuple(range(j)))


async def prefix_stage(oracle, n, *, recheck=2):
    """The pipeline's prefix stage: a binary search re-checked when the crash
    looked steady, the posterior search otherwise."""
    steady = oracle.repeats(upto=oracle.mark("prefix")) == 1
    return await oracle.flaky_prefix(
        n, prefixes, binary_first=steady, recheck=recheck, length_of=lambda reached: reached
    )


# -- token-id prompts for the shrink stage --

BS = 16


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def blocks_trace(tmp_path) -> Trace:
    """a0 (80 blocks) and b0 (111 blocks, its first 50 shared with a0), among
    three requests that share nothing."""
    plan = [
        ("n0", list(range(1000, 1040))),
        ("a0", list(range(1, 81))),
        ("n1", list(range(2000, 2060))),
        ("b0", [*range(1, 51), *range(200, 261)]),
        ("n2", list(range(3000, 3090))),
    ]
    p = tmp_path / "blocks.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for i, (rid, blocks) in enumerate(plan):
            w.add(
                RequestRecord(
                    request_id=rid,
                    session_id=rid[0],
                    turn=0,
                    start_us=i * 10_000,
                    kind=Kind.BLOCKS,
                    params={"model": "m", "max_tokens": 8},
                    content=blocks,
                    block_size=BS,
                    input_tokens=len(blocks) * BS,
                )
            )
    return Trace.open(p)


def long_prompt_after_a_hit(trial: Trial) -> Observation:
    """Crashes when a prompt of >= 1,500 tokens shares >= 480 tokens with an
    earlier prompt of the trial (a prefix-cache hit)."""
    bodies = trial.bodies()
    ids = trial.request_ids()
    for i, body in enumerate(bodies):
        prompt = body["prompt"]
        hit = max((common_prefix(prompt, b["prompt"]) for b in bodies[:i]), default=0)
        if len(prompt) >= 1500 and hit >= 480:
            return Observation(Outcome.MATCH, signature="planted", failed_request=ids[i])
    return Observation(Outcome.PASS)
