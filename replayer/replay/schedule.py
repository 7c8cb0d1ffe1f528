"""When a request may go: its due time, on one clock, after one T0.

The plan says when each request is due relative to T0 and to the completion
of its session's previous turn and of the requests it joins on
(:meth:`~replayer.replay.plan.Plan.eligible`);
this module turns that into waits, the same for every dispatcher, so strict,
admitted and session order differ only in *which* request they wait for.
Every target's schedule starts from the same T0, taken after every set-up
step so that no request is late because of start-up.

Every wait and every time stamp goes through one
:class:`~replayer._clock.Clock` (the real one unless a test passes a
virtual one, which makes dispatch times exact). Dispatch waits are precise:
a coarse sleep to ~1.5 ms before the deadline, then yielding to the loop
until it passes (asyncio wakes timers on millisecond ticks; lag is what the
results report, so it should be the replayer's own).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Sequence
from typing import Any

from replayer._async import spawn
from replayer._clock import Clock
from replayer.replay.plan import Plan
from replayer.replay.policy import Timing

BODY_LEAD = 0.05
"""Seconds before its due time a session builds its next body (long contexts
take milliseconds to serialize)."""
WARM_S = 1.0
"""Bodies due within this many seconds of T0 are built before T0."""
WARM_TIMEOUT = 30.0
"""Real seconds the start waits for them at most (past it, T0 and lag)."""
T0_MARGIN = 0.005
"""T0 is this long after the last set-up step: the first sends are not late
for the loop pass that starts the dispatchers."""


class Turns:
    """One target's completed requests, which later turns of their session
    wait for (a turn is eligible only once its previous one is done)."""

    def __init__(self, n: int) -> None:
        self.done_at: list[float | None] = [None] * n
        """Per plan position, when it completed (seconds after T0)."""
        self._waiters: dict[int, asyncio.Future[None]] = {}

    def complete(self, i: int, when: float) -> None:
        self.done_at[i] = when
        w = self._waiters.pop(i, None)
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, p: int, stopped: asyncio.Event) -> bool:
        """Until request ``p`` completed; False if ``stopped`` came first."""
        if self.done_at[p] is not None:
            return True
        fut = self._waiters.get(p)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._waiters[p] = fut
        stop = spawn(stopped.wait(), name="stop-wait")
        waits: set[asyncio.Future[Any]] = {fut, stop}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        return self.done_at[p] is not None and not stopped.is_set()


class Schedule:
    """A plan's times under one timing, on one clock, from one T0."""

    def __init__(self, plan: Plan, timing: Timing, clock: Clock) -> None:
        self.plan = plan
        self.timing = timing
        self.clock = clock
        self.t0 = 0.0
        """Clock time of T0 (set by :meth:`start`)."""

    def start(self) -> float:
        """Fix T0 at now (plus :data:`T0_MARGIN`)."""
        self.t0 = self.clock.now() + T0_MARGIN
        return self.t0

    def now(self) -> float:
        """Seconds since T0."""
        return self.clock.now() - self.t0

    def due(self, i: int, turns: Turns) -> float:
        """When request ``i`` is eligible (seconds after T0), given the
        completed requests it waits for (its previous turn and its joins:
        :meth:`~replayer.replay.plan.Plan.waits`, all ended by now)."""
        done = [turns.done_at[w] for w in self.plan.waits(i)]
        ended = max((d for d in done if d is not None), default=None)
        return self.plan.eligible(i, self.timing, ended)

    async def joined(self, i: int, turns: Turns, stopped: asyncio.Event) -> bool:
        """Until every request ``i`` waits for has ended (completed, failed
        or skipped: a failed sub-agent still releases its parent); False if
        ``stopped`` came first. Bounded by those requests' own ends, each
        bounded by the request timeout and the hang watchdog."""
        for w in self.plan.waits(i):
            if not await turns.wait(w, stopped):
                return False
        return True

    async def until(self, at: float, stop: asyncio.Event, *, precise: bool = True) -> bool:
        """Wait until ``at`` seconds after T0; False if ``stop`` is set first.
        ``precise=False`` skips the sub-millisecond spin at the end."""
        return await self.clock.sleep_until(self.t0 + at, stop, precise=precise)

    def recorded_starts(self) -> Sequence[float] | None:
        """Each request's earliest send time, as far as the plan knows it
        before the replay (None as fast as possible: any time)."""
        return None if self.timing is Timing.ASAP else self.plan.start

    def warm(self) -> int:
        """How many requests, in plan order, are due within :data:`WARM_S`
        of T0 (their bodies are built, their connections opened, before it)."""
        if self.timing is Timing.ASAP:
            return len(self.plan)
        return bisect.bisect_left(self.plan.start, WARM_S) if self.plan.start else 0

    def session_starts(self) -> list[tuple[float, str, list[int]]]:
        """Each session (its id and plan positions) with when its first
        request is due, earliest first (ties in plan order)."""
        by_session: dict[str, list[int]] = {}
        for i, s in enumerate(self.plan.sessions):
            by_session.setdefault(s, []).append(i)
        plan, timing = self.plan, self.timing
        # a session whose first request joins on another's starts at once
        # and waits there (its due time is known only when those end)
        starts = sorted(
            (plan.eligible(idx[0], timing, None) if not plan.waits(idx[0]) else 0.0, idx[0], s)
            for s, idx in by_session.items()
        )
        return [(at, s, by_session[s]) for at, _, s in starts]
