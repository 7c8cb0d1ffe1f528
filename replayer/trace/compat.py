"""Migrations between trace schema versions (mitmproxy's ``io/compat.py``).

``TRACE_SCHEMA_VERSION`` is bumped by one for every change to the format, and
each bump adds a step ``k -> k+1`` to :data:`MIGRATIONS`. The reader applies
the chain on open, in memory and batch by batch (a schema step to the
schema, a batch step to each batch as it is decoded), so an old trace of any
size reads as a current one; :func:`convert` rewrites it at the current
version (``replayer trace convert``). A batch step gets the index or the
content columns of a batch, never both: the reader decodes them apart.

History:

- v1 -> v2: record batches carry column and schema digests
  (:mod:`replayer.trace.integrity`). v1 batches have none; the columns are
  the same, so the step only relabels the schema. Digests of a v1 trace
  come only from rewriting it.
- v2 -> v3: payload kinds ``messages`` (Anthropic Messages) and
  ``responses`` (OpenAI Responses). No v2 row has them, so the step only
  relabels the schema; a v2 reader meeting a v3 trace says to upgrade
  instead of misreading a kind it does not know.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from replayer.errors import SchemaVersionError, TraceError
from replayer.trace.schema import META_VERSION, TRACE_SCHEMA_VERSION

if TYPE_CHECKING:
    from replayer.trace.reader import Trace


@dataclass(frozen=True, slots=True)
class Migration:
    """One step from ``version`` to ``version + 1``."""

    version: int
    summary: str
    schema: Callable[[pa.Schema], pa.Schema]
    batch: Callable[[pa.RecordBatch], pa.RecordBatch]


def _relabel(version: int) -> Callable[[pa.Schema], pa.Schema]:
    def step(schema: pa.Schema) -> pa.Schema:
        meta = dict(schema.metadata or {})
        meta[META_VERSION] = str(version).encode()
        return schema.with_metadata(meta)

    return step


def _same(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


MIGRATIONS: dict[int, Migration] = {
    1: Migration(1, "batches gain column digests (none to check in v1)", _relabel(2), _same),
    2: Migration(2, "payload kinds messages and responses (none in v2)", _relabel(3), _same),
}

FIRST_VERSION = 1


def chain(
    path: Path,
    version: int,
    *,
    target: int = TRACE_SCHEMA_VERSION,
    registry: Mapping[int, Migration] = MIGRATIONS,
) -> list[Migration]:
    """The steps from ``version`` to ``target`` (empty when current)."""
    if version > target:
        raise SchemaVersionError(
            f"{path}: written by a newer replayer (trace schema v{version}; this replayer "
            f"reads up to v{target}); upgrade replayer to read it"
        )
    steps = []
    for v in range(version, target):
        step = registry.get(v)
        if step is None:
            raise TraceError(
                f"{path}: trace schema v{version} is not readable by this replayer "
                f"(no migration from v{v})"
            )
        steps.append(step)
    return steps


def migrate_schema(schema: pa.Schema, steps: list[Migration]) -> pa.Schema:
    for step in steps:
        schema = step.schema(schema)
    return schema


def migrate_batch(batch: pa.RecordBatch, steps: list[Migration]) -> pa.RecordBatch:
    for step in steps:
        batch = step.batch(batch)
    return batch


def convert(
    trace: Trace, out: str | os.PathLike[str], *, form: str | None = None
) -> tuple[int, int]:
    """Rewrite ``trace`` at the current version: same rows in the same storage
    order (row numbers hold), same bodies, ids, timing, outcomes and delta
    bases, fresh digests; provenance kept, with a ``converted`` record.
    Returns (rows, batches) written."""
    from replayer import __version__
    from replayer.trace.model import TraceMeta
    from replayer.trace.writer import TraceWriter

    prov: dict[str, Any] = dict(trace.provenance)
    source = str(prov.pop("source", "unknown"))
    created = str(prov.pop("created_at", ""))
    tool, tool_version = prov.pop("tool", None), prov.pop("tool_version", None)
    history = list(prov.pop("converted", []))
    history.append(
        {
            "from_schema": trace.schema_version,
            "to_schema": TRACE_SCHEMA_VERSION,
            "from_tool": f"{tool} {tool_version}" if tool else None,
            "by": f"replayer {__version__}",
        }
    )
    meta = TraceMeta(
        source=source,
        details={**prov, "converted": history},
        tokens=trace.recorded_tokens,
        created_at=created,
    )
    ids = trace.column("request_id")
    base = trace.column("base")
    rows = range(len(trace))
    as_file = (form or trace.form) == "file"
    with TraceWriter(out, meta, form="file" if as_file else "stream") as w:
        for row, content in trace.iter_content(rows):
            rec = trace.record(row, content)
            b = base[row]
            rec.base_hint = ids[b] if b is not None else None
            w.add(rec)
    return w.rows, w.batches_written
