"""The trace: replayer's on-disk contract (Arrow IPC, delta-encoded bodies).

No network and no asyncio here: every other stage builds on this package.
"""

from replayer.trace.model import RequestRecord, TraceMeta
from replayer.trace.reader import RequestInfo, Trace
from replayer.trace.schema import TRACE_SCHEMA_VERSION, Kind
from replayer.trace.tokens import TokenSpace
from replayer.trace.writer import TraceWriter

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
