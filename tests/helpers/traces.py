"""Traces made by code: records and small writers the trace tests share
(:func:`write`, :func:`growing_session`), and the trace fixtures: the
records, a current writer, and the v1 and v2 writers that make the
committed older-schema fixtures.

``python -m tests.helpers.traces`` regenerates ``tests/trace/data/``;
``test_compat`` checks that doing so gives the committed content.

``v1-mixed.arrow`` is what replayer wrote before schema v2: the same
columns, compression and dictionary deltas, ``replayer.schema_version`` 1,
and record batches without digests. It is made by writing a current trace
and downgrading it (:func:`write_v1`), not by hand. ``v2-mixed.arrow`` is
the same trace as replayer wrote before schema v3 (no ``messages`` or
``responses`` kinds existed): version 2, with the digests a v2 writer
computed over its own schema (:func:`write_v2`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace.digests import batch_metadata
from replayer.trace.schema import META_PROVENANCE, META_VERSION
from replayer.trace.synth import SynthOptions, sessions

DATA = Path(__file__).resolve().parents[1] / "trace" / "data"
V1_FIXTURE = DATA / "v1-mixed.arrow"
V2_FIXTURE = DATA / "v2-mixed.arrow"
MODEL = "moonshotai/Kimi-K3"  # the emulator's default served model
CREATED = "2026-01-01T00:00:00+00:00"


def chat(rid: str, sid: str, turn: int, messages: list[dict], start: int = 0, **params):
    body = {"model": "m", "messages": messages, **params}
    return RequestRecord.from_body(body, request_id=rid, session_id=sid, turn=turn, start_us=start)


def write(path, records, **kw):
    with TraceWriter(path, TraceMeta(source="test"), **kw) as w:
        for r in records:
            w.add(r)
    return Trace.open(path)


def growing_session(n: int, sid: str = "s") -> tuple[list[RequestRecord], list[dict]]:
    msgs: list[dict] = [{"role": "system", "content": "you are an agent"}]
    recs, bodies = [], []
    for t in range(n):
        msgs = msgs + [{"role": "user", "content": f"step {t} ü"}]
        recs.append(chat(f"{sid}{t}", sid, t, msgs, start=t * 10, max_tokens=8))
        bodies.append({"model": "m", "messages": msgs, "max_tokens": 8})
        msgs = msgs + [{"role": "assistant", "content": f"ok {t}"}]
    return recs, bodies


def _prefixed(rec: RequestRecord, prefix: str, offset_us: int) -> RequestRecord:
    return dataclasses.replace(
        rec,
        request_id=prefix + rec.request_id,
        session_id=prefix + rec.session_id,
        base_hint=prefix + rec.base_hint if rec.base_hint else None,
        start_us=rec.start_us + offset_us,
        end_us=rec.end_us + offset_us if rec.end_us is not None else None,
    )


def records() -> list[RequestRecord]:
    """Every payload kind: chat and blocks sessions, a text and a raw request."""
    common = {"turns": 3, "max_tokens": 8, "model": MODEL, "rate": 4.0, "think": 0.2}
    chat = SynthOptions(sessions=2, context=3000, seed=11, **common)
    blocks = SynthOptions(
        sessions=2, context=2000, payload="blocks", block_size=16, seed=12, **common
    )
    out = [_prefixed(r, "c", 0) for r in sessions(chat)]
    out += [_prefixed(r, "b", 1000) for r in sessions(blocks)]
    out.append(
        RequestRecord.from_body(
            {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8},
            request_id="text-0",
            session_id="text",
            turn=0,
            start_us=2000,
        )
    )
    out.append(
        RequestRecord.from_body(
            {"model": MODEL, "prompt": [101, 102, 103], "max_tokens": 4},
            request_id="raw-0",
            session_id="raw",
            turn=0,
            start_us=3000,
            path="/v1/completions",
        )
    )
    return out


def write_current(path: Path, *, form: str = "file", flush_rows: int = 3) -> Path:
    """The records as a current-version trace, ``flush_rows`` rows a batch."""
    meta = TraceMeta(source="test-fixture", created_at=CREATED)
    with TraceWriter(
        path, meta, form="file" if form == "file" else "stream", flush_rows=flush_rows
    ) as w:
        for rec in records():
            w.add(rec)
    return path


def write_old(
    src: Path,
    out: Path,
    version: int,
    mutate: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None,
) -> Path:
    """``src`` (a current trace) as the writer of schema ``version`` wrote
    it, in ``src``'s IPC form: v1 batches have no digests, v2 batches the
    digests of the v2 schema. ``mutate`` changes each batch first (tests of
    damage no digest can catch)."""
    data = pa.memory_map(str(src)).read_buffer()
    is_file = data.slice(0, 6).to_pybytes() == b"ARROW1"
    reader = ipc.open_file(data) if is_file else ipc.open_stream(data)
    meta = dict(reader.schema.metadata)
    meta[META_VERSION] = str(version).encode()
    prov = orjson.loads(meta[META_PROVENANCE])
    prov["tool_version"] = "0.1.0"
    meta[META_PROVENANCE] = orjson.dumps(prov)
    schema = reader.schema.with_metadata(meta)
    opts = ipc.IpcWriteOptions(compression=pa.Codec("zstd", 3), emit_dictionary_deltas=True)
    batches = (
        [reader.get_batch(i) for i in range(reader.num_record_batches)] if is_file else list(reader)
    )
    if version < 4:  # joins (``after``) came with v4
        k = schema.get_field_index("after")
        schema = schema.remove(k)
        batches = [b.remove_column(k) for b in batches]
    new = ipc.new_file if is_file else ipc.new_stream
    with pa.OSFile(str(out), "wb") as sink, new(sink, schema, options=opts) as w:
        for b in batches:
            b = mutate(b) if mutate else b
            if version >= 2:
                w.write_batch(b, custom_metadata=batch_metadata(b, schema))
            else:
                w.write_batch(b)  # v1 had no digests
    return out


def write_v1(
    src: Path, out: Path, mutate: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None
) -> Path:
    """The v1 writer (see :func:`write_old`)."""
    return write_old(src, out, 1, mutate)


def write_v2(
    src: Path, out: Path, mutate: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None
) -> Path:
    """The v2 writer (see :func:`write_old`)."""
    return write_old(src, out, 2, mutate)


def make_fixture(version: int, out: Path | None = None) -> Path:
    out = out or DATA / f"v{version}-mixed.arrow"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".current")
    try:
        write_old(write_current(tmp), out, version)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def make_v1_fixture(out: Path = V1_FIXTURE) -> Path:
    return make_fixture(1, out)


if __name__ == "__main__":
    for v in (1, 2):
        print(make_fixture(v))
