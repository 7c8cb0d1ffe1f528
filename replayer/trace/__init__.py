"""The trace: replayer's on-disk contract (Arrow IPC, delta-encoded bodies).

No network and no asyncio here: every other stage builds on this package.
The names below load on first use, so importing a light module of the
package (the importers' registry, the record model) does not load Arrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "TRACE_SCHEMA_VERSION": "replayer.trace.schema",
    "Kind": "replayer.trace.schema",
    "RequestInfo": "replayer.trace.reader",
    "RequestRecord": "replayer.trace.model",
    "TokenSpace": "replayer.trace.tokens",
    "Trace": "replayer.trace.reader",
    "TraceMeta": "replayer.trace.model",
    "TraceWriter": "replayer.trace.writer",
}

__all__ = [
    "TRACE_SCHEMA_VERSION",
    "Kind",
    "RequestInfo",
    "RequestRecord",
    "TokenSpace",
    "Trace",
    "TraceMeta",
    "TraceWriter",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'replayer.trace' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from replayer.trace.model import RequestRecord, TraceMeta
    from replayer.trace.reader import RequestInfo, Trace
    from replayer.trace.schema import TRACE_SCHEMA_VERSION, Kind
    from replayer.trace.tokens import TokenSpace
    from replayer.trace.writer import TraceWriter
