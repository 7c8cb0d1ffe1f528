"""OpenAI Responses (``/v1/responses``).

A stream is typed events: ``response.created`` and ``response.in_progress``,
per output item ``response.output_item.added`` / ``.done``, text as
``response.output_text.delta``, reasoning as ``response.reasoning_text
.delta`` (or ``response.reasoning_summary_text.delta``), a function call's
arguments as ``response.function_call_arguments.delta`` / ``.done``, and
one terminal event carrying the whole response with its usage:
``response.completed``, ``response.incomplete`` or ``response.failed``
(with the ``error``). There is no ``[DONE]``; an ``error`` event (flat:
``{"type": "error", "code", "message"}``) reports a failure. The finish
reason is the response's ``status``, or for an incomplete one the reason
(``max_output_tokens``...). Function calls keep the API's shape
(``{"type": "function_call", "id", "call_id", "name", "arguments"}``),
keyed by output index.
"""

from __future__ import annotations

from typing import Any

from replayer.wire.base import Accumulator, Api, text_piece
from replayer.wire.envelope import ErrorInfo
from replayer.wire.reply import Choice

_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_REASONING = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})
_CALL_FIELDS = ("type", "id", "call_id", "name", "arguments")


class ResponsesAccumulator(Accumulator):
    """``response`` objects and their event streams."""

    api = Api.RESPONSES
    end_markers = tuple(t.encode() for t in sorted(_TERMINAL))
    __slots__ = ()

    def _event(self, obj: dict[str, Any], name: str) -> bool:
        kind = obj.get("type")
        if not isinstance(kind, str):
            return False
        ch = self.reply.choice(0)
        if kind == "response.output_text.delta":
            return self._add(ch, obj.get("delta"))
        if kind in _REASONING:
            return self._add(ch, obj.get("delta"), reasoning=True)
        if kind == "response.function_call_arguments.delta":
            piece = text_piece(obj.get("delta"))
            call = ch.calls.get(_index(obj))
            if piece is None or call is None:
                return False
            call["arguments"] = (call.get("arguments") or "") + piece
            ch.digest.update(piece.encode())
            return True
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = obj.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                fresh = _index(obj) not in ch.calls
                ch.calls[_index(obj)] = _call(item)
                return fresh and kind == "response.output_item.added"
        elif kind in _TERMINAL:
            resp = obj.get("response")
            if isinstance(resp, dict):
                self._status(ch, resp)
            self.reply.done = True
        elif kind == "response.created":
            resp = obj.get("response")
            if isinstance(resp, dict):
                self._identify(resp)
        return False

    def _body(self, obj: dict[str, Any]) -> None:
        ch = self.reply.choice(0)
        output = obj.get("output")
        for i, item in enumerate(output if isinstance(output, list) else ()):
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "message":
                for part in _parts(item.get("content")):
                    if part.get("type") == "output_text":
                        self._add(ch, part.get("text"))
            elif kind == "reasoning":
                for part in (*_parts(item.get("content")), *_parts(item.get("summary"))):
                    self._add(ch, part.get("text"), reasoning=True)
            elif kind == "function_call":
                ch.calls[i] = call = _call(item)
                args = text_piece(call.get("arguments"))
                if args is not None:
                    ch.digest.update(args.encode())
        self._status(ch, obj)

    def _identify(self, resp: dict[str, Any]) -> None:
        rid = resp.get("id")
        if isinstance(rid, str) and rid:
            self.reply.response_id = rid

    def _status(self, ch: Choice, resp: dict[str, Any]) -> None:
        self._identify(resp)
        output = resp.get("output")
        if self.reply.keep_text and isinstance(output, list):
            self.reply.output_items = output
        status = resp.get("status")
        details = resp.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        if isinstance(reason, str) and reason:
            ch.finish = reason
        elif isinstance(status, str) and status:
            ch.finish = status
        err = resp.get("error")
        if isinstance(err, dict):
            msg = err.get("message")
            code = err.get("code")
            self.reply.set_error(ErrorInfo(msg if isinstance(msg, str) else str(err), None, code))
        usage = resp.get("usage")
        if isinstance(usage, dict):
            details = usage.get("input_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            self._usage(usage.get("input_tokens"), usage.get("output_tokens"), cached)


def _call(item: dict[str, Any]) -> dict[str, Any]:
    return {k: item[k] for k in _CALL_FIELDS if k in item}


def _parts(v: Any) -> list[dict[str, Any]]:
    return [p for p in v if isinstance(p, dict)] if isinstance(v, list) else []


def _index(obj: dict[str, Any]) -> int:
    i = obj.get("output_index")
    return i if isinstance(i, int) else 0
