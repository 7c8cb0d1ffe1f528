"""Column digests: over values (whatever the IPC bytes), every change of
value seen, stored with every batch, and a damaged column refused."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayer.errors import TraceCorruptError
from replayer.trace.digests import (
    DIGEST_BYTES,
    Stored,
    check_columns,
    check_start,
    column_digest,
    schema_digest,
)
from replayer.trace.reader import Trace
from replayer.trace.schema import META_BATCH_START, META_COLUMN_DIGESTS, META_SCHEMA_DIGEST
from tests.helpers.traces import write_current

pytestmark = pytest.mark.inprocess


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
        assert meta[META_SCHEMA_DIGEST].decode() == schema_digest(r.schema)
        want = b"".join(column_digest(c) for c in got.batch.columns)
        assert bytes.fromhex(meta[META_COLUMN_DIGESTS].decode()) == want


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
    digests = Stored("x", (b"\0" * DIGEST_BYTES,))
    with pytest.raises(TraceCorruptError, match=r"t\.arrow: corrupt trace: batch 0: column "):
        check_columns(Path("t.arrow"), "batch 0", batch, [0], digests)


def test_every_batch_says_the_row_it_starts_at(tmp_path):
    path = write_current(tmp_path / "t.arrow")
    r = ipc.open_file(path)
    start = 0
    for i in range(r.num_record_batches):
        got = r.get_batch_with_custom_metadata(i)
        assert dict(got.custom_metadata)[META_BATCH_START] == str(start).encode()
        start += got.batch.num_rows


def test_a_batch_gone_from_the_middle_of_a_stream_is_seen(tmp_path):
    """Each batch still matches its own digests and the stream ends
    properly: only the start row the writer stored tells that one is gone."""
    path = write_current(tmp_path / "t.arrow", form="stream")
    src = ipc.open_stream(path)
    batches = []
    while True:
        try:
            batches.append(src.read_next_batch_with_custom_metadata())
        except StopIteration:
            break
    assert len(batches) >= 3
    cut = tmp_path / "cut.arrow"
    with pa.OSFile(str(cut), "wb") as sink, ipc.new_stream(sink, src.schema) as w:
        for k, b in enumerate(batches):
            if k != 1:
                w.write_batch(b.batch, custom_metadata=b.custom_metadata)
    n0, n1 = batches[0].batch.num_rows, batches[1].batch.num_rows
    want = rf"was written at row {n0 + n1} but is read at row {n0} "
    with pytest.raises(TraceCorruptError, match=want):
        Trace.open(cut)


def test_a_batch_without_a_start_row_is_read_as_before(tmp_path):
    """Traces written before batches said where they start read unchanged."""
    check_start(tmp_path / "t.arrow", "batch 3", pa.KeyValueMetadata({b"x": b"1"}), 9)
    with pytest.raises(TraceCorruptError, match="start row is unreadable"):
        meta = pa.KeyValueMetadata({META_BATCH_START: b"nine"})
        check_start(tmp_path / "t.arrow", "batch 3", meta, 9)
