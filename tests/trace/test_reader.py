"""Reading traces: both IPC forms, torn tails, bad input, lazy reconstruction."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayer.errors import SchemaVersionError, TraceError
from replayer.trace import RequestRecord, TokenSpace, Trace, TraceMeta, TraceWriter
from replayer.trace.schema import META_VERSION, TRACE_SCHEMA_VERSION
from tests.helpers.traces import growing_session, write

SAMPLES = Path(__file__).resolve().parents[2] / "traces"


@pytest.mark.inprocess
@pytest.mark.parametrize("form", ["stream", "file"])
def test_both_forms_read_back(tmp_path, form):
    recs, bodies = growing_session(5)
    t = write(tmp_path / "t.arrow", recs, form=form, flush_rows=2)
    assert t.form == form
    assert not t.torn_tail
    assert [t.body(r) for r in range(5)] == bodies
    magic = (tmp_path / "t.arrow").read_bytes()[:6]
    assert (magic == b"ARROW1") == (form == "file")


@pytest.mark.inprocess
def test_trace_order_is_start_time_then_row(tmp_path):
    recs = [
        RequestRecord.from_body({"prompt": p}, request_id=p, session_id=p, turn=0, start_us=s)
        for p, s in [("a", 30), ("b", 10), ("c", 30), ("d", 0), ("e", 10)]
    ]
    t = write(tmp_path / "t.arrow", recs)
    assert [t.column("request_id")[r] for r in t.order] == ["d", "b", "e", "a", "c"]


@pytest.mark.inprocess
def test_iter_json_matches_random_access_in_any_order(tmp_path):
    a, _ = growing_session(6, "a")
    b, _ = growing_session(6, "b")
    t = write(tmp_path / "t.arrow", [x for p in zip(a, b, strict=True) for x in p], flush_rows=4)
    expected = {r: t.body_json(r) for r in range(len(t))}
    for rows in (None, [11, 3, 7, 1], [0, 2, 4, 6, 8, 10], list(range(11, -1, -1))):
        got = list(t.iter_json(rows))
        assert [r for r, _ in got] == (t.order if rows is None else rows)
        assert all(body == expected[r] for r, body in got)


@pytest.mark.inprocess
def test_iter_json_applies_a_patch(tmp_path):
    recs, _ = growing_session(2)
    t = write(tmp_path / "t.arrow", recs)
    (_, body), _ = t.iter_json(patch={"model": "other", "max_tokens": None, "stream": True})
    assert orjson.loads(body) == {
        "model": "other",
        "messages": t.body(0)["messages"],
        "stream": True,
    }


@pytest.mark.inprocess
def test_opening_reads_only_the_index(tmp_path):
    recs, _ = growing_session(3)
    t = write(tmp_path / "t.arrow", recs)
    assert "messages" not in t.index.column_names
    assert "params" not in t.index.column_names
    assert t._batches == {}  # nothing decoded until a body is asked for
    t.body(2)
    assert list(t._batches) == [0]


@pytest.mark.inprocess
def test_a_configured_sibling_shares_the_file_and_keeps_its_own_settings():
    """What a replay builds through: its own token space and caches over the
    caller's data (the same objects, no copy); the caller's trace keeps its
    settings, caches and bodies."""
    t = Trace.open(SAMPLES / "blocks-16x12.arrow")
    recorded = dict(t.iter_json())
    t.body(0)  # batch 0 decoded and kept by t
    stats = dict(t._prompts.stats)
    space = TokenSpace(lo=3, hi=1000, salt=t.tokens.salt)
    s = t.configured(tokens=space, body_cache_bytes=4_000)
    assert (s.tokens, s.body_cache_bytes) == (space, 4_000)
    assert s.recorded_tokens == t.recorded_tokens == t.tokens == TokenSpace()
    assert t.body_cache_bytes == 512 << 20
    assert s.index is t.index and s._messages is t._messages and s._preludes is t._preludes
    assert s.column("request_id") is t.column("request_id") and s.order is t.order
    assert s._batches[0] is t._batches[0] and s._batches is not t._batches
    assert s._prompts is not t._prompts
    built = dict(s.iter_json())
    kinds = t.column("kind")
    assert all(built[r] != recorded[r] for r in range(len(t)) if kinds[r] == "blocks")
    assert t._prompts.stats == stats  # nothing the sibling built went into t's cache
    assert dict(t.iter_json()) == recorded
    same = t.configured()
    assert (same.tokens, same.body_cache_bytes) == (t.tokens, t.body_cache_bytes)
    assert dict(same.iter_json()) == recorded


# -- bad input ---------------------------------------------------------------


@pytest.mark.inprocess
def test_missing_empty_and_directory(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        Trace.open(tmp_path / "nope.arrow")
    (tmp_path / "empty.arrow").write_bytes(b"")
    with pytest.raises(TraceError, match="empty file"):
        Trace.open(tmp_path / "empty.arrow")
    with pytest.raises(TraceError, match="is a directory"):
        Trace.open(tmp_path)


@pytest.mark.inprocess
def test_not_arrow(tmp_path):
    p = tmp_path / "x.arrow"
    p.write_text('{"timestamp": 0, "hash_ids": [1]}\n')
    with pytest.raises(TraceError, match="not an Arrow IPC file or stream"):
        Trace.open(p)


@pytest.mark.inprocess
def test_arrow_but_not_a_trace(tmp_path):
    p = tmp_path / "x.arrow"
    table = pa.table({"a": [1, 2]})
    with pa.OSFile(str(p), "wb") as f, ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    with pytest.raises(TraceError, match="not a replayer trace"):
        Trace.open(p)


def _rewrite_with(tmp_path, mutate_schema):
    recs, _ = growing_session(2)
    write(tmp_path / "t.arrow", recs)
    with pa.OSFile(str(tmp_path / "t.arrow")) as f:
        table = ipc.open_stream(f).read_all()
    table = mutate_schema(table)
    p = tmp_path / "x.arrow"
    with pa.OSFile(str(p), "wb") as f, ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    return p


@pytest.mark.inprocess
def test_wrong_schema(tmp_path):
    p = _rewrite_with(tmp_path, lambda t: t.drop_columns(["turn"]))
    with pytest.raises(TraceError, match="column 'turn' is missing"):
        Trace.open(p)
    p = _rewrite_with(
        tmp_path,
        lambda t: t.set_column(
            t.schema.get_field_index("turn"), "turn", t.column("turn").cast(pa.int64())
        ),
    )
    with pytest.raises(TraceError, match="column 'turn' is int64, expected int32"):
        Trace.open(p)


@pytest.mark.inprocess
def test_newer_schema_version_is_refused(tmp_path):
    def bump(t):
        meta = dict(t.schema.metadata)
        meta[META_VERSION] = str(TRACE_SCHEMA_VERSION + 1).encode()
        return t.replace_schema_metadata(meta)

    p = _rewrite_with(tmp_path, bump)
    newer, current = TRACE_SCHEMA_VERSION + 1, TRACE_SCHEMA_VERSION
    with pytest.raises(
        SchemaVersionError, match=rf"newer replayer \(trace schema v{newer}; .* up to v{current}\)"
    ):
        Trace.open(p)


@pytest.mark.inprocess
@pytest.mark.parametrize("form", ["stream", "file"])
def test_truncated_file_keeps_complete_batches(tmp_path, form, caplog):
    recs, bodies = growing_session(9)
    p = tmp_path / "t.arrow"
    write(p, recs, form=form, flush_rows=3)
    data = p.read_bytes()
    whole = Trace.open(p)
    # cut inside the third batch's message
    k = 2
    cut = _batch_offsets(data, form)[k] + 40
    p.write_bytes(data[:cut])
    with caplog.at_level(logging.WARNING, logger="replayer.trace"):
        t = Trace.open(p)
    assert t.torn_tail
    assert len(t) == 6
    assert [t.body(r) for r in range(6)] == bodies[:6] == [whole.body(r) for r in range(6)]
    assert "incomplete tail dropped" in caplog.text


def _batch_offsets(data: bytes, form: str) -> list[int]:
    start = 8 if form == "file" else 0
    reader = pa.BufferReader(pa.py_buffer(data[start:]))
    mr = ipc.MessageReader.open_stream(reader)
    offs = []
    while True:
        pos = reader.tell()
        try:
            m = mr.read_next_message()
        except StopIteration:
            break
        if m.type == "record batch":
            offs.append(start + pos)
    return offs


_KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from replayer.trace import RequestRecord, TraceMeta, TraceWriter
    w = TraceWriter(sys.argv[1], TraceMeta(source="kill-test"), flush_rows=10)
    msgs = []
    for i in range(100_000):
        msgs = msgs[-40:] + [{"role": "user", "content": f"message {i} " + "x" * 2000}]
        w.add(RequestRecord.from_body({"model": "m", "messages": msgs}, request_id=f"r{i}",
                                      session_id="s", turn=i, start_us=i))
        if w.rows_written and i % 10 == 9:
            print(w.rows_written, flush=True)
    """
)


def test_sigkill_during_streaming_write_leaves_a_readable_file(tmp_path):
    p = tmp_path / "killed.arrow"
    flushed = 0
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(p)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as proc:
        try:
            assert proc.stdout is not None
            for _ in range(10_000):  # bounded: the writer reports every flush
                line = proc.stdout.readline()
                if not line:
                    break
                flushed = int(line)
                if flushed >= 200:
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert flushed >= 200
    t = Trace.open(p)
    assert len(t) >= flushed
    assert t.column("request_id")[: len(t)] == [f"r{i}" for i in range(len(t))]
    last = len(t) - 1
    body = t.body(last)
    assert body["messages"][-1]["content"].startswith(f"message {last} ")
    assert len(body["messages"]) == min(last + 1, 41)


# -- reconstruction, property-based -------------------------------------------

_msg = st.builds(
    lambda role, text: {"role": role, "content": text},
    st.sampled_from(["user", "assistant", "tool"]),
    st.text(max_size=12),
)
# A session is a sequence of edits to the previous context: append messages,
# or truncate to a prefix and append (compaction, retries).
_edit = st.tuples(st.integers(min_value=0, max_value=30), st.lists(_msg, max_size=4))


@pytest.mark.inprocess
@settings(max_examples=60, deadline=None)
@given(
    sessions=st.lists(st.lists(_edit, min_size=1, max_size=8), min_size=1, max_size=3),
    flush_rows=st.integers(min_value=1, max_value=5),
    cache_bytes=st.sampled_from([1, 200, 1 << 20]),
)
def test_reconstruction_equals_naive_bodies(tmp_path_factory, sessions, flush_rows, cache_bytes):
    path = tmp_path_factory.mktemp("prop") / "t.arrow"
    expected: list[dict] = []
    recs: list[RequestRecord] = []
    states = [[] for _ in sessions]
    # interleave sessions turn by turn, like concurrent agents
    for turn in range(max(len(s) for s in sessions)):
        for si, s in enumerate(sessions):
            if turn >= len(s):
                continue
            cut, new = s[turn]
            states[si] = states[si][: min(cut, len(states[si]))] + new
            body = {"model": "m", "messages": list(states[si]), "n": turn % 2}
            expected.append(body)
            recs.append(
                RequestRecord.from_body(
                    body, request_id=f"{si}-{turn}", session_id=str(si), turn=turn, start_us=turn
                )
            )
    with TraceWriter(
        path, TraceMeta(source="prop"), flush_rows=flush_rows, cache_bytes=cache_bytes
    ) as w:
        for r in recs:
            w.add(r)
    t = Trace.open(path)
    assert [t.body(r) for r in range(len(t))] == expected
    assert dict(t.iter_json(range(len(t)))) == {r: orjson.dumps(b) for r, b in enumerate(expected)}
    assert t.column("body_bytes") == [len(orjson.dumps(b)) for b in expected]
