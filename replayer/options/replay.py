"""How a trace becomes traffic (:class:`ReplayPolicy`) and which of its
requests (:class:`Selection`). The replay contract itself is written out in
:mod:`replayer.replay.policy`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from replayer._declare import Declared, option

REPLAYING = frozenset({"replay", "check", "bisect", "soak", "sweep"})
"""The verbs that replay a trace under a policy of their own."""


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


class Aborts(StrEnum):
    """What becomes of a request the recorded client abandoned (``meta.abort``)."""

    REPLAY = "replay"
    """Disconnect at the recorded point (:mod:`replayer.replay.aborts`)."""
    COMPLETE = "complete"
    """Read it to its end, as if the client had waited."""


class OnFailure(StrEnum):
    STOP = "stop"
    CONTINUE = "continue"


def workers_value(text: str) -> int | Literal["auto"]:
    """``--workers``: ``auto`` or a count of at least 1."""
    if text == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"want auto or a count of at least 1, not {text!r}")
    return n


def token_range_value(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"wants LO:HI, not {text!r}") from None
    return lo, hi


def _token_range_problem(r: tuple[int, int]) -> str | None:
    return None if 0 <= r[0] < r[1] else f"wants 0 <= LO < HI, not {r[0]}:{r[1]}"


def _workers_problem(w: int | str) -> str | None:
    return (
        None if w == "auto" or (isinstance(w, int) and w >= 1) else "must be 'auto' or at least 1"
    )


def header_value(text: str) -> str | None:
    """A header name, or ``none`` for no header."""
    return None if text.strip().lower() == "none" else text


@dataclass(frozen=True)
class ReplayPolicy(Declared):
    """Everything that decides what is sent when (the policy of a bisect trial too)."""

    __group__ = "policy"
    __verbs__ = REPLAYING

    timing: Timing = option(
        Timing.RECORDED,
        "recorded: absolute recorded offsets and think gaps (default); gaps: closed loop on "
        "think gaps; asap: dependencies only",
    )
    order: Order = option(
        Order.STRICT,
        "strict: the server receives trace order (default); admitted: also wait for each "
        "stream's response headers, so the engine admits trace order; session: per session only",
    )
    speed: float = option(1.0, "divide recorded times by X (default 1)", metavar="X", gt=0)
    max_inflight: int | None = option(
        None,
        "at most N requests in flight per target",
        metavar="N",
        ge=1,
        verbs=REPLAYING - {"sweep"},  # sweep takes a list of them
    )
    """Cap on concurrent requests per target (None: unbounded)."""
    mode: Mode = option(
        Mode.VERBATIM, "live: the target's replies replace recorded assistant turns (chat)"
    )
    force_stream: bool = option(
        True, "send bodies' own stream flag instead of streaming with usage"
    )
    """Send every request streaming with usage, so TTFT/ITL are measured."""
    model: str | None = option(None, "replace the model of every body")
    """Replace the body's model."""
    skip_over_context: bool = option(
        False, "skip requests longer than the target's max_model_len (else sent)"
    )
    request_timeout: float = option(
        1800.0, "bound on one request, seconds (default 1800)", metavar="S", gt=0
    )
    """Whole-request bound; long prefills send no bytes for minutes."""
    aborts: Aborts = option(
        Aborts.REPLAY,
        "requests the recorded client abandoned: replay (default: disconnect after the same "
        "number of streamed events, else after the same time) or complete (read to the end)",
    )
    """Client aborts: replayed at their recorded point, or sent to completion."""
    on_failure: OnFailure = option(
        OnFailure.STOP, "stop dispatching to a failed target (default) or keep going"
    )
    session_header: str | None = option(
        "X-Session-Id",
        "header carrying the session id ('none' to omit)",
        metavar="NAME",
        parse=header_value,
    )
    """Header carrying the session id (routers, sticky sessions, the emulator)."""
    token_range: tuple[int, int] | None = option(
        None,
        "token ids for blocks payloads, e.g. 1000:150000",
        metavar="LO:HI",
        parse=token_range_value,
        check=_token_range_problem,
    )
    """Token-id range for blocks payloads (a model's vocabulary)."""
    save_output: bool = option(False, "keep response texts in results")
    """Keep each response's text in the results (for divergence checks)."""
    body_cache_mb: int = option(
        512,
        "memory for bodies built ahead of dispatch, and for recent token-id bodies that later "
        "turns extend (each, default 512)",
        metavar="MB",
        ge=0,
    )
    """Memory for bodies built ahead of dispatch, and for recent token-id
    bodies that later turns extend (past it the oldest are rebuilt). A
    token-id body built ahead is the same bytes object in both."""
    responses_state: ResponsesState = option(
        ResponsesState.EXPAND,
        "Responses requests recorded with previous_response_id: expand (default: full context "
        "inline, no server store needed) or chain (own input, previous_response_id re-pointed "
        "at the live response; needs VLLM_ENABLE_RESPONSES_API_STORE=1)",
    )
    """Chained Responses requests: expanded inline, or re-chained to live ids."""
    workers: int | Literal["auto"] = option(
        "auto",
        "processes that build request bodies, sessions dealt among them (1: a thread); order, "
        "timing and results stay in one process (default auto: more than 1 only for a large "
        "trace, due faster than one process builds, on a machine with 4 or more cores)",
        metavar="N|auto",
        parse=workers_value,
        check=_workers_problem,
    )
    """Processes that build bodies (1: a thread of the replay's own process);
    order, schedule, results and monitor stay in the replay's process.
    ``"auto"``: what the machine and the trace need
    (:func:`replayer.replay.workers.auto_workers`)."""


@dataclass(frozen=True)
class Selection(Declared):
    """Which requests of a trace: the first ``limit``, by session, by request
    (ids or inclusive 0-based ranges ``A..B``, comma-separated)."""

    __group__ = "selection (ids, or inclusive 0-based ranges A..B)"
    __verbs__ = REPLAYING | {"inspect", "export"}

    limit: int | None = option(None, "first N requests", metavar="N", ge=0)
    sessions: str | None = option(None, "sessions by id or position", metavar="SPEC")
    requests: str | None = option(None, "requests by id or position", metavar="SPEC")

    @property
    def everything(self) -> bool:
        return (self.limit, self.sessions, self.requests) == (None, None, None)
