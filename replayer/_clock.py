"""Time for the scheduler and the watchdogs: the real clock, or a virtual one.

Replay timing is the product (a request is due at T0 + its recorded offset /
speed; a hang is declared ``stall_timeout`` seconds after the last progress),
so its tests must be able to state it exactly. On the wall clock they cannot:
a loaded machine delays every wake-up by an unknown amount. The scheduler
(:mod:`replayer.replay.schedule`), the watchdogs (:mod:`replayer.monitor.watch`)
and the readiness waits of :mod:`replayer.target` therefore read time and
sleep only through a :class:`Clock`:

* :data:`REAL` (the default everywhere) is the event loop's clock: ``now()``
  is ``time.monotonic()``, which is what the default asyncio loop's
  ``time()`` returns, so it shares its time base with timers and with code
  that still reads ``loop.time()`` (the HTTP client, the health probes).
* :class:`VirtualClock` is for tests (users' too: it is public as
  ``replayer.testing.VirtualClock``): time stands still while any task can
  run and jumps to the earliest deadline once the loop is idle (trio's
  ``MockClock(autojump_threshold=0)``), or moves only on :meth:`advance`.
  Sleepers wake in deadline order, ties in the order they went to sleep, so a
  test of code that waits only on the clock and on its own tasks is
  deterministic, whatever the machine's load.

This module is a leaf: it imports only the standard library.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
import weakref
from typing import Protocol

PRECISE_MARGIN = 0.0015
"""A precise real sleep ends its timer wait this long before the deadline and
yields to the loop until the deadline passes: asyncio wakes timers on coarse
ticks, and a replay's lag should be the replayer's own, not the timer's."""


class Clock(Protocol):
    """Where scheduling code gets the time and waits for it."""

    def now(self) -> float:
        """Monotonic seconds; only differences mean anything."""
        ...

    def wall(self) -> float:
        """Unix time, for timestamps that people and other hosts read."""
        ...

    async def sleep_until(
        self, deadline: float, stop: asyncio.Event | None = None, *, precise: bool = False
    ) -> bool:
        """Until ``now() >= deadline`` or ``stop`` is set; False if stopped.

        ``precise`` asks for sub-millisecond accuracy (the dispatch of a
        request); periodic loops leave it off."""
        ...

    async def sleep(self, seconds: float, stop: asyncio.Event | None = None) -> bool:
        """``sleep_until(now() + seconds, stop)``."""
        ...


class RealClock:
    """The event loop's clock (see the module docstring)."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep_until(
        self, deadline: float, stop: asyncio.Event | None = None, *, precise: bool = False
    ) -> bool:
        if stop is not None and stop.is_set():
            return False
        delay = deadline - time.monotonic() - (PRECISE_MARGIN if precise else 0.0)
        if delay > 0:
            if stop is None:
                await asyncio.sleep(delay)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stop.wait()
        if precise:
            # the fine wait spins on the loop (other tasks run): sub-ms precision
            while time.monotonic() < deadline:
                if stop is not None and stop.is_set():
                    return False
                await asyncio.sleep(0)
        return stop is None or not stop.is_set()

    async def sleep(self, seconds: float, stop: asyncio.Event | None = None) -> bool:
        return await self.sleep_until(time.monotonic() + seconds, stop)

    def __repr__(self) -> str:
        return "RealClock()"


REAL = RealClock()
"""The default clock of every component that takes one."""

_SETTLERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = weakref.WeakKeyDictionary()
"""Tasks inside :meth:`VirtualClock.settle`, per loop."""


class VirtualClock:
    """Virtual time for tests.

    ``autojump=True``: once no task can run (nothing is ready on the loop),
    time jumps to the earliest deadline and wakes the sleepers due then.
    ``autojump=False``: time moves only when a test calls :meth:`advance`.

    Only for code whose tasks wait on this clock and on each other: a task
    waiting on a socket, a thread or a real timer looks idle too, and time
    would jump past it. Idleness is read from the default asyncio loop's
    ready queue (a private attribute; other loops are refused)."""

    def __init__(
        self,
        start: float = 0.0,
        *,
        autojump: bool = True,
        limit: float | None = None,
        wall_start: float = 1.7e9,
    ) -> None:
        self._now = start
        self._wall_offset = wall_start - start
        self.autojump = autojump
        self.limit = limit
        """Virtual time past which sleepers get TimeoutError instead of waking:
        a deadlock under autojump would otherwise spin time forward forever."""
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._jumper: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now!r}, sleepers={len(self._sleepers)})"

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    async def sleep_until(
        self, deadline: float, stop: asyncio.Event | None = None, *, precise: bool = False
    ) -> bool:
        if stop is not None and stop.is_set():
            return False
        if deadline <= self._now:
            return True
        loop = asyncio.get_running_loop()
        due: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._order), due))
        if self.autojump and (self._jumper is None or self._jumper.done()):
            # held in self._jumper and ended by the clock itself: not fire-and-forget
            self._jumper = loop.create_task(self._autojump(), name="virtual-clock")
        if stop is None:
            await due
            return True
        stopped = loop.create_task(stop.wait(), name="virtual-clock-stop")
        try:
            await asyncio.wait((due, stopped), return_when=asyncio.FIRST_COMPLETED)
            if due.done():
                due.result()  # raises past the limit
        finally:
            stopped.cancel()
            due.cancel()  # an abandoned sleeper is dropped when it comes up
        return not stop.is_set()

    async def sleep(self, seconds: float, stop: asyncio.Event | None = None) -> bool:
        return await self.sleep_until(self._now + seconds, stop)

    # -- moving time ---------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest deadline anyone still waits for."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    async def settle(self) -> None:
        """Return once the loop is idle: every task waits (on this clock or
        on something else), so what can happen at this instant has."""
        loop = asyncio.get_running_loop()
        ready = getattr(loop, "_ready", None)
        if ready is None:
            raise RuntimeError(f"VirtualClock needs asyncio's own event loop, not {loop!r}")
        # other settlers (another clock's jumper, a test's advance) each keep
        # exactly one wake-up queued: idle is when nothing else is
        others = _SETTLERS.get(loop, 0)
        _SETTLERS[loop] = others + 1
        try:
            idle = 0
            while idle < 2:  # twice: a wake-up can take one more pass of the loop
                await asyncio.sleep(0)
                idle = idle + 1 if len(ready) <= _SETTLERS[loop] - 1 else 0
        finally:
            _SETTLERS[loop] -= 1

    async def advance(self, seconds: float) -> None:
        """Move time ``seconds`` forward, waking every sleeper due on the way
        at its own deadline, in order; return once the loop is idle there."""
        if seconds < 0:
            raise ValueError("time does not go back")
        target = self._now + seconds
        await self.settle()
        while (d := self.next_deadline()) is not None and d <= target:
            self._wake(d)
            await self.settle()
        self._now = max(self._now, target)
        await self.settle()

    def _wake(self, deadline: float) -> None:
        if self.limit is not None and deadline > self.limit:
            for _, _, due in self._sleepers:
                if not due.done():
                    due.set_exception(TimeoutError(f"virtual time would pass {self.limit:g}"))
            self._sleepers.clear()
            return
        self._now = max(self._now, deadline)
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, due = heapq.heappop(self._sleepers)
            if not due.done():
                due.set_result(None)

    async def _autojump(self) -> None:
        while True:
            await self.settle()
            d = self.next_deadline()
            if d is None:
                return  # restarted by the next sleeper
            self._wake(d)
