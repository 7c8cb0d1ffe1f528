"""OpenAI chat completions and completions (VLLM.md §3).

Chat chunks carry ``choices[i].delta``: ``content``, ``reasoning`` (vLLM
0.33; ``reasoning_content`` before, and some versions sent both with the
same text: the first present is taken), and ``tool_calls`` fragments
(indexed; merged as the ``openai`` SDK's ``accumulate_delta`` does:
strings concatenated, ``index`` and ``type`` not). Completions chunks carry
``choices[i].text``. The role chunk (``{"role": "assistant", "content":
""}``) carries no output, so the first token is the first chunk with text,
reasoning or a tool-call fragment. ``usage`` comes in the last chunk (or in
every chunk with ``continuous_usage_stats``), ``prompt_tokens_details
.cached_tokens`` only with ``--enable-prompt-tokens-details``. With
``--per-request-spec-decode-metrics`` and speculative decoding, vLLM 0.32 adds
``metrics.speculative_decoding`` beside the usage (the body's, or the stream's
final usage chunk, so only with ``include_usage``); its Responses and Messages
endpoints send none.
"""

from __future__ import annotations

from typing import Any

from replayer.wire.base import Accumulator, Api, text_piece
from replayer.wire.reply import Choice

_REASONING = ("reasoning", "reasoning_content")


class _Choices(Accumulator):
    __slots__ = ()

    def _event(self, obj: dict[str, Any], name: str) -> bool:
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._openai_usage(usage)
            self._spec_decode(obj)
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return False
        produced = False
        reply = self.reply
        by_choice = reply.by_choice
        for c in choices:
            if not isinstance(c, dict):
                continue
            index = c.get("index", 0)
            ch = by_choice.get(index) if type(index) is int else None
            if ch is None:
                ch = reply.choice(index)
            if self._piece(ch, c):
                produced = True
            fr = c.get("finish_reason")
            if isinstance(fr, str) and fr:
                ch.finish = fr
        return produced

    def _body(self, obj: dict[str, Any]) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._openai_usage(usage)
            self._spec_decode(obj)
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return
        for c in choices:
            if not isinstance(c, dict):
                continue
            ch = self.reply.choice(c.get("index", 0))
            self._whole(ch, c)
            fr = c.get("finish_reason")
            if isinstance(fr, str) and fr:
                ch.finish = fr

    def _piece(self, ch: Choice, c: dict[str, Any]) -> bool:
        raise NotImplementedError

    def _whole(self, ch: Choice, c: dict[str, Any]) -> None:
        raise NotImplementedError

    def _openai_usage(self, usage: dict[str, Any]) -> None:
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        self._usage(usage.get("prompt_tokens"), usage.get("completion_tokens"), cached)


class ChatAccumulator(_Choices):
    """``/v1/chat/completions``: ``chat.completion.chunk`` events, ``chat.completion`` bodies."""

    api = Api.CHAT
    __slots__ = ()

    def _piece(self, ch: Choice, c: dict[str, Any]) -> bool:
        delta = c.get("delta")
        if not isinstance(delta, dict):
            return False
        return self._message(ch, delta, stream=True)

    def _whole(self, ch: Choice, c: dict[str, Any]) -> None:
        msg = c.get("message")
        if isinstance(msg, dict):
            self._message(ch, msg, stream=False)

    def _message(self, ch: Choice, m: dict[str, Any], *, stream: bool) -> bool:
        # tool-call arguments are hashed before the text of the same delta, as
        # replayer always did: stored output hashes stay comparable
        produced = False
        calls = m.get("tool_calls")
        if calls and isinstance(calls, list):
            for k, frag in enumerate(calls):
                if not isinstance(frag, dict):
                    continue
                produced = True
                if stream:
                    i = frag.get("index", len(ch.calls))
                    merge_delta(ch.calls.setdefault(i if isinstance(i, int) else 0, {}), frag)
                else:
                    ch.calls[k] = frag
                fn = frag.get("function")
                args = text_piece(fn.get("arguments")) if isinstance(fn, dict) else None
                if args is not None:
                    ch.digest.update(args.encode())
        for key in _REASONING:
            v = m.get(key)
            if v and self._add(ch, v, reasoning=True):
                produced = True
                break
        v = m.get("content")
        return bool(v and self._add(ch, v)) or produced


class CompletionsAccumulator(_Choices):
    """``/v1/completions``: ``text_completion`` events and bodies."""

    api = Api.COMPLETIONS
    __slots__ = ()

    def _piece(self, ch: Choice, c: dict[str, Any]) -> bool:
        return self._add(ch, c.get("text"))

    def _whole(self, ch: Choice, c: dict[str, Any]) -> None:
        self._piece(ch, c)


def merge_delta(acc: dict[str, Any], delta: dict[str, Any]) -> None:
    """Merge one streamed fragment into ``acc`` (the ``openai`` SDK's
    ``accumulate_delta``): strings concatenated, objects merged, ``index``
    dropped, ``type`` kept from the first fragment, nulls skipped."""
    for key, value in delta.items():
        if key == "index" or value is None:
            continue
        cur = acc.get(key)
        if cur is None:
            if isinstance(value, dict):
                acc[key] = {}
                merge_delta(acc[key], value)
            else:
                acc[key] = value
        elif key == "type":
            continue
        elif isinstance(cur, str) and isinstance(value, str):
            acc[key] = cur + value
        elif isinstance(cur, dict) and isinstance(value, dict):
            merge_delta(cur, value)
        else:
            acc[key] = value
