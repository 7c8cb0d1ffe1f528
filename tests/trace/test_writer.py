"""Delta encoding: what the writer stores, and that reading gives back the body."""

from __future__ import annotations

import orjson
import pytest

from replayer.errors import TraceError
from replayer.trace import Kind, RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace import writer as writer_mod
from tests.helpers.traces import chat, growing_session, write

pytestmark = pytest.mark.inprocess


def test_session_turns_store_only_what_they_append(tmp_path):
    recs, bodies = growing_session(4)
    t = write(tmp_path / "t.arrow", recs)
    assert t.column("base") == [None, 0, 1, 2]
    assert t.column("keep") == [0, 2, 4, 6]
    b = t._batch(0)
    appended = b.column("messages").to_pylist()
    assert appended[0] == [orjson.dumps(m).decode() for m in bodies[0]["messages"]]
    assert appended[2] == [
        '{"role":"assistant","content":"ok 1"}',
        '{"role":"user","content":"step 2 ü"}',
    ]
    # params are stored once and inherited while they do not change
    assert b.column("params").to_pylist()[1:] == [None, None, None]
    for row, body in enumerate(bodies):
        assert t.body(row) == body
        assert len(t.body_json(row)) == t.column("body_bytes")[row]


def test_body_keeps_key_order_and_content_position(tmp_path):
    body = {"stream": True, "messages": [{"content": "x", "role": "user"}], "model": "m"}
    t = write(
        tmp_path / "t.arrow",
        [RequestRecord.from_body(body, request_id="a", session_id="s", turn=0, start_us=0)],
    )
    assert t.body_json(0) == orjson.dumps(body)


def test_truncated_context_keeps_a_prefix_of_the_base(tmp_path):
    m = [{"role": "user", "content": str(i)} for i in range(6)]
    recs = [
        chat("a", "s", 0, m[:5]),
        chat("b", "s", 1, m[:2] + [{"role": "user", "content": "summary"}]),  # compaction
    ]
    t = write(tmp_path / "t.arrow", recs)
    assert (t.column("base"), t.column("keep")) == ([None, 0], [0, 2])
    assert t.body(1)["messages"] == m[:2] + [{"role": "user", "content": "summary"}]


def test_unrelated_content_is_a_keyframe(tmp_path):
    recs = [
        chat("a", "s", 0, [{"role": "user", "content": "x"}]),
        chat("b", "s", 1, [{"role": "user", "content": "y"}]),
    ]
    t = write(tmp_path / "t.arrow", recs)
    assert t.column("base") == [None, None]


def test_base_hint_deltas_a_fork_against_its_parent(tmp_path):
    p = [{"role": "user", "content": "shared " * 50}]
    recs = [
        chat("p", "s1", 0, p),
        chat("q", "s2", 0, [{"role": "user", "content": "other"}]),
        chat("f", "s3", 0, p + [{"role": "user", "content": "fork"}]),
    ]
    recs[2].base_hint = "p"
    t = write(tmp_path / "t.arrow", recs)
    assert t.column("base") == [None, None, 0]
    assert t.body(2)["messages"] == p + [{"role": "user", "content": "fork"}]


def test_unknown_base_hint_is_an_error(tmp_path):
    rec = chat("a", "s", 0, [{"role": "user", "content": "x"}])
    rec.base_hint = "nope"
    with pytest.raises(TraceError, match="base_hint 'nope'"):
        write(tmp_path / "t.arrow", [rec])


def test_duplicate_request_id_is_refused(tmp_path):
    with pytest.raises(TraceError, match="duplicate request_id 'a'"):
        write(tmp_path / "t.arrow", [chat("a", "s", 0, []), chat("a", "s", 1, [])])


def test_chain_depth_is_bounded_by_keyframes(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_mod, "MAX_CHAIN", 3)
    recs, bodies = growing_session(9)
    t = write(tmp_path / "t.arrow", recs)
    assert t.column("base") == [None, 0, 1, 2, None, 4, 5, 6, None]
    assert [t.body(r) for r in range(9)] == bodies


def test_evicted_base_falls_back_to_a_keyframe(tmp_path):
    a, ba = growing_session(3, "a")
    b, bb = growing_session(3, "b")
    interleaved = [x for pair in zip(a, b, strict=True) for x in pair]
    t = write(tmp_path / "t.arrow", interleaved, cache_bytes=1)  # nothing survives but the last
    assert t.column("base") == [None] * 6
    assert [t.body(r) for r in range(6)] == [x for p in zip(ba, bb, strict=True) for x in p]


def test_text_and_raw_payloads(tmp_path):
    recs = [
        RequestRecord.from_body(
            {"model": "m", "prompt": "hello"}, request_id="a", session_id="s", turn=0, start_us=0
        ),
        RequestRecord.from_body(
            {"model": "m", "prompt": 'hello world\n"q"'},
            request_id="b",
            session_id="s",
            turn=1,
            start_us=1,
        ),
        RequestRecord.from_body(
            {"model": "m", "input": ["x"]},
            request_id="c",
            session_id="r",
            turn=0,
            start_us=2,
            path="/v1/embeddings",
        ),
    ]
    t = write(tmp_path / "t.arrow", recs)
    assert t.column("kind") == ["text", "text", "raw"]
    assert t.column("keep") == [0, 5, 0]
    assert t._batch(0).column("text").to_pylist() == ["hello", ' world\n"q"', None]
    assert t.body(1) == {"model": "m", "prompt": 'hello world\n"q"'}
    assert t.body(2) == {"model": "m", "input": ["x"]}
    assert t.column("path") == ["/v1/completions", "/v1/completions", "/v1/embeddings"]
    for r in range(3):
        assert len(t.body_json(r)) == t.column("body_bytes")[r]


def test_blocks_payload_needs_sizes(tmp_path):
    rec = RequestRecord(
        request_id="a",
        session_id="s",
        turn=0,
        start_us=0,
        kind=Kind.BLOCKS,
        params={},
        content=[1, 2],
    )
    with pytest.raises(TraceError, match="needs input_tokens and block_size"):
        write(tmp_path / "t.arrow", [rec])
    rec = RequestRecord(
        request_id="a",
        session_id="s",
        turn=0,
        start_us=0,
        kind=Kind.BLOCKS,
        params={},
        content=[1, "2"],
        block_size=4,
        input_tokens=8,
    )
    with pytest.raises(TraceError, match="block ids must be integers"):
        write(tmp_path / "u.arrow", [rec])


def test_derived_query_columns(tmp_path):
    recs = [
        chat("a", "s", 0, [{"role": "user", "content": "abcdefgh"}], max_tokens=7, stream=True),
        chat("b", "s", 1, [], max_completion_tokens=9),
    ]
    t = write(tmp_path / "t.arrow", recs)
    assert t.column("max_tokens") == [7, 9]
    assert t.column("stream") == [True, None]
    assert t.column("model") == ["m", "m"]
    # 4 framing tokens + 8 bytes / 4
    assert t.column("input_tokens") == [6, 0]


def test_flush_by_rows_writes_batches(tmp_path):
    recs, _ = growing_session(10)
    with TraceWriter(tmp_path / "t.arrow", TraceMeta(source="t"), flush_rows=3) as w:
        for r in recs:
            w.add(r)
        assert (w.rows_written, w.batches_written) == (9, 3)
    t = Trace.open(tmp_path / "t.arrow")
    assert t._batch_starts == [0, 3, 6, 9]
    assert len(t) == 10


@pytest.mark.parametrize(
    "messages",
    [["not json"], [42], [{"role": "assistant", "tool_calls": 5}]],
    ids=["string", "int", "bad-tool-calls"],
)
def test_malformed_chat_is_a_trace_error_and_the_writer_stays_usable(tmp_path, messages):
    with TraceWriter(tmp_path / "t.arrow", TraceMeta(source="test")) as w:
        w.add(chat("ok0", "s", 0, [{"role": "user", "content": "x"}]))
        with pytest.raises(TraceError, match="bad: malformed request"):
            w.add(chat("bad", "s", 1, messages))
        w.add(
            chat(
                "ok1", "s", 1, [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]
            )
        )
    t = Trace.open(tmp_path / "t.arrow")
    assert t.column("request_id") == ["ok0", "ok1"]
    assert t.body(1)["messages"][1] == {"role": "user", "content": "y"}


def test_subset_keeps_bodies_ids_and_outcomes(tmp_path):
    from replayer.trace.subset import write_subset

    a, ba = growing_session(5, "a")
    b, bb = growing_session(3, "b")
    b[1].output_text, b[1].status = "reply", 200
    t = write(tmp_path / "t.arrow", [x for pair in zip(a, b, strict=False) for x in pair] + a[3:])
    rows = [t.row_of(r) for r in ("a0", "a2", "a4", "b1")]
    n = write_subset(t, rows, tmp_path / "s.arrow", details={"why": "test"})
    s = Trace.open(tmp_path / "s.arrow")
    assert n == len(s) == 4
    assert s.column("request_id") == ["a0", "b1", "a2", "a4"]  # trace order
    for rid in ("a0", "a2", "a4", "b1"):
        assert s.body(s.row_of(rid)) == t.body(t.row_of(rid))
    assert s.outcome(s.row_of("b1"))["output_text"] == "reply"
    # a2's base (a1) is gone: it deltas on a0, the previous kept turn
    assert s.column("base")[s.row_of("a2")] == s.row_of("a0")
    assert s.provenance["source"] == "subset" and s.provenance["why"] == "test"
