"""Migrations between trace schema versions (mitmproxy's ``io/compat.py``).

``TRACE_SCHEMA_VERSION`` is bumped by one for every change to the format, and
each bump adds a step ``k -> k+1`` to :data:`MIGRATIONS`. The reader applies
the chain on open, in memory and batch by batch (a schema step to the
schema, a batch step to each batch as it is decoded), so an old trace of any
size reads as a current one; :func:`replayer.trace.convert.convert`
rewrites it at the current version (``replayer trace convert``). A batch
step gets the index or the content columns of a batch, never both: the
reader decodes them apart. Below the reader, this module knows schemas and
batches only.

History:

- v1 -> v2: record batches carry column and schema digests
  (:mod:`replayer.trace.digests`). v1 batches have none; the columns are
  the same, so the step only relabels the schema. Digests of a v1 trace
  come only from rewriting it.
- v2 -> v3: payload kinds ``messages`` (Anthropic Messages) and
  ``responses`` (OpenAI Responses). No v2 row has them, so the step only
  relabels the schema; a v2 reader meeting a v3 trace says to upgrade
  instead of misreading a kind it does not know.
- v3 -> v4: the ``after`` column (joins between requests, see
  :data:`replayer.trace.schema.FIELDS`), placed after ``end_us``. A v3 trace
  has no joins: the step adds the column, all null, to the schema and to
  each index batch (content batches do not hold it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from replayer.errors import SchemaVersionError, TraceError
from replayer.trace.schema import META_VERSION, TRACE_SCHEMA_VERSION


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


_AFTER = pa.field("after", pa.list_(pa.string()), nullable=True)


def _add_after(schema: pa.Schema) -> pa.Schema:
    schema = _relabel(4)(schema)
    return schema.insert(schema.get_field_index("end_us") + 1, _AFTER)


def _after_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """An index batch (it holds ``end_us``) gains an all-null ``after``."""
    k = batch.schema.get_field_index("end_us")
    if k < 0 or "after" in batch.schema.names:
        return batch
    return batch.add_column(k + 1, _AFTER, pa.nulls(batch.num_rows, _AFTER.type))


MIGRATIONS: dict[int, Migration] = {
    1: Migration(1, "batches gain column digests (none to check in v1)", _relabel(2), _same),
    2: Migration(2, "payload kinds messages and responses (none in v2)", _relabel(3), _same),
    3: Migration(3, "joins between requests (none in v3)", _add_after, _after_batch),
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
