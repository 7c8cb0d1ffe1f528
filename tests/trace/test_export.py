"""export: one full body per line, in trace order."""

from __future__ import annotations

import io

import orjson
import pytest

from replayer.trace import Kind, RequestRecord
from replayer.trace.export import write as export
from tests.helpers.traces import growing_session, write, write_current

pytestmark = pytest.mark.inprocess


def test_jsonl_rows_in_trace_order(tmp_path):
    recs, bodies = growing_session(3)
    recs[0].start_us, recs[1].start_us, recs[2].start_us = 50, 10, 30
    recs[1].end_us = 25
    t = write(tmp_path / "t.arrow", recs)
    buf = io.BytesIO()
    n, skipped = export(t, buf, "jsonl")
    lines = [orjson.loads(x) for x in buf.getvalue().splitlines()]
    assert (n, skipped) == (3, [])
    assert [x["request_id"] for x in lines] == ["s1", "s2", "s0"]
    assert lines[0] == {
        "request_id": "s1",
        "session_id": "s",
        "turn": 1,
        "start_us": 10,
        "end_us": 25,
        "path": "/v1/chat/completions",
        "body": bodies[1],
    }
    assert [x["body"] for x in lines] == [bodies[1], bodies[2], bodies[0]]


def test_aiperf_rows(tmp_path):
    recs, bodies = growing_session(2)
    recs[1].start_us = 1_500
    recs.append(
        RequestRecord(
            request_id="b",
            session_id="blk",
            turn=0,
            start_us=2_000_000,
            kind=Kind.BLOCKS,
            params={"model": "m", "max_tokens": 3, "ignore_eos": True},
            content=[7, 8],
            block_size=16,
            input_tokens=40,
        )
    )
    recs.append(
        RequestRecord.from_body(
            {"prompt": "hi", "max_tokens": 2, "temperature": 0},
            request_id="t",
            session_id="txt",
            turn=0,
            start_us=3_000,
        )
    )
    recs.append(
        RequestRecord.from_body(
            {"input": "x"}, request_id="raw", session_id="r", turn=0, start_us=4_000
        )
    )
    t = write(tmp_path / "t.arrow", recs)
    buf = io.BytesIO()
    n, skipped = export(t, buf, "aiperf")
    rows = [orjson.loads(x) for x in buf.getvalue().splitlines()]
    assert (n, skipped) == (4, ["raw"])
    assert rows == [
        {
            "session_id": "s",
            "timestamp": 0,
            "request_id": "s0",
            "messages": bodies[0]["messages"],
            "output_length": 8,
        },
        {
            "session_id": "s",
            "timestamp": 1.5,
            "request_id": "s1",
            "messages": bodies[1]["messages"],
            "output_length": 8,
        },
        {
            "session_id": "txt",
            "timestamp": 3,
            "request_id": "t",
            "text_input": "hi",
            "output_length": 2,
            "extra": {"temperature": 0},
        },
        {
            "session_id": "blk",
            "timestamp": 2000,
            "request_id": "b",
            "input_length": 40,
            "hash_ids": [7, 8],
            "block_size": 16,
            "output_length": 3,
            "extra": {"ignore_eos": True},
        },
    ]


def test_aiperf_makes_namespaced_block_ids_globally_unique(tmp_path):
    def rec(rid, ns, ids):
        return RequestRecord(
            request_id=rid,
            session_id=rid,
            turn=0,
            start_us=0,
            kind=Kind.BLOCKS,
            params={},
            content=ids,
            block_size=4,
            input_tokens=4 * len(ids),
            block_ns=ns,
        )

    t = write(
        tmp_path / "t.arrow",
        [rec("a", "x", [1, 2]), rec("b", "y", [1, 2, 3]), rec("c", "x", [1, 2, 9])],
    )
    buf = io.BytesIO()
    export(t, buf, "aiperf")
    rows = [orjson.loads(x) for x in buf.getvalue().splitlines()]
    # same local ids in different namespaces part ways; within one they still share
    assert [r["hash_ids"] for r in rows] == [[0, 1], [2, 3, 4], [0, 1, 5]]


# -- selection (replay's --limit / --sessions / --requests) --------------------


def _cli(*args):
    import contextlib

    from replayer.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in args])
    return rc, err.getvalue()


def test_export_takes_replays_selection(tmp_path):
    from replayer.trace import Trace

    path = write_current(tmp_path / "t.arrow")
    t = Trace.open(path)
    out = tmp_path / "one.jsonl"
    # one request, by id: its full body and nothing else
    rc, err = _cli("export", path, "--requests", "bsynth-00000-t002", "-o", out)
    assert rc == 0 and "exported 1 requests" in err, err
    (line,) = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert line["body"] == t.body(t.row_of("bsynth-00000-t002"))
    # a session by position, the first N, ranges: the same rows replay would send
    for spec, want in (
        (("--sessions", "0"), [r for r in t.order if t.column("session_id")[r] == "csynth-00000"]),
        (("--limit", "4"), t.order[:4]),
        (("--requests", "2..3,0"), [t.order[0], t.order[2], t.order[3]]),
    ):
        rc, err = _cli("export", path, *spec, "-o", out, "--force")
        assert rc == 0, err
        got = [orjson.loads(x)["request_id"] for x in out.read_bytes().splitlines()]
        assert got == [t.column("request_id")[r] for r in want], spec
    rc, err = _cli("export", path, "--sessions", "1", "--format", "aiperf", "-o", out, "--force")
    assert rc == 0, err
    assert {orjson.loads(x)["session_id"] for x in out.read_bytes().splitlines()} == {
        "bsynth-00000"
    }


def test_an_empty_or_bad_selection_is_one_line(tmp_path):
    path = write_current(tmp_path / "t.arrow")
    out = tmp_path / "x.jsonl"
    for spec, words in (
        (("--limit", "0"), "the selection is empty"),
        (("--requests", "nope"), "no request 'nope'"),
    ):
        rc, err = _cli("export", path, *spec, "-o", out)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and words in err, err
        assert not out.exists()
