"""Task spawning that cannot lose tasks.

``asyncio.create_task`` keeps only a weak reference to the task it returns, so
a fire-and-forget task can be garbage-collected mid-flight, and an unnamed task
is anonymous in every traceback and ``asyncio.all_tasks()`` dump. ``spawn``
keeps a strong reference until the task is done and always names it. Ruff's
TID251 bans the raw call everywhere else (see ``pyproject.toml``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_log = logging.getLogger(__name__)
_live: set[asyncio.Task[Any]] = set()


def _done(task: asyncio.Task[Any]) -> None:
    _live.discard(task)
    if not task.cancelled() and task.exception() is not None:
        _log.error("task %s failed", task.get_name(), exc_info=task.exception())


def spawn(coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """Start ``coro`` as a named task that stays referenced until it finishes.

    An exception that escapes the task is logged once, so background work
    never fails silently."""
    task = asyncio.create_task(coro, name=name)  # noqa: TID251 - the one sanctioned use
    _live.add(task)
    task.add_done_callback(_done)
    return task


def live_tasks() -> frozenset[asyncio.Task[Any]]:
    """Tasks started by :func:`spawn` that have not finished yet."""
    return frozenset(_live)


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait for ``event`` at most ``seconds``; True if it is set.

    The periodic loops (health probes, scrapes, watchdogs) sleep with this so
    that stopping them is immediate rather than one interval late."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


class Signal:
    """Wakes every waiter on :meth:`fire`, from sync code and without a lock.

    A pool gives a server back in ``finally`` blocks that may run while the
    task is being cancelled; a :class:`asyncio.Condition` needs its lock there
    (an await that the cancellation can interrupt, leaving waiters asleep
    with a server free). Waiters re-check their own condition after waking."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def fire(self) -> None:
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    async def wait(self) -> None:
        f: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(f)
        try:
            await f
        finally:
            if f in self._waiters:
                self._waiters.remove(f)
