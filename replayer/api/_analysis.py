"""Several runs compared: ``sweep``, ``compare``, ``report``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer.api._common import (
    DEFAULT_WATCH,
    EndpointLike,
    Say,
    TraceLike,
    _endpoints,
    _new_dir,
    _stderr,
)
from replayer.errors import UsageError
from replayer.options import (
    CompareOptions,
    ReplayPolicy,
    Selection,
    WatchConfig,
)
from replayer.session import Session

if TYPE_CHECKING:
    pass

# -- several runs compared -------------------------------------------------------------


async def sweep(
    trace: TraceLike,
    endpoints: EndpointLike | Sequence[EndpointLike],
    limits: Sequence[int],
    out: str | os.PathLike[str],
    policy: ReplayPolicy | None = None,
    *,
    selection: Selection | None = None,
    watch: WatchConfig | None = DEFAULT_WATCH,
    options: CompareOptions | None = None,
    progress: bool = False,
    command: Sequence[str] | None = None,
    say: Say = _stderr,
) -> dict[str, Any]:
    """One replay per ``max_inflight`` limit (``OUT/inflight-N``), compared
    against the first (``OUT/compare.json``)."""
    from replayer.analysis.sweep import sweep as run_sweep
    from replayer.options import SweepOptions

    values = SweepOptions(limits=tuple(limits)).limits
    assert values is not None
    session = Session.open(
        trace, selection=selection, policy=policy, watch=watch, endpoints=_endpoints(endpoints)
    )
    d = _new_dir(Path(out))
    return await run_sweep(
        session, values, d, progress=progress, command=list(command or ["replayer.api.sweep"]),
        opts=options, say=say,
    )  # fmt: skip


def sweep_sync(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`sweep` for code without an event loop (same arguments)."""
    return asyncio.run(sweep(*args, **kwargs))


def compare(
    runs: Sequence[str | os.PathLike[str]],
    *,
    baseline: str | None = None,
    options: CompareOptions | None = None,
) -> dict[str, Any]:
    """Targets of a run, or runs (A/B), side by side with bootstrap confidence
    intervals on the latency percentiles and output divergence."""
    from replayer.analysis.compare import compare_runs

    paths = [Path(r) for r in runs]
    for r in paths:
        if not r.is_dir():
            raise UsageError(f"{r}: no such directory")
    return compare_runs(paths, baseline=baseline, opts=options)


def report(
    run: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    force: bool = False,
) -> Path:
    """One self-contained HTML report (offline) of a run, bisect or bundle
    directory; ``output`` defaults to ``RUN/report.html`` (rewritten)."""
    from replayer.analysis.report import write_report

    d = Path(run)
    if not d.is_dir():
        raise UsageError(f"{d}: no such directory")
    path = Path(output) if output is not None else d / "report.html"
    return write_report(d, path, force=force or output is None)
