"""Reading an Arrow IPC stream that a run appends to: every whole batch, and
a torn last batch (a killed run) dropped, never an error."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from replayer._arrow import read_stream

pytestmark = pytest.mark.inprocess

SCHEMA = pa.schema([("i", pa.int64()), ("s", pa.string())])


def write(path, *batches):
    with pa.OSFile(str(path), "wb") as sink, ipc.new_stream(sink, SCHEMA) as w:
        for rows in batches:
            cols = [pa.array([r[0] for r in rows]), pa.array([r[1] for r in rows])]
            w.write_batch(pa.record_batch(cols, schema=SCHEMA))
    return path


def test_every_batch_in_order(tmp_path):
    p = write(tmp_path / "r.arrow", [(1, "a"), (2, "b")], [(3, "c")])
    table = read_stream(p)
    assert table.schema == SCHEMA
    assert table.to_pydict() == {"i": [1, 2, 3], "s": ["a", "b", "c"]}


def test_a_torn_last_batch_is_dropped(tmp_path):
    whole = write(tmp_path / "whole.arrow", [(1, "a")], [(2, "b")]).read_bytes()
    one = write(tmp_path / "one.arrow", [(1, "a")]).read_bytes()
    # the stream as a killed writer left it: the first batch whole, the
    # second cut in the middle of its body (no end-of-stream marker)
    body_end = len(one) - 8  # ``one`` ends with the 8-byte end-of-stream marker
    torn = tmp_path / "torn.arrow"
    torn.write_bytes(whole[: body_end + (len(whole) - 8 - body_end) // 2])
    assert read_stream(torn).to_pydict() == {"i": [1], "s": ["a"]}


def test_a_stream_with_no_batch_is_an_empty_table(tmp_path):
    p = write(tmp_path / "empty.arrow")
    table = read_stream(p)
    assert (table.num_rows, table.schema) == (0, SCHEMA)


@pytest.mark.parametrize("cut", [0, 5])
def test_a_file_killed_before_its_schema_is_an_empty_table(tmp_path, cut):
    """A run killed before its first whole message (an empty file, or a
    schema message cut short) leaves nothing to read, and that is no error."""
    whole = write(tmp_path / "whole.arrow").read_bytes()
    p = tmp_path / "cut.arrow"
    p.write_bytes(whole[:cut])
    table = read_stream(p)
    assert (table.num_rows, table.num_columns) == (0, 0)
