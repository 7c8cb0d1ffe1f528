"""The writer thread: rows reach the disk within one flush interval even when
the recorder is idle, a bad row is counted and skipped, and a delta base that
was never written is dropped instead of failing the row."""

from __future__ import annotations

import pytest

from replayer.record.sink import TraceSink
from replayer.testing.emulator import poll_until
from replayer.trace.model import RequestRecord, TraceMeta
from replayer.trace.reader import Trace
from replayer.trace.writer import TraceWriter

pytestmark = pytest.mark.inprocess


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


def test_idle_rows_are_flushed_by_the_timer(tmp_path):
    path = tmp_path / "t.arrow"
    sink = TraceSink(TraceWriter(path, TraceMeta(source="test")), build, flush_interval=0.2)
    sink.start()
    try:
        sink.put(("a", "x"))
        # nothing else arrives: the timer, not a later add, pushes the row out
        poll_until(lambda: sink.flushed == 1, 5)
        assert Trace.open(path).column("request_id") == ["a"]
        sink.put("bad")
        sink.put(("b", "y", "never-written"))
        sink.put(("c", "x+z", "a"))
    finally:
        sink.close()
    t = Trace.open(path)
    assert t.column("request_id") == ["a", "b", "c"] and not t.torn_tail
    assert (sink.rows, sink.errors) == (3, 1) and "cannot build" in sink.last_error
    assert t.column("base") == [None, None, 0]  # b stored whole; c deltas on a
    assert [t.body(r)["messages"][-1]["content"] for r in range(3)] == ["x", "y", "z"]
