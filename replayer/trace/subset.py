"""Writing part of a trace as a trace of its own (bundles, bisect trials).

Rows keep their request ids, sessions, turns, timing, bodies and recorded
outcomes; the delta encoding is redone against what remains (a kept turn
whose base was dropped deltas on the previous kept turn, or stands alone),
so the subset is as compact as any trace and reconstructs the same bodies.
A join (``after``) on a request the subset drops is dropped with it: a
candidate without a sub-agent replays its parent's turns without waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from replayer.trace.model import RequestRecord, TraceMeta
from replayer.trace.reader import Trace
from replayer.trace.writer import TraceWriter


def write_subset(
    trace: Trace,
    rows: Iterable[int],
    out: Path,
    *,
    details: dict[str, Any] | None = None,
    edit: Callable[[RequestRecord], RequestRecord] | None = None,
) -> int:
    """Write ``rows`` (kept in trace order) to ``out``; returns the count.

    ``edit`` rewrites each record on the way (the bisect's shrink stage)."""
    keep = set(rows)
    plan = [r for r in trace.order if r in keep]
    ids = trace.column("request_id")
    kept_ids = {ids[r] for r in plan}
    meta = TraceMeta(
        source="subset",
        details={
            "parent": {"path": str(trace.path), "provenance": trace.provenance},
            **(details or {}),
        },
        tokens=trace.tokens,
    )
    with TraceWriter(out, meta, form="file") as w:
        for row, content in trace.iter_content(plan):
            rec = trace.record(row, content)
            if rec.after:
                rec.after = [a for a in rec.after if a in kept_ids] or None
            w.add(edit(rec) if edit is not None else rec)
        return w.rows
