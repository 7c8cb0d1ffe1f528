"""What one response amounted to, whatever API produced it.

A :class:`Reply` is filled by an accumulator (:mod:`replayer.wire.base`)
event by event, or from a whole body, and read by the replay client (times,
usage, a hash of the output), the hang watchdog (``last_token`` while the
stream runs) and the recorder (text, reasoning, tool calls, the error).

Output is kept per choice (OpenAI's ``n``; other APIs have one). The
summary fields are choice 0's, as a client reading ``choices[0]`` sees
them. Text is kept only when asked (``keep_text``): a replay holds hundreds
of streams at once and needs only their hash. The hash covers what the
model generated, reasoning and tool-call arguments included, per choice in
arrival order, so it does not depend on how the choices interleaved.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from replayer.wire.envelope import ErrorInfo

if TYPE_CHECKING:
    from hashlib import _Hash

_EMPTY_HASH = hashlib.sha256().hexdigest()[:16]


@dataclass(slots=True)
class Choice:
    """One choice's output as assembled so far."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Tool calls by index, merged as the API's SDK merges them."""
    finish: str | None = None
    digest: _Hash = field(default_factory=hashlib.sha256)


@dataclass(slots=True, eq=False)
class Reply:
    """One response, streamed or whole.

    **Usage**::

        reply = Reply(keep_text=True)
        acc = accumulator(Api.CHAT, reply)
        for ev in SSEDecoder().feed(body):
            acc.event(ev, now)
        reply.text, reply.finish_reason, reply.output_hash
    """

    keep_text: bool = False
    """Keep the text itself, not only its hash."""
    events: int = 0
    """Data events other than ``[DONE]`` (0 for a whole body)."""
    bad: int = 0
    """Events or bodies that were not JSON objects."""
    done: bool = False
    """The API's end-of-stream event was read (``[DONE]``, ``message_stop``,
    ``response.completed``...)."""
    truncated: bool = False
    """Not assembled: too large, or in an encoding that could not be decoded."""
    chunks: int = 0
    """Events that carried output (text, reasoning or tool-call pieces)."""
    first_token: float | None = None
    """When the first such event was read (the caller's clock)."""
    last_token: float | None = None
    gap_sum: float = 0.0
    gap_max: float = 0.0
    prompt_tokens: int | None = None
    """All prompt tokens, cached ones included, whatever the API calls them."""
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    spec_drafts: int | None = None
    """Speculative decoding, this request's verify steps (vLLM's experimental
    ``metrics.speculative_decoding``, sent only with
    ``--per-request-spec-decode-metrics``; None when the server sent none)."""
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int | None = None
    error: str | None = None
    """The message of an error body or in-stream error event."""
    error_type: str | None = None
    error_code: Any = None
    response_id: str | None = None
    """Responses: the response's own id (what a later ``previous_response_id`` names)."""
    output_items: list[Any] | None = None
    """Responses: the output items as the terminal event or body carried them
    (kept with ``keep_text``): what a chained request's context continues with."""
    by_choice: dict[int, Choice] = field(default_factory=dict)

    # -- filled by accumulators -------------------------------------------------

    def choice(self, index: Any) -> Choice:
        i = index if isinstance(index, int) else 0
        ch = self.by_choice.get(i)
        if ch is None:
            ch = self.by_choice[i] = Choice()
        return ch

    def set_error(self, info: ErrorInfo) -> None:
        self.error, self.error_type, self.error_code = info.message, info.type, info.code

    def output(self, now: float) -> None:
        """An event carrying output was read at ``now``."""
        if self.first_token is None:
            self.first_token = now
        else:
            gap = now - (self.last_token or now)
            self.gap_sum += gap
            if gap > self.gap_max:
                self.gap_max = gap
        self.last_token = now
        self.chunks += 1

    # -- the summary (choice 0) -------------------------------------------------

    @property
    def first(self) -> Choice | None:
        return self.by_choice.get(0) or next(iter(self.by_choice.values()), None)

    @property
    def choices(self) -> int:
        """How many choices the response had."""
        return len(self.by_choice)

    @property
    def text(self) -> str | None:
        """Choice 0's text (None without a choice, or when text is not kept)."""
        ch = self.first
        return "".join(ch.text) if ch is not None and self.keep_text else None

    @property
    def reasoning(self) -> str | None:
        ch = self.first
        return "".join(ch.reasoning) if ch is not None and ch.reasoning else None

    @property
    def tool_calls(self) -> list[dict[str, Any]] | None:
        ch = self.first
        return [ch.calls[i] for i in sorted(ch.calls)] if ch is not None and ch.calls else None

    @property
    def finish_reason(self) -> str | None:
        ch = self.first
        return ch.finish if ch is not None else None

    @property
    def finishing(self) -> bool:
        """A finish reason, an error or the end event has been read: only the
        stream's tail is left."""
        if self.done or self.error is not None:
            return True
        return any(c.finish for c in self.by_choice.values())

    @property
    def output_hash(self) -> str:
        """16 hex digits of SHA-256 over the output (see the module docstring)."""
        if not self.by_choice:
            return _EMPTY_HASH
        if len(self.by_choice) == 1:
            return next(iter(self.by_choice.values())).digest.hexdigest()[:16]
        h = hashlib.sha256()
        for i in sorted(self.by_choice):
            h.update(self.by_choice[i].digest.digest())
        return h.hexdigest()[:16]

    def message(self) -> dict[str, Any]:
        """Choice 0 as the assistant message a chat client keeps (the recorder's
        session matching): content ``""`` when there was none."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.text}
        calls = self.tool_calls
        if calls:
            msg["tool_calls"] = calls
        return msg

    def assistant_message(self) -> dict[str, Any]:
        """Choice 0 as the message live mode sends in later turns: content null
        when empty, tool calls in the shape a chat request takes."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        calls = self.tool_calls
        if calls:
            msg["tool_calls"] = [_request_call(c) for c in calls]
        return msg


def _request_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function")
    fn = fn if isinstance(fn, dict) else {}
    return {
        "id": call.get("id"),
        "type": call.get("type") or "function",
        "function": {"name": fn.get("name") or "", "arguments": fn.get("arguments") or ""},
    }
