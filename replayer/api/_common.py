"""What every verb shares: the monitor's defaults, endpoints from URLs, run
directories, replayer's own live metrics."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from replayer.errors import OptionError, UsageError
from replayer.options import (
    MetricsOptions,
    WatchConfig,
)
from replayer.options.server import Endpoint
from replayer.trace.reader import Trace

if TYPE_CHECKING:
    from replayer.telemetry import LiveMetrics


DEFAULT_WATCH = WatchConfig()
"""The monitor's defaults: health every second, 60 s stall watchdog, 10 s settle."""

EndpointLike = Endpoint | str
"""An :class:`Endpoint`, or a URL (``http://host:port``; named ``target``)."""

TraceLike = Trace | str | os.PathLike[str]

Say = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- shared pieces ----------------------------------------------------------------------


def _endpoints(endpoints: EndpointLike | Sequence[EndpointLike]) -> list[Endpoint]:
    items = [endpoints] if isinstance(endpoints, Endpoint | str) else list(endpoints)
    if not items:
        raise OptionError("endpoints", "is empty: give at least one URL or Endpoint")
    out: list[Endpoint] = []
    for i, e in enumerate(items):
        if isinstance(e, str):
            name = "target" if len(items) == 1 else f"target{i}"
            e = Endpoint(name=name, url=e)
        if any(o.name == e.name for o in out):
            raise OptionError("endpoints", f"two are named {e.name!r}")
        out.append(e)
    return out


def _watch(watch: WatchConfig | None, verb: str) -> WatchConfig:
    if watch is None or not watch.enabled:
        raise UsageError(
            f"{verb} classifies every run: it needs the monitor (watch=None and --no-monitor "
            "turn it off)"
        )
    return watch


def _run_dir(out: str | os.PathLike[str] | None, force: bool) -> Path:
    from replayer.replay.run import prepare_out

    return prepare_out(Path(out) if out is not None else None, force)


def _new_dir(d: Path) -> Path:
    """``d``, made, new or empty."""
    if d.exists() and any(d.iterdir()):
        raise UsageError(f"{d} exists and is not empty: pick another out")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _stamped(base: Path, prefix: str) -> Path:
    return base / f"{prefix}-{_dt.datetime.now():%Y%m%d-%H%M%S}"


@contextlib.contextmanager
def _metrics(
    metrics: MetricsOptions | None, live: LiveMetrics | None, say: Say
) -> Iterator[LiveMetrics | None]:
    """``live``, or the live metrics ``metrics`` asks to serve (stopped after)."""
    if metrics is None or metrics.metrics_port is None or live is not None:
        yield live
        return
    from replayer.telemetry import LiveMetrics

    mine = LiveMetrics()
    try:
        server = mine.serve(metrics.metrics_port, metrics.metrics_host)
    except OSError as exc:
        raise OptionError(
            "metrics_port",
            f"cannot serve metrics on {metrics.metrics_host}:{metrics.metrics_port}: "
            f"{exc.strerror}",
        ) from None
    say(f"replayer: metrics on {server.url}")
    try:
        yield mine
    finally:
        server.close()
