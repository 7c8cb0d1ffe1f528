"""The results file survives however a run ends."""

from __future__ import annotations

import pytest

from replayer.replay.results import (
    FIELDS,
    Result,
    ResultsWriter,
    Status,
    close_open_writers,
    read_results,
)

pytestmark = pytest.mark.inprocess


def result(i: int) -> Result:
    return Result("t", i, f"r{i}", "s", i, status=Status.OK, seq=i)


def test_a_new_results_file_is_already_a_readable_stream(tmp_path):
    # a process killed before its first result keeps a file the report reads
    w = ResultsWriter(tmp_path / "r.arrow")
    try:
        assert read_results(tmp_path / "r.arrow") == []
    finally:
        w.close()


def test_results_pending_past_the_interval_reach_disk_without_another_result(tmp_path):
    # a target that hangs right after some requests settled: nothing else is
    # added, yet those rows are flushed by the replay's tick (flush_due)
    w = ResultsWriter(tmp_path / "r.arrow", flush_interval=3600)
    w.add(result(0))
    w.flush_due()
    assert read_results(tmp_path / "r.arrow") == []  # not due yet
    w._interval = 0.0  # noqa: SLF001 - the interval has passed
    w.flush_due()
    rows = read_results(tmp_path / "r.arrow")
    assert [r["request_id"] for r in rows] == ["r0"] and set(rows[0]) == set(FIELDS)
    w.close()


def test_a_forced_interrupt_closes_what_the_clean_up_left_open(tmp_path):
    w = ResultsWriter(tmp_path / "r.arrow", flush_interval=3600)
    w.add(result(0))
    w.add(result(1))
    close_open_writers()  # what the CLI does on KeyboardInterrupt
    assert [r["request_id"] for r in read_results(tmp_path / "r.arrow")] == ["r0", "r1"]
    close_open_writers()  # idempotent: nothing left open
    w.close()
