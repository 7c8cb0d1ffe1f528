"""One request out, from the moment it is dispatched to its settled result.

The dispatchers decide *when*; what happens from then on is the same in
every order and lives here: the request's URL and headers, its turn (in
strict order its first byte only after the previous request's are in its
transport, and only while the run goes on), the target's
:class:`~replayer.replay.transport.Transport`, and what its result says.
Seq and dispatch time are stamped at the first byte, not when the send's
task started, so seq is the order the target saw. A request aborted on the
wire (the hang watchdog, an interrupt) is recorded as such; one refused its
turn (the run stopped first) stays never sent. A request the recorded
client abandoned is abandoned at the same point (``--aborts replay``,
:mod:`replayer.replay.aborts`).
"""

from __future__ import annotations

import asyncio

from replayer.monitor.watch import InFlight
from replayer.replay.aborts import abort_points
from replayer.replay.accounting import Books, TargetRun
from replayer.replay.plan import Plan
from replayer.replay.policy import Aborts, Mode, ReplayPolicy
from replayer.replay.results import Status
from replayer.replay.schedule import Schedule
from replayer.replay.transport import Request, release
from replayer.trace.reader import Trace
from replayer.wire import Reply


class Sender:
    """Sends plan positions to a target, one task each."""

    def __init__(
        self, trace: Trace, plan: Plan, policy: ReplayPolicy, schedule: Schedule, books: Books
    ) -> None:
        self.plan, self.policy, self.schedule, self.books = plan, policy, schedule, books
        c = trace.column
        self._rid, self._sid, self._path = c("request_id"), c("session_id"), c("path")
        self._tokens = c("input_tokens")
        self._keep_text = policy.save_output or policy.mode is Mode.LIVE
        self._aborts = abort_points(trace, plan.rows) if policy.aborts is Aborts.REPLAY else {}
        """Trace row -> where the recorded client abandoned it (read before T0)."""

    async def send(
        self,
        run: TargetRun,
        i: int,
        at: float,
        body: bytes,
        sent: asyncio.Future[None] | None = None,
        answered: asyncio.Future[None] | None = None,
        turn: asyncio.Future[None] | None = None,
    ) -> None:
        """Send request ``i`` (due ``at`` seconds after T0): its first byte
        only after ``turn`` (the previous request's ``sent``) and only while
        the run goes on; seq and dispatch time are stamped then."""
        row = self.plan.rows[i]
        r = run.results[i]
        r.scheduled_us = round(at * 1e6)
        clock, t0 = self.schedule.clock, self.schedule.t0
        now = clock.now()
        refused = False

        def stamp() -> None:
            r.dispatched_us = round((clock.now() - t0) * 1e6)
            r.seq = run.sent
            run.sent += 1
            run.last_lag_us = r.dispatched_us - (r.scheduled_us or 0)

        async def go() -> bool:
            nonlocal refused
            if turn is not None and not turn.done():
                await asyncio.wait((turn,))
            if run.stopped.is_set():
                refused = True
                return False
            stamp()
            run.inflight += 1  # counted from its first byte, like ``sent``
            return True

        headers = run.target.headers()
        headers["X-Request-Id"] = self._rid[row]
        if self.policy.session_header:
            headers[self.policy.session_header] = self._sid[row]
        url = run.target.url.rstrip("/") + self._path[row]
        stats = Reply()
        run.inflight_map[i] = InFlight(i, r.request_id, now - t0, self._tokens[row], stats)
        request = Request(
            url,
            body,
            headers,
            r,
            t0=t0,
            timeout=self.policy.request_timeout,
            stats=stats,
            keep_text=self._keep_text,
            sent=sent,
            answered=answered,
            go=go,
            abort=self._aborts.get(row),
        )
        try:
            await run.transport.handle(request)
        except asyncio.CancelledError:
            if not run.aborting:
                raise
            release(sent, answered)
            if r.seq is None:  # aborted before its first byte: never sent (untouched)
                refused = True
            else:
                r.status = Status.TIMEOUT
                if run.interrupted:
                    r.error_class = "interrupted"
                    r.error = "the replay was interrupted before the response finished"
                else:  # aborted by the hang watchdog: the request never finished
                    r.error_class = "hang"
                    r.error = "aborted: the target stopped making progress"
                r.done_us = round((clock.now() - t0) * 1e6)
        finally:
            if r.seq is not None:  # stamped by go: on the wire (counted in)
                run.inflight -= 1
            run.inflight_map.pop(i, None)
            if run.slots is not None:
                run.slots.release()
        if refused:  # the run stopped before its turn: recorded as never sent
            return
        if r.seq is None:  # it ended before a byte left (no connection, aborted)
            stamp()
        if run.watch is not None:
            failed = r.status not in (Status.OK, Status.ABORTED)
            run.watch.completed(r.request_id, r.error if failed else None)
        run.content.learn(i, r, stats)
        self.books.settle(run, i)
