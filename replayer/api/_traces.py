"""Traces: ``inspect``, ``export``, ``synth``, ``import_trace``, ``merge``,
``convert``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer._files import atomic_output
from replayer.api._common import Say, TraceLike
from replayer.api._results import Written
from replayer.errors import OptionError, UsageError
from replayer.options import (
    Selection,
    SynthOptions,
)
from replayer.session import open_trace

if TYPE_CHECKING:
    pass


def inspect(
    trace: TraceLike,
    *,
    selection: Selection | None = None,
    verify: bool = False,
    prefix_cache: int | None = None,
) -> dict[str, Any]:
    """Sessions, turns, context lengths, duration and sizes of a trace (every
    batch checked against its digests first; ``verify`` also rebuilds every
    body). ``prefix_cache``: the ideal hit ratio for that KV block size."""
    from replayer.replay.plan import select
    from replayer.trace.stats import inspect_trace, prefix_cache_figures

    if prefix_cache is not None and prefix_cache < 1:
        raise OptionError("prefix_cache", "wants a block size >= 1")
    t = open_trace(trace)
    checked = t.verify(bodies=verify)
    rows = None
    sel = selection or Selection()
    if not sel.everything:
        rows = select(t, limit=sel.limit, sessions=sel.sessions, requests=sel.requests)
    info = inspect_trace(t, rows)
    if prefix_cache is not None:
        info["prefix_cache"] = prefix_cache_figures(t, prefix_cache, rows)
    if verify:
        info["verify"] = checked.lines()
    return info


def export(
    trace: TraceLike,
    output: str | os.PathLike[str],
    *,
    format: str = "jsonl",
    selection: Selection | None = None,
    force: bool = False,
) -> Written:
    """Every request (or the selection), full body, in trace order, as
    ``jsonl`` (replayer rows), ``aiperf`` (mooncake_trace rows) or
    ``aiperf-inputs`` (an AIPerf inputs.json)."""
    from replayer.replay.plan import select
    from replayer.trace.export import export_path
    from replayer.trace.verify import check_invariants

    t = open_trace(trace)
    check_invariants(t)  # batches are matched and bodies sized as they are written
    sel = selection or Selection()
    rows = select(t, limit=sel.limit, sessions=sel.sessions, requests=sel.requests)
    if not rows and not sel.everything:
        raise UsageError("the selection is empty: nothing to export")
    with atomic_output(output, force=force) as tmp:
        n, skipped = export_path(t, tmp, format, rows)
    return Written(Path(output), n, {"skipped": list(skipped)})


def synth(
    output: str | os.PathLike[str], options: SynthOptions | None = None, *, force: bool = False
) -> Written:
    """Synthesize agent sessions into a trace (a pure function of the options' seed)."""
    from replayer.trace import synth as _synth

    o = options or SynthOptions()
    with atomic_output(output, force=force) as tmp:
        n = _synth.write_trace(tmp, o)
    return Written(Path(output), n, {"roomy": o.roomy()})


def import_trace(
    format: str,
    sources: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    options: Any = None,
    force: bool = False,
    say: Say | None = None,
) -> Written:
    """Convert source files of a public trace format into one replayer trace.
    ``options`` are the importer's own (an ``argparse.Namespace`` or mapping
    of its flags' values)."""
    import argparse
    import time

    from replayer.trace.importers import IMPORTERS, details, load
    from replayer.trace.model import TraceMeta
    from replayer.trace.writer import TraceWriter

    if format not in IMPORTERS:
        raise OptionError("format", f"{format!r}: want one of {', '.join(IMPORTERS)}")
    mod = load(format)
    srcs = [Path(s) for s in sources]
    for src in srcs:
        if not src.exists():
            raise UsageError(f"{src}: no such file or directory")
    opts = options if isinstance(options, argparse.Namespace) else argparse.Namespace(
        **(options or {})
    )  # fmt: skip
    meta = TraceMeta(
        source=f"import:{format}",
        details={"sources": [str(s) for s in srcs], **details(mod, srcs, opts)},
    )
    last = time.monotonic()
    with atomic_output(output, force=force) as tmp, TraceWriter(tmp, meta, form="file") as w:
        for rec in mod.records(srcs, opts):
            w.add(rec)
            now = time.monotonic()
            if say is not None and now - last >= 2.0:
                say(f"import {format}: {w.rows:,} requests ...")
                last = now
        rows = w.rows
    return Written(Path(output), rows)


def merge(
    segments: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    force: bool = False,
) -> Any:
    """Join recording segments into one trace: rows in trace order on one
    clock, sessions re-linked across restarts, request-id collisions renamed."""
    from replayer.record.segments import merge as _merge

    for s in segments:  # rows are rebuilt and renamed: a damaged one would pass for recorded
        open_trace(s).verify()
    with atomic_output(output, force=force) as tmp:
        return _merge([Path(s) for s in segments], tmp)


def convert(
    trace: TraceLike,
    output: str | os.PathLike[str],
    *,
    form: str | None = None,
    force: bool = False,
) -> Written:
    """Rewrite a trace of an older schema version at the current one (verified
    in full first): same rows in the same order, same bodies, fresh digests."""
    from replayer.trace.convert import convert as _convert

    t = open_trace(trace)
    t.verify()
    with atomic_output(output, force=force) as tmp:
        rows, batches = _convert(t, tmp, form=form)
    return Written(Path(output), rows, {"batches": batches, "from": t.schema_version})
