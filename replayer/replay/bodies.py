"""Request bodies built off the event loop and ahead of their due time.

A 120K-token body takes a millisecond or more to assemble; hundreds of
sessions due at the same instant take hundreds. Built on the event loop,
that time is taken from everything else the loop does: health probes, SSE
reads (TTFT is measured late), the hang watchdog, signal handling. So bodies
are built by one worker thread (the trace's body builder keeps per-session
state and is not thread-safe: one thread owns it), in plan order, as far
ahead of dispatch as a byte budget allows; a body that depends on live
replies (live mode, chained Responses) is built when asked for, first.

On a virtual clock (the tests' deterministic time) a wait on a thread looks
like idleness and time would jump past it, so there the same interface
builds inline, on the loop, exactly when asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

import orjson

from replayer.wire import Api, api_for_path

if TYPE_CHECKING:
    from replayer.trace.reader import Trace

HORIZON_S = 1.0
"""Bodies due within this many seconds of the schedule's now are built ahead."""
AHEAD_MAX = 4096
"""Bodies built ahead at most, whatever their size (each holds a result slot)."""
LOW_WATER = 0.75
"""A worker held back by the budget resumes once use is down to this share."""


class Bodies:
    """Bodies of plan positions ``0 .. n-1`` for one target's dispatch.

    **Usage**::

        bodies = Bodies(build, static, ahead_bytes=256 << 20)
        body = await bodies.get(i)   # built ahead, or now
        bodies.discard(j)            # j will not be sent (skipped)
        bodies.close()
    """

    def __init__(
        self,
        build: Callable[[int], bytes],
        static: Sequence[bool],
        *,
        ahead_bytes: int,
        threaded: bool = True,
        due: Sequence[float] | None = None,
        horizon: float = HORIZON_S,
        lock: threading.Lock | None = None,
    ) -> None:
        """``due``: each position's earliest send time (seconds after T0);
        only bodies due within ``horizon`` of the schedule's now are built
        ahead, so after a burst the worker does not take the core from the
        sends for bodies nobody needs yet. The schedule's now is 0 until
        :meth:`start` gives T0. ``lock``: held around every build; one lock
        for all the workers of one replay (one per target), whose builders
        share the trace's caches."""
        self._build = build
        self._static = static
        self._budget = ahead_bytes
        self._threaded = threaded
        self._cv = threading.Condition()
        self._ready: dict[int, Future[bytes]] = {}
        self._urgent: deque[tuple[int, Future[bytes]]] = deque()
        self._taken: set[int] = set()
        self._next = 0
        self._ahead = 0
        self._closed = False
        self._due = due
        self._horizon = horizon
        self._t0: float | None = None
        self._newest: Future[bytes] | None = None
        self._starved = False
        """The worker waits for budget room (a release must wake it)."""
        self._lock = lock or threading.Lock()
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._work, name="replayer-bodies", daemon=True)
            self._thread.start()

    def start(self, t0: float) -> None:
        """The schedule starts: ``t0`` on :func:`time.monotonic`'s clock."""
        with self._cv:
            self._t0 = t0
            self._cv.notify()

    def _wait_s(self, i: int) -> float:
        """Seconds until position ``i`` is within the horizon (<= 0: now)."""
        if self._due is None:
            return 0.0
        now = 0.0 if self._t0 is None else time.monotonic() - self._t0
        return self._due[i] - self._horizon - now

    async def get(self, i: int) -> bytes:
        """The body of plan position ``i`` (each position asked for once)."""
        if not self._threaded:
            with self._lock:
                return self._build(i)
        with self._cv:
            self._taken.add(i)  # never built ahead again
            fut = self._ready.pop(i, None)
            if fut is None:
                fut = Future()
                self._urgent.append((i, fut))
                self._cv.notify()
            elif fut.done():  # built ahead: its bytes leave the budget now
                self._release(fut)  # (the condition's lock is reentrant)
                return fut.result()  # (no loop round trip for a body that is ready)
            else:  # being built: its bytes leave the budget once it is taken
                fut.add_done_callback(self._release)
        return await asyncio.wrap_future(fut)

    async def warm(self, k: int, within: float) -> int:
        """Wait (at most ``within`` seconds, real time) until the first ``k``
        positions are built or the budget is full: a burst due at T0 then
        leaves on time. Returns how many bodies are ready."""
        if not self._threaded or k <= 0:
            return 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        for _ in range(int(within / 0.01) + 1):  # bounded by ``within``
            with self._cv:
                last = self._newest  # the worker finished what it started
                full = self._ahead >= self._budget or len(self._ready) >= AHEAD_MAX
                n = len(self._static)
                later = self._next < n and self._wait_s(self._next) > 0  # not due soon
                stuck = (self._next >= k or later) and (last is None or last.done())
                if full or stuck or loop.time() >= deadline:
                    return sum(f.done() for f in self._ready.values())
            await asyncio.sleep(0.01)
        return 0

    def discard(self, i: int) -> None:
        """Position ``i`` will not be asked for: free what was built for it."""
        if not self._threaded:
            return
        with self._cv:
            self._taken.add(i)  # the worker skips it when it gets there
            fut = self._ready.pop(i, None)
        if fut is not None:
            fut.add_done_callback(self._release)

    def _release(self, fut: Future[bytes]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        with self._cv:
            self._ahead -= len(fut.result())
            # Only a worker held back by the budget needs waking, and only once
            # a quarter of it is free: a wake per body taken is a thread switch
            # per send (an asked-for body wakes it at once, in get).
            if (
                self._starved
                and self._ahead <= self._budget * LOW_WATER
                and len(self._ready) <= AHEAD_MAX * LOW_WATER
            ):
                self._starved = False
                self._cv.notify()

    def close(self) -> None:
        """Stop the worker (it finishes the body in hand, then exits)."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _work(self) -> None:
        n = len(self._static)
        while True:
            with self._cv:
                job = self._pick(n)
                for _ in range(1_000_000):  # bounded; each wait ends on notify or 1 s
                    if job is not None or self._closed:
                        break
                    self._cv.wait(timeout=self._idle_s(n))
                    job = self._pick(n)
                if job is None:
                    return
                i, fut, ahead = job
            try:
                with self._lock:
                    body = self._build(i)
            except BaseException as exc:  # delivered to the dispatcher, which raises it
                with contextlib.suppress(InvalidStateError):  # its waiter was cancelled
                    fut.set_exception(exc)
                continue
            with self._cv:
                if ahead:
                    self._ahead += len(body)
            with contextlib.suppress(InvalidStateError):
                fut.set_result(body)

    def _idle_s(self, n: int) -> float:
        """How long the worker may sleep: until the next body enters the
        horizon, at most 1 s (a notify wakes it sooner)."""
        if self._next < n and self._due is not None:
            return min(1.0, max(0.001, self._wait_s(self._next)))
        return 1.0

    def _pick(self, n: int) -> tuple[int, Future[bytes], bool] | None:
        """The next job, under the lock: an asked-for body first, then the
        next static one in plan order while the budget has room."""
        if self._closed:
            return None
        if self._urgent:
            i, asked = self._urgent.popleft()
            return i, asked, False
        while self._next < n:
            if self._ahead >= self._budget or len(self._ready) >= AHEAD_MAX:
                self._starved = True
                return None
            i = self._next
            if self._wait_s(i) > 0 and not (i in self._taken or not self._static[i]):
                return None  # not due soon: nothing to build yet
            if i in self._taken or not self._static[i]:
                self._next += 1
                continue
            self._next += 1
            fut: Future[bytes] = Future()
            self._ready[i] = fut
            self._newest = fut
            return i, fut, True
        return None


def body_patch(
    trace: Trace, row: int, base: dict[str, Any], force_stream: bool
) -> dict[str, Any] | None:
    """What a replay changes in a row's recorded body (``base``: the model);
    the body workers (:mod:`replayer.replay.workers`) apply the same."""
    if not force_stream:
        return base or None
    patch = dict(base)
    patch["stream"] = True
    if api_for_path(trace.column("path")[row]) in (Api.MESSAGES, Api.RESPONSES):
        return patch  # their streams always carry usage; stream_options is not theirs
    opts = {"include_usage": True}
    params = orjson.loads(trace.params_text(row))
    if isinstance(params.get("stream_options"), dict):
        opts = {**params["stream_options"], "include_usage": True}
    patch["stream_options"] = opts
    return patch
