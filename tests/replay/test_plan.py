"""Selection and the schedule rules, exactly."""

from __future__ import annotations

import pytest

from replayer.errors import UsageError
from replayer.replay.plan import build_plan, parse_spec, select
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter

pytestmark = pytest.mark.inprocess


def make_trace(tmp_path, rows):
    """rows: (request_id, session, turn, start_ms, end_ms or None)"""
    p = tmp_path / "t.arrow"
    with TraceWriter(p, TraceMeta(source="test")) as w:
        for rid, sid, turn, start, end in rows:
            w.add(
                RequestRecord.from_body(
                    {"prompt": rid},
                    request_id=rid,
                    session_id=sid,
                    turn=turn,
                    start_us=start * 1000,
                    end_us=None if end is None else end * 1000,
                )
            )
    return Trace.open(p)


ROWS = [
    ("a0", "A", 0, 100, 400),
    ("b0", "B", 0, 200, 300),
    ("a1", "A", 1, 1000, 1500),
    ("c0", "C", 0, 1100, None),
    ("b1", "B", 1, 1200, 1250),
    ("c1", "C", 1, 1300, None),
]


def test_parse_spec_ids_and_ranges():
    ids = ["x", "y", "z", "w"]
    assert parse_spec("y", ids, "s") == {1}
    assert parse_spec("0..1,w", ids, "s") == {0, 1, 3}
    assert parse_spec("2..", ids, "s") == {2, 3}
    assert parse_spec("..1", ids, "s") == {0, 1}
    assert parse_spec("1..99", ids, "s") == {1, 2, 3}
    with pytest.raises(UsageError, match="no s 'q' in the trace"):
        parse_spec("q", ids, "s")
    with pytest.raises(UsageError, match="bad s range '3..1'"):
        parse_spec("3..1", ids, "s")
    with pytest.raises(UsageError, match="bad s range"):
        parse_spec("a..b", ids, "s")


def test_select_keeps_trace_order(tmp_path):
    t = make_trace(tmp_path, ROWS)
    rid = t.column("request_id")
    assert [rid[r] for r in select(t)] == ["a0", "b0", "a1", "c0", "b1", "c1"]
    assert [rid[r] for r in select(t, limit=3)] == ["a0", "b0", "a1"]
    assert [rid[r] for r in select(t, sessions="A,2")] == ["a0", "a1", "c0", "c1"]
    assert [rid[r] for r in select(t, sessions="1..")] == ["b0", "c0", "b1", "c1"]
    assert [rid[r] for r in select(t, requests="b1,0..1")] == ["a0", "b0", "b1"]
    assert [rid[r] for r in select(t, sessions="B", limit=1)] == ["b0"]


def test_plan_links_turns_and_measures_gaps(tmp_path):
    t = make_trace(tmp_path, ROWS)
    plan = build_plan(t, select(t), ReplayPolicy(speed=2.0))
    assert plan.prev == [None, None, 0, None, 1, 3]
    # relative to the first request (100 ms), halved by speed 2
    assert plan.start == [0.0, 0.05, 0.45, 0.5, 0.55, 0.6]
    # a1: 1000 - 400 = 600 ms; b1: 1200 - 300 = 900 ms; c1: previous end unknown -> 0
    assert plan.gap == [0.0, 0.0, 0.3, 0.0, 0.45, 0.0]
    assert plan.last_of_session == [False, False, True, False, True, True]


def test_eligible_per_timing(tmp_path):
    t = make_trace(tmp_path, ROWS)
    plan = build_plan(t, select(t), ReplayPolicy())
    # a1: recorded start 0.9 s; think gap 0.6 s after a0 completes
    assert plan.eligible(2, Timing.RECORDED, prev_done=0.1) == pytest.approx(0.9)
    assert plan.eligible(2, Timing.RECORDED, prev_done=0.5) == pytest.approx(1.1)
    assert plan.eligible(2, Timing.GAPS, prev_done=0.1) == pytest.approx(0.7)
    assert plan.eligible(2, Timing.ASAP, prev_done=0.1) == pytest.approx(0.1)
    # first turns: their offset, except asap
    assert plan.eligible(3, Timing.RECORDED, None) == pytest.approx(1.0)
    assert plan.eligible(3, Timing.GAPS, None) == pytest.approx(1.0)
    assert plan.eligible(3, Timing.ASAP, None) == 0.0


def test_dropped_turn_links_to_the_previous_selected_one(tmp_path):
    rows = [("a0", "A", 0, 0, 100), ("a1", "A", 1, 200, 300), ("a2", "A", 2, 500, 600)]
    t = make_trace(tmp_path, rows)
    plan = build_plan(t, select(t, requests="a0,a2"), ReplayPolicy())
    assert plan.prev == [None, 0]
    assert plan.gap == [0.0, pytest.approx(0.4)]  # 500 - 100


def test_policy_validation():
    with pytest.raises(ValueError, match="speed must be positive"):
        ReplayPolicy(speed=0)
    with pytest.raises(ValueError, match="max_inflight"):
        ReplayPolicy(max_inflight=0)
