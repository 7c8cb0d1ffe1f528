"""replayer: a long-context, multi-turn crash reproducer for LLM serving.

The package is laid out along the data flow: ``trace`` (the on-disk format,
importers, synthesis) -> ``record`` -> ``replay`` -> ``monitor`` -> ``bisect``
-> ``bundle``, plus the vLLM ``emulator``, the ``service`` and the ``cli``.

The names below are the public API (see the README's "Python API")::

    from replayer import api, ReplayPolicy
    result = api.replay_sync("traces/agentic-chat.arrow", "http://127.0.0.1:8000",
                             ReplayPolicy(speed=4))

They load on first use, so ``import replayer`` (and the CLI's start-up)
stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from replayer._version import __version__

_EXPORTS = {
    # the entry points
    "api": "replayer.api",
    "open_trace": "replayer.api",
    "Endpoint": "replayer.api",
    "Server": "replayer.api",
    "ReplayResult": "replayer.api",
    "EndpointResult": "replayer.api",
    "FailureInfo": "replayer.api",
    "RunPaths": "replayer.api",
    "RunStatus": "replayer.api",
    "CheckResult": "replayer.api",
    # options
    "ReplayPolicy": "replayer.replay.policy",
    "Timing": "replayer.replay.policy",
    "Order": "replayer.replay.policy",
    "Mode": "replayer.replay.policy",
    "OnFailure": "replayer.replay.policy",
    "WatchConfig": "replayer.monitor.watch",
    "Selection": "replayer.options",
    "BisectOptions": "replayer.bisect.pipeline",
    # traces
    "Trace": "replayer.trace.reader",
    "TraceWriter": "replayer.trace.writer",
    "TraceMeta": "replayer.trace.model",
    "RequestRecord": "replayer.trace.model",
    # what a run finds
    "FailureClass": "replayer.monitor.classify",
    "Signature": "replayer.monitor.signature",
    "Outcome": "replayer.bisect.oracle",
    "BisectResult": "replayer.bisect.pipeline",
    "Runner": "replayer.bisect.runner",
    "Trial": "replayer.bisect.runner",
    "Observation": "replayer.bisect.runner",
    "FunctionRunner": "replayer.bisect.runner",
    # errors
    "ReplayerError": "replayer.errors",
    "UsageError": "replayer.errors",
    "OptionError": "replayer.errors",
    "TraceError": "replayer.errors",
    "SchemaVersionError": "replayer.errors",
    "ImportFormatError": "replayer.errors",
    "TargetError": "replayer.errors",
    "LaunchError": "replayer.errors",
}

__all__ = [
    "__version__",
    "api",
    "open_trace",
    "Endpoint",
    "Server",
    "ReplayResult",
    "EndpointResult",
    "FailureInfo",
    "RunPaths",
    "RunStatus",
    "CheckResult",
    "ReplayPolicy",
    "Timing",
    "Order",
    "Mode",
    "OnFailure",
    "WatchConfig",
    "Selection",
    "BisectOptions",
    "Trace",
    "TraceWriter",
    "TraceMeta",
    "RequestRecord",
    "FailureClass",
    "Signature",
    "Outcome",
    "BisectResult",
    "Runner",
    "Trial",
    "Observation",
    "FunctionRunner",
    "ReplayerError",
    "UsageError",
    "OptionError",
    "TraceError",
    "SchemaVersionError",
    "ImportFormatError",
    "TargetError",
    "LaunchError",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'replayer' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if name == "api" else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from replayer import api
    from replayer.api import (
        CheckResult,
        Endpoint,
        EndpointResult,
        FailureInfo,
        ReplayResult,
        RunPaths,
        RunStatus,
        Server,
        open_trace,
    )
    from replayer.bisect.oracle import Outcome
    from replayer.bisect.pipeline import BisectOptions, BisectResult
    from replayer.bisect.runner import FunctionRunner, Observation, Runner, Trial
    from replayer.errors import (
        ImportFormatError,
        LaunchError,
        OptionError,
        ReplayerError,
        SchemaVersionError,
        TargetError,
        TraceError,
        UsageError,
    )
    from replayer.monitor.classify import FailureClass
    from replayer.monitor.signature import Signature
    from replayer.monitor.watch import WatchConfig
    from replayer.options import Selection
    from replayer.replay.policy import Mode, OnFailure, Order, ReplayPolicy, Timing
    from replayer.trace.model import RequestRecord, TraceMeta
    from replayer.trace.reader import Trace
    from replayer.trace.writer import TraceWriter
