"""Segments never overwrite; merge puts rows on one clock in trace order,
renames colliding request ids deterministically, keeps named sessions,
re-infers inferred ones across the restart, and keeps every body."""

from __future__ import annotations

import pytest

from replayer.record.segments import claim, existing_segments, merge
from replayer.trace.model import RequestRecord, TraceMeta
from replayer.trace.reader import Trace
from replayer.trace.writer import TraceWriter

pytestmark = pytest.mark.inprocess

SYS = {"role": "system", "content": "agent"}


def test_claim_never_overwrites(tmp_path):
    out = tmp_path / "sub" / "rec.arrow"
    assert claim(out) == (out, 0)
    assert claim(out) == (tmp_path / "sub" / "rec.1.arrow", 1)
    (tmp_path / "sub" / "rec.7.arrow").write_bytes(b"")
    assert claim(out) == (tmp_path / "sub" / "rec.8.arrow", 8)
    assert [k for k, _ in existing_segments(out)] == [0, 1, 7, 8]
    assert out.read_bytes() == b""  # claimed, untouched


def write_segment(path, t0, rows):
    meta = TraceMeta(source="record", details={"t0_unix_us": t0})
    with TraceWriter(path, meta) as w:
        for rid, sid, source, start, msgs, reply in rows:
            w.add(
                RequestRecord.from_body(
                    {"model": "m", "messages": msgs},
                    request_id=rid,
                    session_id=sid,
                    turn=0,
                    start_us=start,
                    end_us=start + 100,
                    status=200,
                    output_text=reply,
                    meta={"session": source},
                )
            )


def user(text):
    return {"role": "user", "content": text}


def bot(text):
    return {"role": "assistant", "content": text}


def test_merge_orders_renames_and_relinks(tmp_path):
    a, b = tmp_path / "rec.arrow", tmp_path / "rec.1.arrow"
    u0, u1, u2 = user("task"), user("go on"), user("more")
    write_segment(
        a,
        1_000_000,
        [
            # written in completion order, not start order
            ("rec-000002", "S", "header", 300, [SYS, user("named")], "n0"),
            ("rec-000001", "s-rec-000001", "new", 200, [SYS, u0], "r0"),
        ],
    )
    write_segment(
        b,
        1_005_000,  # restarted 5 ms later on the wall clock
        [
            ("rec1-000001", "s-rec1-000001", "new", 10, [SYS, u0, bot("r0"), u1], "r1"),
            ("rec-000002", "S", "header", 20, [SYS, user("named"), bot("n0"), u2], "n1"),
            ("solo", "s-solo", "new", 30, [SYS, user("unrelated")], "x"),
        ],
    )
    out = tmp_path / "merged.arrow"
    res = merge([b, a], out)  # the order given does not matter
    assert (res.rows, res.segments, res.renamed, res.relinked, res.sessions) == (5, 2, 1, 1, 3)
    t = Trace.open(out)
    c = t.column
    assert c("start_us") == [200, 300, 5010, 5020, 5030]
    assert c("request_id") == ["rec-000001", "rec-000002", "rec1-000001", "rec-000002~s1", "solo"]
    assert c("session_id") == ["s-rec-000001", "S", "s-rec-000001", "S", "s-solo"]
    assert c("turn") == [0, 0, 1, 1, 0]
    m = t.meta(2)
    assert (m["recorded_session"], m["parent"]) == ("s-rec1-000001", "rec-000001")
    assert t.meta(3)["original_request_id"] == "rec-000002"
    assert (m["segment"], m["session"]) == (1, "next")
    assert t.body(2)["messages"] == [SYS, u0, bot("r0"), u1]
    assert c("base")[2] == 0  # delta-encoded against its parent in the other segment
    assert [s["path"] for s in t.provenance["segments"]] == [str(a), str(b)]
    assert t.provenance["t0_unix_us"] == 1_000_000 and t.form == "file"
    # deterministic
    out2 = tmp_path / "again.arrow"
    merge([a, b], out2)
    t2 = Trace.open(out2)
    assert [t2.body(r) for r in range(5)] == [t.body(r) for r in range(5)]
    assert t2.column("request_id") == c("request_id")


def test_a_join_follows_the_request_it_names_when_merge_renames_it(tmp_path):
    """Both segments hold an ``r``; the second segment's ``r`` becomes
    ``r~s1``, and its ``j`` that joins on it joins on ``r~s1``, not on the
    first segment's ``r``."""
    paths = [tmp_path / "x.arrow", tmp_path / "y.arrow"]
    for k, p in enumerate(paths):
        with TraceWriter(p, TraceMeta(source="record", details={"t0_unix_us": k * 1000})) as w:
            for rid, start, after in (("r", 5, None), ("j", 50, ["r"])):
                w.add(
                    RequestRecord.from_body(
                        {"prompt": "p"}, request_id=rid, session_id=f"s{k}{rid}", turn=0,
                        start_us=start, end_us=start + 10, after=after,
                    )
                )  # fmt: skip
    out = tmp_path / "m.arrow"
    merge(paths, out)
    t = Trace.open(out)
    assert t.column("request_id") == ["r", "j", "r~s1", "j~s1"]
    assert t.column("after") == [None, ["r"], None, ["r~s1"]]


def test_traces_without_a_clock_are_placed_one_after_another(tmp_path):
    p1, p2 = tmp_path / "x.arrow", tmp_path / "y.arrow"
    for p in (p1, p2):
        with TraceWriter(p, TraceMeta(source="synth")) as w:
            w.add(
                RequestRecord.from_body(
                    {"prompt": "p"}, request_id="r", session_id="s", turn=0, start_us=5, end_us=9
                )
            )
    out = tmp_path / "m.arrow"
    res = merge([p1, p2], out)
    t = Trace.open(out)
    assert t.column("start_us") == [5, 15] and t.column("request_id") == ["r", "r~s1"]
    # explicit session names (no recorder inference) join
    assert t.column("session_id") == ["s", "s"] and t.column("turn") == [0, 1]
    assert res.renamed == 1


def test_merge_names_a_segment_killed_before_its_first_row(tmp_path):
    """A recorder killed before its first exchange leaves a schema with no
    whole batch after it: merge refuses it, naming it (nothing is in it to
    lose by leaving it out), and writes nothing."""
    from replayer import api
    from replayer.errors import TraceError

    good = tmp_path / "rec.arrow"
    write_segment(good, 1_000_000, [("rec-000001", "S", "header", 100, [SYS, user("hi")], "r")])
    schema_only = tmp_path / "rec.1.arrow"
    write_segment(schema_only, 2_000_000, [])
    schema_only.write_bytes(schema_only.read_bytes()[:-8])  # no end-of-stream: killed
    with pytest.raises(TraceError, match=r"rec\.1\.arrow: .*nothing left to read"):
        api.merge([good, schema_only], tmp_path / "all.arrow")
    assert not (tmp_path / "all.arrow").exists()
    api.merge([good], tmp_path / "all.arrow")
    assert Trace.open(tmp_path / "all.arrow").column("request_id") == ["rec-000001"]
