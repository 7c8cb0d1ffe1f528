"""Where a recorded client gave up on a request, and where the replay does too.

A client that disconnects mid-answer is load a server must survive: vLLM
aborts the request, frees its blocks, and a KV connector's hook runs on it
(the path that killed EngineCore in LMCache #4938 and vLLM #43226). The
recorder marks such a row (``meta.abort``: see docs/trace-format.md); with
``--aborts replay`` (the default) the replay disconnects at the same point:

* after the same number of streamed events (``after_chunks``, SSE data
  events other than ``[DONE]``) when the recording counted at least one;
* else after the same time from the request's first byte (``after_us``):
  a non-streamed request, or a stream the client left before its first
  event. The time is not divided by ``--speed``: what the server reached by
  then is the server's doing.

A request that ends on its own before its abort point (a shorter answer
than recorded) completes as usual. One that reached it is ``aborted`` in
the results: by design, never a failure of the server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replayer.trace.reader import Trace


@dataclass(frozen=True, slots=True)
class AbortAt:
    """One request's abort point (at least one of the two is set)."""

    after_chunks: int | None = None
    """Disconnect once this many streamed events are in (>= 1)."""
    after_us: int | None = None
    """Else disconnect this long after the request's first byte."""

    def describe(self) -> str:
        if self.after_chunks is not None:
            return f"after {self.after_chunks} streamed event(s)"
        return f"after {(self.after_us or 0) / 1e6:g} s"


def abort_point(meta: Mapping[str, Any] | None) -> AbortAt | None:
    """The abort point a row's ``meta`` records, or None: the trace's mark
    (:func:`~replayer.trace.export.abort_mark`, which an older recording's
    ``meta.abandoned = "client"`` also gives), with values a replay can act
    on (a positive event count, a time that is not negative)."""
    from replayer.trace.export import abort_mark

    mark = abort_mark(meta)
    if mark is None:
        return None
    chunks, us = mark.get("after_chunks"), mark.get("after_us")
    n = chunks if isinstance(chunks, int) and not isinstance(chunks, bool) and chunks > 0 else None
    t = us if isinstance(us, int) and not isinstance(us, bool) and us >= 0 else None
    if n is None and t is None:
        return None
    return AbortAt(n, t)


def abort_points(trace: Trace, rows: Iterable[int]) -> dict[int, AbortAt]:
    """The abort points of ``rows`` (read before the replay starts: ``meta``
    is a content column, decoded by batch). Only rows without a recorded
    finish reason are read: an abandoned answer has none."""
    finish = trace.column("finish_reason")
    out: dict[int, AbortAt] = {}
    for row in sorted(rows):
        if finish[row] is not None:
            continue
        at = abort_point(trace.meta(row))
        if at is not None:
            out[row] = at
    return out
