"""Verification (``Trace.verify``): the selection and its delta bases read,
and the damage no digest can see (v1 traces) found by rebuilding bodies."""

from __future__ import annotations

import contextlib
import io
import re

import orjson
import pyarrow as pa
import pytest

from replayer.cli import main
from replayer.errors import TraceCorruptError
from replayer.trace import TokenSpace, Trace
from replayer.trace.schema import TRACE_SCHEMA_VERSION
from replayer.trace.verify import batches_of
from tests.helpers.traces import write_current, write_v1

pytestmark = pytest.mark.inprocess


def test_verify_reads_the_selection_and_its_delta_bases_only(tmp_path):
    t = Trace.open(write_current(tmp_path / "t.arrow"))
    ids = t.column("request_id")
    last = max(
        (r for r in range(len(t)) if ids[r].startswith("c")), key=t.column("turn").__getitem__
    )
    chain = batches_of(t, [last])
    assert len(chain) > 1  # the last chat turn deltas on rows of earlier batches
    report = t.verify([last])
    assert (report.bodies, report.lengths, report.batches) == (1, 1, len(chain))
    # a selection still checks the whole index: a repeated or moved batch shows only there
    assert len(report.invariants) == 4
    assert t.verify(bodies=False).batches == t.num_batches == 5
    full = t.verify()
    assert (full.bodies, full.lengths, full.digests, full.footer) == (14, 14, True, True)
    assert len(full.invariants) == 4


def test_verify_skips_lengths_under_another_token_space(tmp_path):
    t = Trace.open(write_current(tmp_path / "t.arrow")).configured(tokens=TokenSpace(lo=5, hi=99))
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
    # a selection is checked against the whole index first, then its bodies
    with pytest.raises(
        TraceCorruptError, match=f"row {row} .*{re.escape((full or selected)[:12])}"
    ):
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
