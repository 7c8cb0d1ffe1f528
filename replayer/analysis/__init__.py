"""Looking at runs: HTML reports (:mod:`~replayer.analysis.report`) and
comparisons of runs, targets and configurations (:mod:`~replayer.analysis.compare`).

Everything here only reads run directories; nothing touches a target.
"""

from __future__ import annotations

from replayer.analysis.report import render_report, write_report

__all__ = ["render_report", "write_report"]
