"""Where the HTML reports and live metrics plug into the service.

Both are looked up at run time, so the service works before they exist and
picks them up the moment they land, with no change here beyond the names.

* **Reports.** :func:`report_writer` returns ``write_report(run_dir, out)``
  when the report module provides it (``REPORT_MODULES``). The worker calls it when a
  replay or bisect ends (in the job's process, so rendering a 50,000-request
  report never blocks the API), writing ``JOB/out/report.html``; the API
  serves that file and renders one on demand, in a thread, for jobs that
  ended before the hook existed.

  The writer is ``replayer.analysis.report.write_report``; if it moves, only
  ``REPORT_MODULES`` changes.

* **Live metrics.** Replay and bisect take a ``--metrics-port P``
  option. :func:`metrics_port_option` finds it in the command's own parser;
  when it is there, the scheduler gives each running job a loopback port
  and ``/metrics`` appends the job's live series (labelled ``job_id``) to
  the service's own (:mod:`replayer.service.metrics`).
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("replayer.service")

ReportWriter = Callable[[Path, Path], Any]
REPORT_MODULES = (
    ("replayer.analysis.report", "write_report"),
    ("replayer.report", "write_report"),
)


@functools.cache
def report_writer() -> ReportWriter | None:
    """The report writer ``write_report(run_dir, out)``, or None while it does not
    exist (looked up once per process)."""
    for module, name in REPORT_MODULES:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        fn = getattr(mod, name, None)
        if callable(fn):
            return fn  # type: ignore[no-any-return]
    return None


def write_report(run_dir: Path, out: Path) -> bool:
    """Render ``out`` from ``run_dir`` if a report writer exists; False if not."""
    writer = report_writer()
    if writer is None:
        return False
    try:
        writer(run_dir, out)
    except Exception as exc:  # a report is a courtesy: never fail a job over it
        log.warning("report for %s failed: %s", run_dir, exc)
        return False
    return out.exists()


def metrics_port_option(kind: str) -> str | None:
    """``--metrics-port`` if the job's command takes it, else None."""
    from replayer.options import command_options

    return "--metrics-port" if "metrics_port" in command_options(kind) else None
