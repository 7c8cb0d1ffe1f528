"""Reports and live metrics, as the service uses them.

* **Reports.** :func:`write_report` renders ``JOB/out/report.html`` when a
  replay or bisect ends (in the job's worker process, so rendering a
  50,000-request report never blocks the API); the API serves that file and
  renders one on demand, in a thread, for jobs that ended without one.
* **Live metrics.** Replay and bisect take ``metrics_port``
  (:func:`takes_metrics_port`): the scheduler gives each running job a
  loopback port and ``/metrics`` appends the job's live series (labelled
  ``job_id``) to the service's own (:mod:`replayer.service.metrics`).
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("replayer.service")


def write_report(run_dir: Path, out: Path) -> bool:
    """Render ``out`` from ``run_dir``; False when it could not be written
    (a report is a courtesy: it never fails a job)."""
    from replayer.analysis.report import write_report as render

    try:
        render(run_dir, out, force=True)
    except Exception as exc:
        log.warning("report for %s failed: %s", run_dir, exc)
        return False
    return out.exists()


def takes_metrics_port(kind: str) -> bool:
    """Whether the job's verb serves live metrics (``metrics_port``)."""
    from replayer.options import options_of

    return "metrics_port" in options_of(kind)
