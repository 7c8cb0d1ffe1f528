"""``replayer trace convert``: a trace rewritten at the current schema version.

The reader migrates an old trace in memory (:mod:`replayer.trace.compat`);
this writes the migrated rows out through the writer, so the file itself is
current (and, from v2 on, carries digests). It reads with the reader and
writes with the writer, above both.
"""

from __future__ import annotations

import os
from typing import Any

from replayer._version import __version__
from replayer.trace.model import TraceMeta
from replayer.trace.reader import Trace
from replayer.trace.schema import TRACE_SCHEMA_VERSION
from replayer.trace.writer import TraceWriter


def convert(
    trace: Trace, out: str | os.PathLike[str], *, form: str | None = None
) -> tuple[int, int]:
    """Rewrite ``trace`` at the current version: same rows in the same storage
    order (row numbers hold), same bodies, ids, timing, outcomes and delta
    bases, fresh digests; provenance kept, with a ``converted`` record.
    Returns (rows, batches) written."""
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
