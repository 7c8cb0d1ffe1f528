"""Integrity: column digests, torn tails told from damage, ``Trace.verify``,
and the damage no digest can see (v1 traces) found by rebuilding bodies."""

from __future__ import annotations

import contextlib
import io
import logging
import struct
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayer.cli import main
from replayer.errors import TraceCorruptError, TraceError
from replayer.trace import TokenSpace, Trace, integrity
from replayer.trace.integrity import column_digest
from replayer.trace.schema import META_COLUMN_DIGESTS, META_SCHEMA_DIGEST, TRACE_SCHEMA_VERSION

from .fixtures import write_current, write_v1


def roundtrip(arr: pa.Array) -> pa.Array:
    batch = pa.record_batch({"c": arr})
    sink = pa.BufferOutputStream()
    opts = ipc.IpcWriteOptions(compression=pa.Codec("zstd", 3))
    with ipc.new_stream(sink, batch.schema, options=opts) as w:
        w.write_batch(batch)
    return ipc.open_stream(sink.getvalue()).read_next_batch().column(0)


ARRAYS = {
    "int64": pa.array([1, None, 3, 2**40], pa.int64()),
    "int32-empty": pa.array([], pa.int32()),
    "bool": pa.array([True, None, False] * 5),
    "string": pa.array(["a", None, "", "é", "x" * 100]),
    "all-null": pa.array([None] * 9, pa.string()),
    "list-string": pa.array([["x", None], None, [], ["yz"]], pa.list_(pa.string())),
    "list-int": pa.array([[1, 2], [], None, [3]], pa.list_(pa.int64())),
    "dict": pa.array(["s1", "s2", None, "s1"]).dictionary_encode(),
}


@pytest.mark.parametrize("name", ARRAYS)
def test_digests_survive_ipc_and_slicing(name):
    arr = ARRAYS[name]
    assert column_digest(roundtrip(arr)) == column_digest(arr)
    if len(arr) > 1:
        part = arr.slice(1)
        fresh = pa.array(part.to_pylist(), type=arr.type)
        assert column_digest(part) == column_digest(fresh) == column_digest(roundtrip(part))


@pytest.mark.parametrize("name", [n for n in ARRAYS if len(ARRAYS[n])])
def test_digests_see_any_change_of_value(name):
    arr = ARRAYS[name]
    values = arr.to_pylist()
    sample = {"int64": 7, "bool": True, "list-string": ["z"], "list-int": [7]}.get(name, "z")
    for other in (None, sample):
        if values[-1] != other:
            changed = values[:-1] + [other]
            assert column_digest(pa.array(changed, type=arr.type)) != column_digest(arr)


def test_digests_tell_null_from_empty():
    d = column_digest
    assert d(pa.array([""])) != d(pa.array([None], pa.string()))
    assert d(pa.array([[]], pa.list_(pa.int64()))) != d(pa.array([None], pa.list_(pa.int64())))
    assert d(pa.array(["ab", "c"])) != d(pa.array(["a", "bc"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.text(max_size=5), max_size=4)), max_size=30))
def test_digests_survive_ipc_for_any_list_of_texts(values):
    arr = pa.array(values, pa.list_(pa.string()))
    assert column_digest(roundtrip(arr)) == column_digest(arr)
    half = arr.slice(len(values) // 2)
    assert column_digest(half) == column_digest(pa.array(half.to_pylist(), arr.type))


def test_every_batch_carries_its_digests(tmp_path):
    path = write_current(tmp_path / "t.arrow")
    r = ipc.open_file(path)
    assert r.num_record_batches == 5
    for i in range(r.num_record_batches):
        got = r.get_batch_with_custom_metadata(i)
        meta = dict(got.custom_metadata)
        assert meta[META_SCHEMA_DIGEST].decode() == integrity.schema_digest(r.schema)
        want = b"".join(column_digest(c) for c in got.batch.columns)
        assert bytes.fromhex(meta[META_COLUMN_DIGESTS].decode()) == want


# -- damage and torn tails -----------------------------------------------------


def _contents(t):
    return [(t.body_json(r), t.outcome(r)) for r in range(len(t))], t.column("request_id")


@pytest.mark.parametrize("form", ["file", "stream"])
def test_every_flip_is_damage_or_changes_nothing(tmp_path, form):
    """One byte in every 89, flipped: the trace is refused with a TraceError,
    or (padding) reads exactly as before. Never another exception, never
    different content."""
    path = write_current(tmp_path / "t.arrow", form=form)
    data = path.read_bytes()
    want = _contents(Trace.open(path))
    bad = tmp_path / "bad.arrow"
    refused = 0
    for off in range(0, len(data), 89):
        d = bytearray(data)
        d[off] ^= 0x55
        bad.write_bytes(bytes(d))
        try:
            t = Trace.open(bad)
            t.verify()
        except TraceError:
            refused += 1
            continue
        assert _contents(t) == want, off
    assert refused > 0.8 * (len(data) // 89)


@pytest.mark.parametrize("form", ["file", "stream"])
def test_every_cut_is_a_torn_tail_or_refused(tmp_path, form, caplog):
    """A prefix of a trace (a killed writer, for a stream) keeps its complete
    batches; only a cut inside an IPC file's footer, or before the first
    batch's schema is complete, is refused."""
    path = write_current(tmp_path / "t.arrow", form=form)
    data = path.read_bytes()
    body = pa.py_buffer(data[8:] if form == "file" else data)
    framing = integrity.scan(body)
    footer_at = (8 + framing.end) if form == "file" else len(data)
    cut_path = tmp_path / "cut.arrow"
    caplog.set_level(logging.ERROR, logger="replayer.trace")
    for cut in range(1, len(data), 61):
        cut_path.write_bytes(data[:cut])
        try:
            t = Trace.open(cut_path)
        except TraceCorruptError as exc:
            assert form == "file" and cut > footer_at, (cut, exc)
            continue
        except TraceError as exc:
            assert "not an Arrow IPC file or stream" in str(exc), (cut, exc)
            continue
        t.verify()
        assert t.torn_tail or cut == len(data)
        assert len(t) in (0, 3, 6, 9, 12, 14)


def test_bytes_after_the_end_of_stream_are_damage(tmp_path):
    path = write_current(tmp_path / "t.arrow", form="stream")
    path.write_bytes(path.read_bytes() + b"\0" * 16)
    with pytest.raises(TraceCorruptError, match="end of stream: 16 bytes after it"):
        Trace.open(path)


def test_a_file_missing_only_its_footer_is_torn_with_every_batch(tmp_path, caplog):
    path = write_current(tmp_path / "t.arrow")
    data = path.read_bytes()
    end = integrity.scan(pa.py_buffer(data[8:])).end
    path.write_bytes(data[: 8 + end])
    with caplog.at_level(logging.WARNING, logger="replayer.trace"):
        t = Trace.open(path)
    assert t.torn_tail and len(t) == 14
    assert "incomplete tail dropped" in caplog.text
    t.verify()


def test_a_footer_that_misplaces_a_batch_is_damage(tmp_path):
    path = write_current(tmp_path / "t.arrow")
    data = bytearray(path.read_bytes())
    framing = integrity.scan(pa.py_buffer(bytes(data[8:])))
    first = next(a for m, a, _ in framing.messages if m.type == "record batch")
    at = data.rindex(struct.pack("<q", 8 + first))
    data[at] ^= 0x08
    path.write_bytes(bytes(data))
    with pytest.raises(TraceCorruptError, match="file footer: its record batch table"):
        Trace.open(path)


# -- verify --------------------------------------------------------------------


def test_verify_reads_the_selection_and_its_delta_bases_only(tmp_path):
    t = Trace.open(write_current(tmp_path / "t.arrow"))
    ids = t.column("request_id")
    last = max(
        (r for r in range(len(t)) if ids[r].startswith("c")), key=t.column("turn").__getitem__
    )
    chain = integrity.batches_of(t, [last])
    assert len(chain) > 1  # the last chat turn deltas on rows of earlier batches
    report = t.verify([last])
    assert (report.bodies, report.lengths, report.batches) == (1, 1, len(chain))
    assert report.invariants == []  # only the whole trace has invariants to check
    assert t.verify(bodies=False).batches == t.num_batches == 5
    full = t.verify()
    assert (full.bodies, full.lengths, full.digests, full.footer) == (14, 14, True, True)
    assert len(full.invariants) == 4


def test_verify_skips_lengths_under_another_token_space(tmp_path):
    t = Trace.open(write_current(tmp_path / "t.arrow"))
    t.set_token_space(TokenSpace(lo=5, hi=99))
    report = t.verify()
    assert (report.bodies, report.lengths) == (14, 0)


def _damaged_v1(tmp_path, name, row, value):
    """A v1 trace (no digests to catch it) with one index cell changed."""
    src = write_current(tmp_path / "src.arrow", form="stream")
    seen = [0]

    def mutate(b):
        start, seen[0] = seen[0], seen[0] + b.num_rows
        if not start <= row < start + b.num_rows:
            return b
        i = b.schema.get_field_index(name)
        values = b.column(i).to_pylist()
        values[row - start] = value(values[row - start]) if callable(value) else value
        typ = b.schema.field(i).type
        if pa.types.is_dictionary(typ):
            col = pa.array(values, pa.string()).dictionary_encode().cast(typ)
        else:
            col = pa.array(values, typ)
        return b.set_column(i, b.schema.field(i), col)

    return Trace.open(write_v1(src, tmp_path / "bad.arrow", mutate))


def _first(t, prefix, turn):
    ids, turns = t.column("request_id"), t.column("turn")
    return next(r for r in range(len(t)) if ids[r].startswith(prefix) and turns[r] == turn)


@pytest.mark.parametrize(
    "name,row,value,full,selected",
    [
        ("request_id", 1, "csynth-00000-t000", "request id also names row 0", None),
        ("base", 1, 9, "delta base 9 is not an earlier row", None),
        ("turn", 4, 0, "turn 0 of 'csynth-00000' starts after turn 1", None),
        ("kind", 1, "bogus", "unknown payload kind 'bogus'", "body does not rebuild (ValueError"),
        ("keep", 2, lambda k: k - 1, None, "body is "),
        ("base", 2, None, "keep 2 with base None", "delta chain broken"),
        ("body_bytes", 4, lambda n: n + 1, None, "body_bytes says"),
    ],
    ids=["dup-id", "forward-base", "turn-order", "kind", "keep", "no-base", "length"],
)
def test_damage_without_digests_is_found(tmp_path, name, row, value, full, selected):
    t = _damaged_v1(tmp_path, name, row, value)
    assert not t.has_digests
    where = f"row {row} ("
    with pytest.raises(TraceCorruptError) as exc:
        t.verify()
    assert where in str(exc.value) and (full or selected) in str(exc.value), exc.value
    if selected is not None:
        with pytest.raises(TraceCorruptError, match=f"row {row} .*{selected[:12]}"):
            t.verify([row])


def test_a_damaged_message_text_is_not_json(tmp_path):
    src = write_current(tmp_path / "src.arrow", form="stream")

    def mutate(b):
        i = b.schema.get_field_index("messages")
        cells = b.column(i).to_pylist()
        if b.num_rows and cells[0]:
            cells[0] = [m.replace('"role"', '"role', 1) for m in cells[0]]
        return b.set_column(i, b.schema.field(i), pa.array(cells, b.schema.field(i).type))

    t = Trace.open(write_v1(src, tmp_path / "bad.arrow", mutate))
    with pytest.raises(TraceCorruptError, match=r"row 0 \(csynth-00000-t000\): body is not JSON"):
        t.verify([0])


def test_reading_a_damaged_row_raises_one_trace_error(tmp_path):
    t = _damaged_v1(tmp_path, "kind", 1, "bogus")
    with pytest.raises(
        TraceCorruptError, match=r"row 1 \(csynth-00001-t000\): body does not rebuild"
    ):
        t.body(1)
    with pytest.raises(IndexError):  # a caller's bad row is not damage
        t.body(len(t))


# -- inspect --verify ----------------------------------------------------------


def _cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def test_inspect_verify_says_what_it_checked(tmp_path):
    path = write_current(tmp_path / "t.arrow")
    rc, out, err = _cli("inspect", path, "--verify")
    assert rc == 0, err
    tail = out[out.index(f"{path}: OK, schema v{TRACE_SCHEMA_VERSION}") :]
    assert "every column matches its digest" in tail
    assert "14 rebuilt along their delta chains; 14 of exactly body_bytes" in tail
    assert "14 request ids unique" in tail
    rc, out, _ = _cli("inspect", path, "--verify", "--json")
    assert rc == 0 and orjson.loads(out)["verify"][0].endswith(
        f"OK, schema v{TRACE_SCHEMA_VERSION}"
    )
    rc, out, _ = _cli("inspect", path)
    assert rc == 0 and "OK, schema" not in out


def _bad_offsets(values: pa.Array, offsets: list[int]) -> pa.Array:
    """A list or string array whose offsets point past its data (what a
    flipped offset byte decodes to): valid in structure, not in values."""
    offs = pa.py_buffer(struct.pack(f"<{len(offsets)}i", *offsets))
    if pa.types.is_string(values.type):
        data = values.buffers()[2]
        return pa.Array.from_buffers(pa.string(), len(offsets) - 1, [None, offs, data])
    return pa.Array.from_buffers(
        pa.list_(values.type), len(offsets) - 1, [None, offs], children=[values]
    )


@pytest.mark.parametrize(
    "arr",
    [
        pytest.param(lambda: _bad_offsets(pa.array(["abc"]), [0, 900, 3]), id="string-past-end"),
        pytest.param(lambda: _bad_offsets(pa.array(["abc"]), [0, -5, 3]), id="string-negative"),
        pytest.param(lambda: _bad_offsets(pa.array(["a", "b"]), [0, 7, 2]), id="list-past-end"),
        pytest.param(lambda: _bad_offsets(pa.array(["a", "b"]), [0, -1, 2]), id="list-negative"),
    ],
)
def test_a_column_with_bad_offsets_is_corrupt_not_a_crash(arr):
    # content batches with digests are validated for structure only (first
    # and last offsets): the digest check must refuse what the full pass would
    a = arr()
    a.validate()  # structure passes: only the full pass would catch it
    with pytest.raises(pa.ArrowInvalid):
        a.validate(full=True)
    batch = pa.RecordBatch.from_arrays([a], names=["messages"])
    digests = integrity.Stored("x", (b"\0" * integrity.DIGEST_BYTES,))
    with pytest.raises(TraceCorruptError, match=r"t\.arrow: corrupt trace: batch 0: column "):
        integrity.check_columns(Path("t.arrow"), "batch 0", batch, [0], digests)
