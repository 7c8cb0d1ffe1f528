"""Which request goes next: the walkers of strict, admitted and session order.

``strict`` order runs one walker per target over the plan in trace order:
it waits for a request's previous turn, then for its due time (never before
the previous request's in trace order), then for a concurrency slot, and
hands the request to its own task. That task opens (or takes) its
connection at once but writes its first byte only once the previous
request's are in its transport: a burst's connections open together, its
requests still leave in trace order (:data:`AHEAD` at most wait their
turn). ``admitted`` order instead waits for each request's response
headers (the engine has taken it) before the next one goes. ``session``
order runs one task per session, each sending its own turns in order.
In every order a request also waits for the end of the requests it joins
on (the trace's ``after``: a parent's turn after its sub-agents).

A stopped target gets nothing more. The connections the first second needs
are opened before T0 (:func:`preopen`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine, Sequence
from functools import partial
from typing import Any

from replayer._async import spawn
from replayer.replay.accounting import Books, TargetRun
from replayer.replay.plan import Plan
from replayer.replay.policy import Order, ReplayPolicy
from replayer.replay.schedule import BODY_LEAD, Schedule
from replayer.replay.send import Sender
from replayer.replay.transport import release
from replayer.trace.reader import Trace

AHEAD = 32
"""Strict order: requests whose connection may open while earlier ones wait
to be written. A burst of new sessions at one instant otherwise connects one
connection after another (a loop round trip each);
a bound, so an ASAP replay without ``--max-inflight`` does not open a
connection for every request of the trace at once."""
PREOPEN_MAX = 1024
"""Connections opened before T0 at most, per target (the file descriptors
of a replay are the user's ``ulimit -n``)."""


async def preopen(runs: Sequence[TargetRun], due: int, max_inflight: int | None) -> None:
    """Connections for the ``due`` requests of the first second open before
    T0, as a client with a warm pool has them: a burst of new sessions
    against a server busy with prefill needs one each, and opening them
    inside the burst made its tail late (bench/RESULTS.md, "Bodies at wire speed")."""
    n = min(due, PREOPEN_MAX, max_inflight or due)
    if n <= 0:
        return
    opened = await asyncio.gather(*(r.transport.preopen(r.target.url, n) for r in runs))
    for r, k in zip(runs, opened, strict=True):
        r.preopened = k


def _release(signals: tuple[asyncio.Future[None] | None, ...], _task: object) -> None:
    release(*signals)


def _cancelling() -> bool:
    """The current task itself is being cancelled (not only what it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Dispatcher:
    """Walks one target's plan in the policy's order and hands each request
    to the :class:`~replayer.replay.send.Sender` when its time comes."""

    def __init__(
        self,
        trace: Trace,
        plan: Plan,
        policy: ReplayPolicy,
        schedule: Schedule,
        books: Books,
        sender: Sender,
    ) -> None:
        self.plan, self.policy, self.schedule = plan, policy, schedule
        self.books, self.sender = books, sender
        self._tokens = trace.column("input_tokens")

    async def run(self, run: TargetRun) -> None:
        """Dispatch the whole plan to ``run``'s target (or until it stops)."""
        if self.policy.order.global_order:
            await self._strict(run)
        else:
            await self._sessions(run)

    async def _strict(self, run: TargetRun) -> None:
        plan, schedule = self.plan, self.schedule
        admitted = self.policy.order is Order.ADMITTED
        last = 0.0  # when the previous request in trace order was due
        turn: asyncio.Future[None] | None = None  # the previous request's sent
        ahead: deque[asyncio.Future[None]] = deque()
        for i in range(len(plan)):
            if run.stopped.is_set():
                return
            if not await schedule.joined(i, run.turns, run.stopped):
                return
            # in strict order a request is also due no earlier than its
            # predecessor was due: lag then measures the replayer (and grows
            # if it falls behind), not the order constraint
            at = max(schedule.due(i, run.turns), last)
            if self._skip(run, i, at):
                continue
            body = await self._ready(run, i, at)
            if body is None:
                return
            loop = asyncio.get_running_loop()
            sent: asyncio.Future[None] = loop.create_future()
            answered = loop.create_future() if admitted else None
            task = self._spawn(
                run,
                i,
                self.sender.send(run, i, at, body, sent, answered, None if admitted else turn),
            )
            # a task cancelled before it ran never resolves its own
            task.add_done_callback(partial(_release, (sent, answered)))
            last = at
            if answered is not None:
                # admitted order waits for the response headers: the engine has
                # taken it (its connection opens only then: a request the
                # engine may never take must not hold the next one's turn)
                await answered
                continue
            # the next request writes only once this one's bytes are on the
            # wire, so the server sees trace order even across connections
            turn = sent
            ahead.append(sent)
            while ahead and ahead[0].done():
                ahead.popleft()
            if len(ahead) >= AHEAD:
                await asyncio.wait((ahead.popleft(),))

    async def _sessions(self, run: TargetRun) -> None:
        # a session's task starts just before its first request is due: set up
        # all at T0, 18,000 sessions delayed the first send by most of a second
        async with asyncio.TaskGroup() as tg:
            for at, s, idx in self.schedule.session_starts():
                if not await self.schedule.until(at - BODY_LEAD, run.stopped, precise=False):
                    break
                tg.create_task(self._session(run, idx), name=f"session-{s}")

    async def _session(self, run: TargetRun, idx: list[int]) -> None:
        schedule = self.schedule
        for i in idx:
            if run.stopped.is_set():
                return
            # its previous turn ended (awaited below); its joins are other
            # sessions' requests, awaited here
            if not await schedule.joined(i, run.turns, run.stopped):
                return
            at = schedule.due(i, run.turns)
            if self._skip(run, i, at):
                continue
            # the body is built just before it is due: thousands of sessions
            # waiting for their start must not each hold one (memory), nor
            # build them all at T0 before anything is sent (lag)
            if not await schedule.until(at - BODY_LEAD, run.stopped, precise=False):
                return
            body = await self._ready(run, i, at)
            if body is None:
                return
            task = self._spawn(run, i, self.sender.send(run, i, at, body))
            try:
                # its completion is the session's next dependency; shielded: a
                # cancel of this loop (Ctrl-C cancels the task group) must not
                # cancel the send behind the run's back, which then left its
                # row unrecorded; the run aborts it and records why
                await asyncio.shield(task)
            except asyncio.CancelledError:
                # the send was aborted (hang watchdog, interrupt): the session
                # goes on or stops as the run says. A cancel of this loop itself
                # stops it here: swallowed, the loop sent its next turn into a
                # hung server and the interrupt waited for that
                if _cancelling():
                    raise

    def _skip(self, run: TargetRun, i: int, at: float) -> bool:
        """Over-context requests are skipped (when asked): recorded, not sent."""
        if not self.policy.skip_over_context or run.facts is None:
            return False
        mml = run.facts.max_model_len
        tokens = self._tokens[self.plan.rows[i]]
        if mml is None or tokens < mml:
            return False
        if run.bodies is not None:
            run.bodies.discard(i)
        self.books.skipped(
            run, i, at, "over_context", f"input_tokens {tokens} >= max_model_len {mml}"
        )
        return True

    async def _ready(self, run: TargetRun, i: int, at: float) -> bytes | None:
        """Request ``i``'s body, once it is due (``at``) and has a concurrency
        slot (``--max-inflight``; the send releases it); None if the target
        stopped first."""
        assert run.bodies is not None  # made with the run, before any dispatch
        body = await run.bodies.get(i)
        if not await self.schedule.until(at, run.stopped):
            return None
        if run.slots is not None:
            await run.slots.acquire()
            if run.stopped.is_set():
                run.slots.release()
                return None
        return body

    def _spawn(self, run: TargetRun, i: int, send: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = spawn(send, name=f"send-{run.target.name}-{i}")
        run.tasks.add(task)
        task.add_done_callback(run.tasks.discard)
        return task
