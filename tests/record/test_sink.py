"""The writer thread: a row is on disk when its wait ends, rows queued while
a batch is written go out together (group commit), a writer that cannot
write stops recording and releases every waiter at once, a stalled writer
holds a response at most ``hold_limit``, a bad row is counted and skipped,
and a delta base that was never written is dropped instead of failing the row."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from replayer.record.sink import TraceSink
from replayer.testing.emulator import apoll_until, poll_until
from replayer.trace.model import RequestRecord, TraceMeta
from replayer.trace.reader import Trace
from replayer.trace.writer import TraceWriter

pytestmark = pytest.mark.inprocess

BOUND = 10.0
"""Seconds any wait in these tests may take before it counts as a hang."""


def record(rid: str, content: str, base: str | None = None) -> RequestRecord:
    msgs = [{"role": "user", "content": c} for c in content.split("+")]
    body = {"model": "m", "messages": msgs}
    return RequestRecord.from_body(
        body, request_id=rid, session_id="s", turn=0, start_us=0, base_hint=base
    )


def build(item):
    if item == "bad":
        raise ValueError("cannot build")
    return record(*item)


class Gate:
    """A build that blocks on its first item until opened (a slow disk)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.open = threading.Event()

    def __call__(self, item):
        if not self.entered.is_set():
            self.entered.set()
            if not self.open.wait(BOUND):
                raise AssertionError("the gate was never opened")
        return record(*item)


def ids(path: Path) -> list[str]:
    return Trace.open(path).column("request_id")


async def test_a_row_is_on_disk_when_its_wait_ends(tmp_path):
    path = tmp_path / "t.arrow"
    sink = TraceSink(TraceWriter(path, TraceMeta(source="test")), build)
    sink.start()
    try:
        for k, rid in enumerate(("a", "b", "c")):
            held = sink.wait(sink.put((rid, "x")))
            assert held is not None
            await asyncio.wait_for(held, BOUND)
            # no flush timer, no close: the file as another process sees it now
            assert ids(path) == ["a", "b", "c"][: k + 1]
        assert sink.wait(1) is None  # written already: nothing to wait for
    finally:
        sink.close()
    t = Trace.open(path)
    assert t.column("request_id") == ["a", "b", "c"] and not t.torn_tail


async def test_rows_queued_during_a_write_go_out_as_one_batch(tmp_path):
    path = tmp_path / "t.arrow"
    gate = Gate()
    writer = TraceWriter(path, TraceMeta(source="test"))
    sink = TraceSink(writer, gate)
    sink.start()
    try:
        first = sink.wait(sink.put(("r0", "x")))
        await asyncio.to_thread(gate.entered.wait, BOUND)
        rest = [sink.wait(sink.put((f"r{k}", "x"))) for k in range(1, 50)]
        assert path.stat().st_size == 0  # nothing written yet
        gate.open.set()
        await asyncio.wait_for(asyncio.gather(first, *rest), BOUND)
        assert ids(path) == [f"r{k}" for k in range(50)]
        assert writer.batches_written == 2  # r0 alone, then the 49 that queued behind it
    finally:
        gate.open.set()
        sink.close()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this machine")
async def test_a_writer_that_cannot_write_stops_recording_and_holds_nobody():
    told: list[str] = []
    sink = TraceSink(TraceWriter("/dev/full", TraceMeta(source="test")), build, on_stop=told.append)
    sink.start()
    try:
        held = [sink.wait(sink.put((f"r{k}", "x"))) for k in range(3)]
        # released at once when the write fails: not after hold_limit (10 s), never hung
        await asyncio.wait_for(asyncio.gather(*(h for h in held if h is not None)), 5)
        assert sink.stopped is not None and sink.stopped.startswith("disk full writing /dev/full (")
        assert "bytes free)" in sink.stopped
        assert told == [
            f"recording stopped: {sink.stopped}; the trace holds the 0 exchanges written "
            "before, later ones are forwarded but not recorded"
        ]
        # after the stop: nothing queued, nothing held
        assert sink.wait(sink.put(("late", "x"))) is None
        assert sink.lost == 4 and sink.flushed == 0
    finally:
        sink.close()  # the writer closed itself: close does not raise or write
    assert len(told) == 1


async def test_a_stalled_writer_holds_a_response_at_most_hold_limit(tmp_path):
    path = tmp_path / "t.arrow"
    gate = Gate()
    sink = TraceSink(TraceWriter(path, TraceMeta(source="test")), gate, hold_limit=0.3)
    sink.start()
    try:
        held = sink.wait(sink.put(("slow", "x")))
        assert held is not None
        await asyncio.wait_for(held, BOUND)  # released by the limit: the gate is shut
        assert gate.entered.is_set() and not gate.open.is_set()
        assert sink.late == 1
        # behind: later responses are not held at all until the writer catches up
        assert sink.wait(sink.put(("next", "x"))) is None
        gate.open.set()
        await apoll_until(lambda: sink.flushed == 2, BOUND)
        held = sink.wait(sink.put(("caught-up", "x")))
        assert held is not None
        await asyncio.wait_for(held, BOUND)
        assert ids(path) == ["slow", "next", "caught-up"] and sink.late == 1
    finally:
        gate.open.set()
        sink.close()


def test_bad_rows_are_counted_and_a_missing_base_is_dropped(tmp_path):
    path = tmp_path / "t.arrow"
    sink = TraceSink(TraceWriter(path, TraceMeta(source="test")), build)
    sink.start()
    try:
        sink.put(("a", "x"))
        # no event loop waits here: the thread still writes each batch at once
        poll_until(lambda: sink.flushed == 1, BOUND)
        assert ids(path) == ["a"]
        sink.put("bad")
        sink.put(("b", "y", "never-written"))
        sink.put(("c", "x+z", "a"))
    finally:
        sink.close()
    t = Trace.open(path)
    assert t.column("request_id") == ["a", "b", "c"] and not t.torn_tail
    assert (sink.rows, sink.errors) == (3, 1) and "cannot build" in sink.last_error
    assert sink.stopped is None and sink.lost == 0
    assert t.column("base") == [None, None, 0]  # b stored whole; c deltas on a
    assert [t.body(r)["messages"][-1]["content"] for r in range(3)] == ["x", "y", "z"]
