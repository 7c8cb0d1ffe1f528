"""Older schema versions: the committed v1 and v2 fixtures open (migrated in
memory), replay against the emulator, and convert to the current version;
the migration chain applies its steps, in order, to every batch."""

from __future__ import annotations

import contextlib
import io

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from replayer.cli import main
from replayer.errors import SchemaVersionError, TraceError
from replayer.trace import Trace, compat
from replayer.trace.compat import Migration
from replayer.trace.schema import META_COLUMN_DIGESTS, META_VERSION, TRACE_SCHEMA_VERSION
from tests.helpers.traces import (
    V1_FIXTURE,
    V2_FIXTURE,
    make_fixture,
    make_v1_fixture,
    write_current,
    write_old,
    write_v1,
)


def cli(*args: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def _stored(path):
    """Schema and batches with their custom metadata, as pyarrow reads the file."""
    r = ipc.open_file(pa.memory_map(str(path)).read_buffer())
    batches = [r.get_batch_with_custom_metadata(i) for i in range(r.num_record_batches)]
    return r.schema, [(b.batch, b.custom_metadata) for b in batches]


@pytest.mark.inprocess
def test_v1_fixture_regenerates_to_the_same_content(tmp_path):
    schema, batches = _stored(make_v1_fixture(tmp_path / "v1.arrow"))
    committed_schema, committed = _stored(V1_FIXTURE)
    assert schema.equals(committed_schema, check_metadata=True)
    assert len(batches) == len(committed) == 5
    for (b, meta), (c, cmeta) in zip(batches, committed, strict=True):
        assert b.equals(c)
        assert meta is None and cmeta is None  # v1: no digests


@pytest.mark.inprocess
def test_v1_fixture_is_the_old_shape(tmp_path):
    schema, batches = _stored(V1_FIXTURE)
    assert schema.metadata[META_VERSION] == b"1"
    assert all(meta is None for _, meta in batches)
    current = Trace.open(write_current(tmp_path / "v2.arrow"))
    # v1 -> v2 -> v3 changed no column; v4 added ``after``
    assert schema.names == [n for n in current.file_schema.names if n != "after"]


@pytest.mark.inprocess
def test_v1_opens_migrated_with_the_same_bodies(tmp_path):
    old = Trace.open(V1_FIXTURE)
    new = Trace.open(write_current(tmp_path / "v2.arrow"))
    assert (old.schema_version, new.schema_version) == (1, TRACE_SCHEMA_VERSION)
    assert old.schema.metadata[META_VERSION] == str(TRACE_SCHEMA_VERSION).encode()
    assert not old.has_digests and new.has_digests
    assert len(old) == len(new) == 14
    assert [old.body(r) for r in old.order] == [new.body(r) for r in new.order]
    assert [old.outcome(r) for r in old.order] == [new.outcome(r) for r in new.order]
    assert sorted(set(old.column("kind"))) == ["blocks", "chat", "raw", "text"]
    report = old.verify()
    assert (report.bodies, report.lengths, report.digests) == (14, 14, False)
    assert f"migrated to v{TRACE_SCHEMA_VERSION} in memory" in report.lines()[0]


@pytest.mark.inprocess
def test_v2_fixture_regenerates_with_the_digests_of_its_own_schema(tmp_path):
    schema, batches = _stored(make_fixture(2, tmp_path / "v2.arrow"))
    committed_schema, committed = _stored(V2_FIXTURE)
    assert schema.equals(committed_schema, check_metadata=True)
    assert schema.metadata[META_VERSION] == b"2"
    assert len(batches) == len(committed) == 5
    for (b, meta), (c, cmeta) in zip(batches, committed, strict=True):
        assert b.equals(c) and meta == cmeta and META_COLUMN_DIGESTS in meta


@pytest.mark.inprocess
def test_v2_opens_migrated_and_verifies_its_digests(tmp_path):
    old = Trace.open(V2_FIXTURE)
    new = Trace.open(write_current(tmp_path / "v3.arrow"))
    assert (old.schema_version, new.schema_version) == (2, TRACE_SCHEMA_VERSION)
    assert old.has_digests
    assert [old.body_json(r) for r in old.order] == [new.body_json(r) for r in new.order]
    report = old.verify()
    assert (report.bodies, report.digests) == (14, True)
    assert f"schema v2 (migrated to v{TRACE_SCHEMA_VERSION} in memory)" in report.lines()[0]


@pytest.mark.inprocess
def test_a_v1_stream_opens_too(tmp_path):
    v1 = write_v1(write_current(tmp_path / "s.arrow", form="stream"), tmp_path / "v1s.arrow")
    t = Trace.open(v1)
    assert (t.form, t.schema_version, len(t), t.torn_tail) == ("stream", 1, 14, False)
    t.verify()


@pytest.mark.inprocess
def test_convert_rewrites_v1_at_the_current_version(tmp_path):
    out = tmp_path / "v2.arrow"
    rc, _, err = cli("trace", "convert", V1_FIXTURE, "-o", out)
    assert rc == 0, err
    assert f"from schema v1 to v{TRACE_SCHEMA_VERSION}" in err
    old, new = Trace.open(V1_FIXTURE), Trace.open(out)
    assert (new.schema_version, new.form, new.has_digests) == (TRACE_SCHEMA_VERSION, "file", True)
    # same rows in the same storage order, same delta bases, same bodies
    for name in ("request_id", "session_id", "turn", "start_us", "base", "keep", "body_bytes"):
        assert new.column(name) == old.column(name), name
    assert [new.body_json(r) for r in range(len(new))] == [
        old.body_json(r) for r in range(len(old))
    ]
    assert new.provenance["source"] == "test-fixture"
    assert new.provenance["created_at"] == old.provenance["created_at"]
    (step,) = new.provenance["converted"]
    assert (step["from_schema"], step["to_schema"], step["from_tool"]) == (
        1,
        TRACE_SCHEMA_VERSION,
        "replayer 0.1.0",
    )
    _, batches = _stored(out)
    assert all(META_COLUMN_DIGESTS in meta for _, meta in batches)
    new.verify()
    # converting a current trace is a plain rewrite; outputs are never clobbered
    rc, _, err = cli("trace", "convert", out, "-o", out)
    assert rc == 2 and "already exists" in err and len(err.strip().splitlines()) == 1
    rc, _, err = cli("trace", "convert", out, "-o", tmp_path / "again.arrow", "--form", "stream")
    assert rc == 0, err
    assert Trace.open(tmp_path / "again.arrow").form == "stream"


@pytest.mark.parametrize("fixture", [V1_FIXTURE, V2_FIXTURE], ids=["v1", "v2"])
def test_old_versions_replay_against_the_emulator(emulator, tmp_path, fixture):
    rc, out, err = cli(
        "replay",
        fixture,
        "--target",
        emulator.url,
        "--timing",
        "asap",
        "--out",
        tmp_path / "run",
        "--json",
        "--quiet",
    )
    assert rc == 0, err
    summary = orjson.loads(out)
    assert summary["targets"]["target"]["status"] == {"ok": 14}
    got = {e["request_id"] for e in emulator.events("request")}
    assert got == set(Trace.open(fixture).column("request_id"))


# -- the chain ---------------------------------------------------------------


def _relabel(v):
    def step(schema):
        return schema.with_metadata({**schema.metadata, META_VERSION: str(v).encode()})

    return step


@pytest.mark.inprocess
def test_chain_runs_every_step_in_order(tmp_path):
    seen = []

    def batch(tag):
        def step(b):
            seen.append(tag)
            return b

        return step

    reg = {
        1: Migration(1, "a", _relabel(2), batch("1->2")),
        2: Migration(2, "b", _relabel(3), batch("2->3")),
    }
    steps = compat.chain(tmp_path, 1, target=3, registry=reg)
    assert [s.version for s in steps] == [1, 2]
    schema = compat.migrate_schema(pa.schema([], metadata={META_VERSION: b"1"}), steps)
    assert schema.metadata[META_VERSION] == b"3"
    compat.migrate_batch(pa.record_batch({"a": [1]}), steps)
    assert seen == ["1->2", "2->3"]
    assert compat.chain(tmp_path, 3, target=3, registry=reg) == []
    with pytest.raises(TraceError, match="v0 is not readable by this replayer"):
        compat.chain(tmp_path, 0, target=3, registry=reg)
    with pytest.raises(SchemaVersionError, match="newer replayer"):
        compat.chain(tmp_path, 4, target=3, registry=reg)


@pytest.mark.inprocess
def test_the_reader_migrates_index_and_content_batch_by_batch(monkeypatch):
    """A step that rewrites values reaches both halves of every batch, as
    each is decoded (here: the model, an index column; the recorded output,
    a content column)."""
    calls = []

    def step(b):
        calls.append(b.schema.names)
        for name, value in (("model", "migrated-model"), ("output_text", "migrated")):
            if name in b.schema.names:
                i = b.schema.get_field_index(name)
                typ = b.schema.field(i).type
                col = pa.array([value] * b.num_rows, pa.string())
                if pa.types.is_dictionary(typ):
                    col = col.dictionary_encode().cast(typ)
                b = b.set_column(i, b.schema.field(i), col)
        return b

    real = compat.MIGRATIONS[1]
    monkeypatch.setitem(compat.MIGRATIONS, 1, Migration(1, "test", real.schema, step))
    t = Trace.open(V1_FIXTURE)
    assert len(calls) == t.num_batches == 5  # the index, at open
    assert set(t.column("model")) == {"migrated-model"}
    assert {t.outcome(r)["output_text"] for r in range(len(t))} == {"migrated"}
    assert len(calls) == 10  # and each content batch, once, when first read


@pytest.mark.inprocess
def test_a_v3_trace_opens_with_no_joins(tmp_path):
    old = Trace.open(write_old(write_current(tmp_path / "v4.arrow"), tmp_path / "v3.arrow", 3))
    new = Trace.open(tmp_path / "v4.arrow")
    assert "after" not in old.file_schema.names
    assert old.schema.names == new.schema.names  # the column is where v4 has it
    assert (old.schema_version, old.has_digests) == (3, True)
    assert old.column("after") == [None] * len(old)
    assert all(old.record(r).after is None for r in range(len(old)))
    assert [old.body_json(r) for r in old.order] == [new.body_json(r) for r in new.order]
    report = old.verify()
    assert (report.bodies, report.digests) == (14, True)
