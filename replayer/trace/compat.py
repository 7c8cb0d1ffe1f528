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
