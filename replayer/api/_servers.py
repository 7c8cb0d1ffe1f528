"""Servers replayer runs until stopped: ``record``, ``serve``, ``emulate``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer.api._common import Say, _metrics, _stderr
from replayer.options import (
    MetricsOptions,
    RecordOptions,
    ServeOptions,
)

if TYPE_CHECKING:
    from replayer.telemetry import LiveMetrics

# -- servers --------------------------------------------------------------------------


def record(
    options: RecordOptions,
    output: str | os.PathLike[str],
    *,
    metrics: MetricsOptions | None = None,
    live: LiveMetrics | None = None,
    say: Say = _stderr,
) -> int:
    """Run the recording proxy until it is stopped (Ctrl-C, SIGTERM): every
    exchange through it goes into ``output`` (a new segment if it exists)."""
    from replayer.record.run import record as _record

    with _metrics(metrics, live, say) as lm:
        return _record(options, Path(output), live=lm)


def serve(options: ServeOptions) -> int:
    """Run the job service until it is stopped."""
    from replayer.service.server import run

    return run(options)


def emulate(config: Any) -> int:
    """Run the vLLM emulator (an :class:`~replayer.emulator.config.EmulatorConfig`)
    until it is stopped."""
    from replayer.emulator.server import run

    return int(run(config))
