"""The recorder's durability: one thread owns the trace writer and flushes on time.

The proxy's event loop must never wait on the disk or on compression (a
stalled loop stalls every stream it forwards), so finished exchanges go
through a deque to a single writer thread, which polls it every 20 ms (being
woken per exchange would cost the loop a GIL hand-off per request). The
thread turns them into rows and hands them to the
:class:`~replayer.trace.writer.TraceWriter` (stream form: each flushed batch
is a complete IPC message, readable after SIGKILL).

Flushing is the thread's, not the writer's (which only flushes inside
``add``, so a quiet recorder would hold its last rows forever). The deadline
is set by the oldest unflushed row, timed from when the event loop queued
it, minus a small margin for waking up and writing; after a quiet interval
a row is flushed at once. A row therefore reaches the OS within one interval
of its exchange finishing, so SIGKILL loses at most the last interval;
under load that is one batch per interval. ``fsync=True`` also survives
power loss, at a cost.

One thread and a FIFO deque keep rows in completion order, so a row's delta
base (its parent, which completed before it started) is always written
first. A row the writer rejects is logged and counted, never fatal: losing
one row must not take the proxy down.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from replayer.errors import ReplayerError
from replayer.trace.model import RequestRecord
from replayer.trace.writer import TraceWriter

log = logging.getLogger("replayer.record")

T = TypeVar("T")


class TraceSink(Generic[T]):
    """A writer thread fed by a deque; ``put`` never blocks.

    **Usage**::

        sink = TraceSink(writer, build=to_record, flush_interval=1.0)
        sink.start()
        sink.put(exchange)      # from the event loop
        sink.close()            # drain, flush, write the end-of-stream marker
    """

    def __init__(
        self,
        writer: TraceWriter,
        build: Callable[[T], RequestRecord | None],
        *,
        flush_interval: float = 1.0,
    ) -> None:
        self.writer = writer
        self.build = build
        self.flush_interval = flush_interval
        self.rows = 0
        """Rows accepted by the writer."""
        self.flushed = 0
        """Rows on disk (pushed to the OS)."""
        self.errors = 0
        """Rows that could not be written."""
        self.last_error: str | None = None
        self._items: collections.deque[tuple[float, T]] = collections.deque()
        """(queued at, item); ``deque.append`` is atomic, and wakes nobody."""
        self._stop = threading.Event()
        self._ids: set[str] = set()
        self._thread = threading.Thread(
            target=self._run, name="replayer-record-writer", daemon=True
        )
        self._closed = False

    def start(self) -> None:
        self._thread.start()

    def put(self, item: T) -> None:
        if self._closed:
            raise RuntimeError("trace sink is closed")
        self._items.append((time.monotonic(), item))

    def close(self) -> None:
        """Write everything queued, flush, close the file; blocks until done."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._drain()
            self._close_writer()

    # -- the thread ---------------------------------------------------------------

    def _run(self) -> None:
        # The thread polls instead of being woken per row: a wake-up per
        # exchange costs the event loop a GIL hand-off every time. It flushes
        # when the oldest unflushed row (timed from when it was queued, so the
        # polling lag counts) is about to be one interval old - the margin
        # covers waking up and writing the batch - or at once after a quiet
        # interval.
        interval = self.flush_interval
        budget = interval - min(0.1 * interval, 0.05)
        poll = min(0.02, interval / 5)
        oldest: float | None = None
        last = time.monotonic()
        while True:
            wait = poll if oldest is None else min(poll, oldest + budget - time.monotonic())
            stopping = self._stop.wait(max(0.0, wait))
            first = self._drain()
            if first is not None and oldest is None:
                oldest = first
            now = time.monotonic()
            if oldest is not None and (now >= oldest + budget or now - last >= interval):
                self._flush()
                oldest = None
                last = time.monotonic()
            if stopping:
                break
        self._close_writer()

    def _drain(self) -> float | None:
        """Add every queued item; when the first one added was queued (None: none)."""
        first: float | None = None
        while self._items:
            queued, item = self._items.popleft()
            if self._add(item) and first is None:
                first = queued
        return first

    def _add(self, item: T) -> bool:
        try:
            rec = self.build(item)
            if rec is None:
                return False
            if rec.base_hint is not None and rec.base_hint not in self._ids:
                rec.base_hint = None  # its parent was never written: store this one whole
            self.writer.add(rec)
        except ReplayerError as exc:
            self._fail(f"row not written: {exc}")
            return False
        except Exception as exc:  # a bug in one row must not end the recording
            log.exception("building a row failed")
            self._fail(f"row not written: {type(exc).__name__}: {exc}")
            return False
        self._ids.add(rec.request_id)
        self.rows += 1
        return True

    def _flush(self) -> None:
        try:
            self.writer.flush()
            self.flushed = self.rows
        except (OSError, ValueError) as exc:  # pyarrow raises OSError subclasses
            self._fail(f"flush failed: {exc}")

    def _close_writer(self) -> None:
        try:
            self.writer.close()
            self.flushed = self.rows
        except (OSError, ValueError) as exc:
            self._fail(f"closing the trace failed: {exc}")

    def _fail(self, message: str) -> None:
        self.errors += 1
        if self.last_error is None or self.errors <= 10:
            log.error("%s: %s", self.writer.path, message)
        self.last_error = message
