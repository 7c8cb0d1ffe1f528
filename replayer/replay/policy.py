"""The replay contract: how a trace becomes traffic.

For request r of session s(r) at turn k(r), with recorded start t(r), recorded
end e(r) and, for k > 0, think gap g(r) = t(r) - e(previous turn) (clamped at
0; 0 when the previous end is unknown), all relative to the first selected
request and divided by ``speed``:

* ``recorded`` (default): r is eligible at T0 + t(r), and never before its
  previous turn completed plus g(r). T0 is one monotonic anchor shared by
  every target: no cumulative sleep drift, no start-up catch-up burst. A
  replay that falls behind keeps the order and reports the lag.
* ``gaps``: a session's first turn at T0 + t(r); later turns g(r) after the
  previous turn completes (closed loop).
* ``asap``: no waiting beyond dependencies; every session starts at once.

``strict`` order (default): a request is never dispatched before every
earlier request of the trace has been (its body is on the wire before the
next is sent), so the server's host *receives* trace order; the server
process may still *read* two requests that are in flight at once on
different connections either way round (an event loop reads data on an open
connection before it accepts a new one). ``admitted`` also waits for the
previous request's response headers (or its end) before sending the next:
vLLM sends a stream's headers after templating and tokenization, just
before the engine's ``add_request``, so the *engine* admits trace order even
where parallel renderer workers would let short prompts overtake long ones;
``session`` order keeps only each session's own order. The schedule of a
request is the time it became eligible: its own dependencies met and, in
strict order, no earlier than the previous request's schedule. Its lag is
dispatch minus schedule, the replayer's own lateness (it accumulates if the
replayer falls behind).
"""

from __future__ import annotations

from replayer.options.replay import (
    Aborts,
    Mode,
    OnFailure,
    Order,
    ReplayPolicy,
    ResponsesState,
    Timing,
)

__all__ = ["Aborts", "Mode", "OnFailure", "Order", "ReplayPolicy", "ResponsesState", "Timing"]
