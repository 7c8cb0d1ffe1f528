"""Anthropic Messages (``/v1/messages``; vLLM serves it too).

A stream is ``message_start`` (the usage so far), then per content block
``content_block_start``, ``content_block_delta`` (``text_delta``,
``thinking_delta``, ``input_json_delta`` for a ``tool_use`` block's input,
``signature_delta``) and ``content_block_stop``, then ``message_delta``
(``stop_reason``, cumulative ``output_tokens``) and ``message_stop``, the
end (there is no ``[DONE]``); ``ping`` may come any time, and an ``error``
event ends a failed stream. Every event's data names its type, so the SSE
``event`` field is not needed. Text and thinking blocks become choice 0's
text and reasoning; a ``tool_use`` block becomes a tool call in the API's
own shape (``{"type": "tool_use", "id", "name", "input"}``), its input
parsed from the concatenated JSON at the block's end. ``prompt_tokens`` is
``input_tokens`` plus the cache reads and writes (Anthropic counts them
apart); ``cached_tokens`` the cache reads.
"""

from __future__ import annotations

from typing import Any

import orjson

from replayer.wire.base import Accumulator, Api, text_piece
from replayer.wire.reply import Choice, Reply


class MessagesAccumulator(Accumulator):
    """Anthropic ``message`` bodies and their event streams."""

    api = Api.MESSAGES
    end_markers = (b"message_stop",)
    __slots__ = ("_json",)

    def __init__(self, reply: Reply | None = None) -> None:
        super().__init__(reply)
        self._json: dict[int, list[str]] = {}
        """A tool_use block's input JSON so far, by block index."""

    def _event(self, obj: dict[str, Any], name: str) -> bool:
        kind = obj.get("type")
        if not isinstance(kind, str):
            return False
        ch = self.reply.choice(0)
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                return False
            dkind = delta.get("type")
            if dkind == "text_delta":
                return self._add(ch, delta.get("text"))
            if dkind == "thinking_delta":
                return self._add(ch, delta.get("thinking"), reasoning=True)
            if dkind == "input_json_delta":
                piece = text_piece(delta.get("partial_json"))
                if piece is None:
                    return False
                ch.digest.update(piece.encode())
                self._json.setdefault(_index(obj), []).append(piece)
                return True
            return False
        if kind == "content_block_start":
            block = obj.get("content_block")
            return isinstance(block, dict) and self._block(ch, _index(obj), block, stream=True)
        if kind == "content_block_stop":
            self._close_call(ch, _index(obj))
        elif kind == "message_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                stop = delta.get("stop_reason")
                if isinstance(stop, str) and stop:
                    ch.finish = stop
            self._anthropic_usage(obj.get("usage"))
        elif kind == "message_start":
            msg = obj.get("message")
            if isinstance(msg, dict):
                self._anthropic_usage(msg.get("usage"))
        elif kind == "message_stop":
            for i in list(self._json):
                self._close_call(ch, i)
            self.reply.done = True
        return False

    def _body(self, obj: dict[str, Any]) -> None:
        ch = self.reply.choice(0)
        content = obj.get("content")
        if isinstance(content, list):
            for i, block in enumerate(content):
                if isinstance(block, dict):
                    self._block(ch, i, block, stream=False)
        stop = obj.get("stop_reason")
        if isinstance(stop, str) and stop:
            ch.finish = stop
        self._anthropic_usage(obj.get("usage"))

    def _block(self, ch: Choice, i: int, block: dict[str, Any], *, stream: bool) -> bool:
        kind = block.get("type")
        if kind == "text":
            return self._add(ch, block.get("text"))
        if kind == "thinking":
            return self._add(ch, block.get("thinking"), reasoning=True)
        if kind in ("tool_use", "server_tool_use"):
            call = {k: block.get(k) for k in ("type", "id", "name")}
            call["input"] = block.get("input") if not stream else {}
            ch.calls[i] = call
            if not stream:
                ch.digest.update(orjson.dumps(call["input"]))
            return True
        return False

    def _close_call(self, ch: Choice, i: int) -> None:
        pieces = self._json.pop(i, None)
        call = ch.calls.get(i)
        if pieces is None or call is None:
            return
        raw = "".join(pieces)
        try:
            call["input"] = orjson.loads(raw)
        except orjson.JSONDecodeError:
            call["input"] = raw  # a cut stream: what came

    def _anthropic_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        fresh = usage.get("input_tokens")
        read = usage.get("cache_read_input_tokens")
        wrote = usage.get("cache_creation_input_tokens")
        prompt = None
        if isinstance(fresh, int):
            prompt = fresh + sum(x for x in (read, wrote) if isinstance(x, int))
        self._usage(prompt, usage.get("output_tokens"), read)


def _index(obj: dict[str, Any]) -> int:
    i = obj.get("index")
    return i if isinstance(i, int) else 0
