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

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Literal


class Timing(StrEnum):
    RECORDED = "recorded"
    GAPS = "gaps"
    ASAP = "asap"


class Order(StrEnum):
    STRICT = "strict"
    ADMITTED = "admitted"
    """Strict, paced on the previous request's response headers."""
    SESSION = "session"

    @property
    def global_order(self) -> bool:
        """One dispatcher walks the plan in trace order."""
        return self is not Order.SESSION


class Mode(StrEnum):
    VERBATIM = "verbatim"
    """Send the recorded bodies (model and streaming overrides aside)."""
    LIVE = "live"
    """Chat only: the target's own replies replace recorded assistant turns."""


class ResponsesState(StrEnum):
    """How a Responses request recorded with ``previous_response_id`` is sent."""

    EXPAND = "expand"
    """As stored: its full context inline (works with vLLM's default, no store)."""
    CHAIN = "chain"
    """As the client sent it: its own input, ``previous_response_id`` naming
    the live response of its parent (needs the server's response store)."""


class OnFailure(StrEnum):
    STOP = "stop"
    CONTINUE = "continue"


@dataclass(frozen=True)
class ReplayPolicy:
    """Everything that decides what is sent when (the policy of a bisect trial too)."""

    timing: Timing = Timing.RECORDED
    order: Order = Order.STRICT
    speed: float = 1.0
    max_inflight: int | None = None
    """Cap on concurrent requests per target (None: unbounded)."""
    mode: Mode = Mode.VERBATIM
    force_stream: bool = True
    """Send every request streaming with usage, so TTFT/ITL are measured."""
    model: str | None = None
    """Replace the body's model."""
    skip_over_context: bool = False
    """Skip requests whose input reaches the target's max_model_len."""
    request_timeout: float = 1800.0
    """Whole-request bound; long prefills send no bytes for minutes."""
    on_failure: OnFailure = OnFailure.STOP
    session_header: str | None = "X-Session-Id"
    """Header carrying the session id (routers, sticky sessions, the emulator)."""
    token_range: tuple[int, int] | None = None
    """Token-id range for blocks payloads (a model's vocabulary)."""
    save_output: bool = False
    """Keep each response's text in the results (for divergence checks)."""
    body_cache_mb: int = 512
    """Memory for bodies built ahead of dispatch, and for recent token-id
    bodies that later turns extend (past it the oldest are rebuilt). A
    token-id body built ahead is the same bytes object in both."""
    responses_state: ResponsesState = ResponsesState.EXPAND
    """Chained Responses requests: expanded inline, or re-chained to live ids."""
    workers: int | Literal["auto"] = "auto"
    """Processes that build bodies (1: a thread of the replay's own process);
    order, schedule, results and monitor stay in the replay's process.
    ``"auto"``: what the machine and the trace need
    (:func:`replayer.replay.workers.auto_workers`)."""

    def __post_init__(self) -> None:
        if self.body_cache_mb < 0:
            raise ValueError(f"body_cache_mb must be >= 0, not {self.body_cache_mb}")
        if self.workers != "auto" and (
            isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1
        ):
            raise ValueError(f"workers must be 'auto' or at least 1, not {self.workers!r}")
        if not self.speed > 0:
            raise ValueError(f"speed must be positive, not {self.speed}")
        if self.max_inflight is not None and self.max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        if not self.request_timeout > 0:
            raise ValueError("request_timeout must be positive")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, StrEnum):
                d[k] = v.value
        return d
