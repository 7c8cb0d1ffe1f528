"""The accumulator interface: one API's events (or whole body) into a :class:`Reply`.

An accumulator is made per response, around a :class:`Reply` (the replay
engine makes the reply first, so its watchdog can read ``last_token`` while
the stream runs). What every API shares is here: ``[DONE]``, JSON parsing
(orjson, about a microsecond an event: cheaper and sturdier than scanning
bytes, and needed anyway to hash the text), error objects, malformed input
counted and never raised (the recorder must keep relaying whatever comes),
and the timing of output events. A subclass says what its API's events and
bodies mean (:meth:`Accumulator._event`, :meth:`Accumulator._body`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

import orjson

from replayer.wire.envelope import error_info
from replayer.wire.reply import Choice, Reply
from replayer.wire.sse import Event

_loads = orjson.loads
_JSONError = orjson.JSONDecodeError


class Api(StrEnum):
    """The response formats the wire layer reads."""

    CHAT = "chat.completions"
    COMPLETIONS = "completions"
    MESSAGES = "messages"
    """Anthropic Messages (vLLM serves it at ``/v1/messages``)."""
    RESPONSES = "responses"
    """OpenAI Responses."""


class Accumulator:
    """Base of the per-API accumulators.

    **Usage**::

        acc = ChatAccumulator()            # or accumulator(Api.CHAT, reply)
        for ev in decoder.feed(chunk):
            acc.event(ev, loop.time())
        acc.reply.done, acc.reply.text
    """

    api: ClassVar[Api]
    end_markers: ClassVar[tuple[bytes, ...]] = (b"[DONE]",)
    """Bytes a read holding the stream's last event contains (the recorder
    parses such a read before relaying it, see :mod:`replayer.record.proxy`)."""

    __slots__ = ("reply",)

    def __init__(self, reply: Reply | None = None) -> None:
        self.reply = reply if reply is not None else Reply()

    def event(self, ev: Event, now: float) -> None:
        """Account one stream event read at ``now``."""
        data = ev.data
        r = self.reply
        if data == b"[DONE]":
            r.done = True
            return
        r.events += 1
        try:
            obj = _loads(data)
        except _JSONError:
            r.bad += 1
            return
        if not isinstance(obj, dict):
            r.bad += 1
            return
        if "error" in obj or obj.get("object") == "error" or obj.get("type") == "error":
            info = error_info(obj)
            if info is not None:
                r.set_error(info)
                return
        if self._event(obj, ev.event):
            r.output(now)

    def body(self, raw: bytes, status: int = 200) -> bool:
        """Account a whole (non-streamed) body; False if it is not a JSON object.
        Any status of 400 or more is an error: the envelope's, else the text."""
        r = self.reply
        try:
            obj = _loads(raw)
        except _JSONError:
            obj = None
        if not isinstance(obj, dict):
            if status >= 400:
                r.error = raw[:4096].decode(errors="replace")
            else:
                r.bad += 1
            return False
        info = error_info(obj)
        if info is not None:
            r.set_error(info)
        elif status >= 400:
            detail = obj.get("detail")
            r.error = detail if isinstance(detail, str) else raw[:4096].decode(errors="replace")
        else:
            self._body(obj)
        return True

    # -- per API -----------------------------------------------------------------

    def _event(self, obj: dict[str, Any], name: str) -> bool:
        """Apply one event's object (``name``: its SSE ``event`` field); True
        if it carried output."""
        raise NotImplementedError

    def _body(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- shared by the APIs ------------------------------------------------------

    def _add(self, ch: Choice, v: Any, *, reasoning: bool = False) -> bool:
        """Take a text (or reasoning) piece if it is a non-empty string."""
        if not isinstance(v, str) or not v:
            return False
        ch.digest.update(v.encode())
        if self.reply.keep_text:
            (ch.reasoning if reasoning else ch.text).append(v)
        return True

    def _usage(self, prompt: Any, completion: Any, cached: Any) -> None:
        r = self.reply
        r.prompt_tokens = _int(prompt, r.prompt_tokens)
        r.completion_tokens = _int(completion, r.completion_tokens)
        r.cached_tokens = _int(cached, r.cached_tokens)

    def _spec_decode(self, obj: dict[str, Any]) -> None:
        """vLLM's per-request ``metrics.speculative_decoding`` (experimental,
        0.32: ``SpeculativeDecodingMetrics`` in
        ``vllm/entrypoints/generate/base/protocol.py``), where present: on the
        final body, or the final usage chunk of a stream."""
        m = obj.get("metrics")
        sd = m.get("speculative_decoding") if isinstance(m, dict) else None
        if not isinstance(sd, dict):
            return
        r = self.reply
        r.spec_drafts = _int(sd.get("num_spec_steps"), r.spec_drafts)
        r.spec_draft_tokens = _int(sd.get("num_draft_tokens"), r.spec_draft_tokens)
        r.spec_accepted_tokens = _int(sd.get("num_accepted_draft_tokens"), r.spec_accepted_tokens)


def _int(v: Any, default: int | None) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def text_piece(v: Any) -> str | None:
    """A non-empty string, else None."""
    return v if isinstance(v, str) and v else None
