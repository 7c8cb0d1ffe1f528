"""The recorder's durability: an exchange is in the trace before its client sees it end.

The proxy's event loop must never wait on the disk or on compression (a
stalled loop stalls every stream it forwards), so finished exchanges go
through a deque to a single writer thread, which turns them into rows and
hands them to the :class:`~replayer.trace.writer.TraceWriter` (stream form:
each batch is a complete IPC message, readable after SIGKILL).

Group commit: the proxy holds back each response's end (a body's last
bytes, a stream's end event or EOF) and awaits :meth:`TraceSink.wait` for
the exchange's sequence number. The thread writes whatever is queued as one
batch, pushes it to the OS (``write``; ``fsync`` too when asked), and wakes
the waiters with one ``call_soon_threadsafe``. A row therefore reaches the
OS before its client has the whole response, so a SIGKILL never loses an
exchange its client saw complete; under load one write covers many
exchanges, and an idle recorder writes each at once.

Recording never blocks traffic. When it stops (the writer failed: a full
disk, an I/O error) the waiters are released at once, later exchanges are
counted as lost instead of queued, and ``on_stop`` is told why, once. When
the writer is merely slow, a response is held at most ``hold_limit``
seconds; after that, responses pass unheld until the writer catches up.

One thread and a FIFO deque keep rows in completion order, so a row's delta
base (its parent, which completed before it started) is always written
first. A row that cannot be built is logged and counted, never fatal:
losing one row must not take the proxy down.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import heapq
import logging
import shutil
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from replayer.errors import ReplayerError
from replayer.trace.model import RequestRecord
from replayer.trace.writer import TraceWriter

log = logging.getLogger("replayer.record")

T = TypeVar("T")


class TraceSink(Generic[T]):
    """A writer thread fed by a deque; ``put`` never blocks, ``wait`` is bounded.

    **Usage**::

        sink = TraceSink(writer, build=to_record, on_stop=print)
        sink.start()
        seq = sink.put(exchange)         # from the event loop
        if (held := sink.wait(seq)) is not None:
            await held                   # the row is written (or recording stopped)
        sink.close()                     # drain, write, end-of-stream marker
    """

    def __init__(
        self,
        writer: TraceWriter,
        build: Callable[[T], RequestRecord | None],
        *,
        hold_limit: float = 10.0,
        on_stop: Callable[[str], None] | None = None,
    ) -> None:
        self.writer = writer
        self.build = build
        self.hold_limit = hold_limit
        self.on_stop = on_stop
        self.rows = 0
        """Rows accepted by the writer."""
        self.flushed = 0
        """Rows on disk (pushed to the OS)."""
        self.errors = 0
        """Rows that could not be built or written."""
        self.last_error: str | None = None
        self.stopped: str | None = None
        """Why recording stopped (the writer failed); None while it records."""
        self.late = 0
        """Responses released before their row was written (the writer was slow)."""
        self._refused = 0  # put after the stop (event-loop thread)
        self._dropped = 0  # queued before the stop, never written (writer thread)
        self._items: collections.deque[tuple[int, T]] = collections.deque()
        self._seq = 0
        """The last sequence number handed out (event-loop thread)."""
        self._done = 0
        """Every item up to this sequence number is settled: written, or not to be."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ids: set[str] = set()
        self._thread = threading.Thread(
            target=self._run, name="replayer-record-writer", daemon=True
        )
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[tuple[int, float, asyncio.Future[None]]] = []
        """(seq, held since, future): a heap by sequence number (event-loop thread)."""
        self._timer: asyncio.TimerHandle | None = None
        self._lagging = False

    @property
    def lost(self) -> int:
        """Exchanges that are not in the trace because recording stopped."""
        unwritten = self.rows - self.flushed if self.stopped is not None else 0
        return self._refused + self._dropped + unwritten

    def start(self) -> None:
        self._thread.start()

    def put(self, item: T) -> int:
        """Queue an item; its sequence number, for :meth:`wait`."""
        if self._closed:
            raise RuntimeError("trace sink is closed")
        self._seq += 1
        if self.stopped is not None:
            self._refused += 1
        else:
            self._items.append((self._seq, item))
            self._wake.set()
        return self._seq

    def wait(self, seq: int) -> asyncio.Future[None] | None:
        """A future that is done once item ``seq`` is written (or will not be:
        a bad row, recording stopped, the writer too slow); None if it already is."""
        # the loop first: the thread reads it after advancing _done, so either
        # it sees the loop and wakes us, or we see its _done here
        loop = self._loop = asyncio.get_running_loop()
        if seq <= self._done or self.stopped is not None or self._lagging:
            return None
        fut: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._waiters, (seq, loop.time(), fut))
        if self._timer is None:
            self._timer = loop.call_at(loop.time() + self.hold_limit, self._overdue)
        return fut

    def close(self) -> None:
        """Write everything queued, close the file; blocks until done."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._write(self._take())
            self._close_writer()

    # -- on the event loop ------------------------------------------------------

    def _release(self) -> None:
        """Wake the waiters whose rows are settled (all of them once recording stopped)."""
        self._lagging = False
        done = self._done if self.stopped is None else self._seq
        w = self._waiters
        while w and w[0][0] <= done:
            fut = heapq.heappop(w)[2]
            if not fut.done():
                fut.set_result(None)
        if not w and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _overdue(self) -> None:
        """Release responses held past ``hold_limit``: traffic first, durability second."""
        self._timer = None
        loop = self._loop
        if loop is None:
            return
        now = loop.time()
        w = self._waiters
        late = 0
        while w and w[0][1] + self.hold_limit <= now:
            fut = heapq.heappop(w)[2]
            if not fut.done():
                fut.set_result(None)
                late += 1
        if late:
            self.late += late
            if not self._lagging:
                log.warning(
                    "%s: the trace writer is %.0f s behind: responses pass without "
                    "waiting for their rows until it catches up",
                    self.writer.path,
                    self.hold_limit,
                )
            self._lagging = True
        if w:
            self._timer = loop.call_at(w[0][1] + self.hold_limit, self._overdue)

    # -- the thread ---------------------------------------------------------------

    def _run(self) -> None:
        # Woken per queued item; while it writes a batch, the next one gathers.
        while True:
            self._wake.wait()
            self._wake.clear()
            self._write(self._take())
            if self._stop.is_set() and not self._items:
                break
        self._close_writer()

    def _take(self) -> list[tuple[int, T]]:
        items = self._items
        out: list[tuple[int, T]] = []
        while items:
            out.append(items.popleft())
        return out

    def _write(self, batch: list[tuple[int, T]]) -> None:
        """Add ``batch`` as rows, write them as one batch, wake their waiters."""
        if not batch:
            return
        if self.stopped is None:
            for k, (_, item) in enumerate(batch):
                try:
                    self._add(item)
                except OSError as exc:  # the writer flushed inside add, and failed
                    self._dropped += len(batch) - k  # this one too: its row went with the batch
                    self._halt(exc)
                    break
            else:
                try:
                    self.writer.flush()
                    self.flushed = self.rows
                except OSError as exc:
                    self._halt(exc)
        else:
            self._dropped += len(batch)
        self._done = batch[-1][0]
        self._notify()

    def _notify(self) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._release)

    def _add(self, item: T) -> None:
        try:
            rec = self.build(item)
            if rec is None:
                return
            if rec.base_hint is not None and rec.base_hint not in self._ids:
                rec.base_hint = None  # its parent was never written: store this one whole
            self.writer.add(rec)
        except OSError:
            raise
        except ReplayerError as exc:
            self._fail(f"row not written: {exc}")
            return
        except Exception as exc:  # a bug in one row must not end the recording
            log.exception("building a row failed")
            self._fail(f"row not written: {type(exc).__name__}: {exc}")
            return
        self._ids.add(rec.request_id)
        self.rows += 1

    def _halt(self, exc: OSError) -> None:
        """Stop recording: the writer failed. Traffic goes on, unrecorded."""
        path = self.writer.path
        try:
            free = f"{shutil.disk_usage(path.parent).free:,} bytes free"
        except OSError:
            free = "free space unknown"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            why = f"disk full writing {path} ({free})"
        else:
            why = f"cannot write {path}: {exc.strerror or exc} ({free})"
        self.stopped = why
        self.errors += 1
        self.last_error = why
        msg = (
            f"recording stopped: {why}; the trace holds the {self.flushed:,} exchanges "
            "written before, later ones are forwarded but not recorded"
        )
        if self.on_stop is not None:
            self.on_stop(msg)
        else:
            log.error("%s", msg)

    def _close_writer(self) -> None:
        if self.stopped is not None:
            return  # the writer closed itself when it failed
        try:
            self.writer.close()
            self.flushed = self.rows
        except OSError as exc:
            self._halt(exc)

    def _fail(self, message: str) -> None:
        self.errors += 1
        if self.last_error is None or self.errors <= 10:
            log.error("%s: %s", self.writer.path, message)
        self.last_error = message
