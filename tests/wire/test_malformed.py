"""Nothing a server sends makes the wire layer raise: the recorder must keep
relaying, the replay must keep its result. Arbitrary JSON built from the
APIs' own keys, as events and as bodies, through every accumulator."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayer.wire import ACCUMULATORS, Event, Reply

pytestmark = pytest.mark.inprocess

KEYS = [
    "choices", "index", "delta", "message", "content", "text", "reasoning", "reasoning_content",
    "tool_calls", "function", "name", "arguments", "id", "type", "finish_reason", "usage",
    "prompt_tokens", "completion_tokens", "prompt_tokens_details", "cached_tokens", "error",
    "object", "code", "detail", "content_block", "partial_json", "stop_reason", "input",
    "input_tokens", "output_tokens", "cache_read_input_tokens", "response", "output",
    "output_index", "item", "status", "incomplete_details", "reason", "summary",
]  # fmt: skip
TYPES = [
    "error", "message_start", "content_block_start", "content_block_delta", "content_block_stop",
    "message_delta", "message_stop", "text_delta", "thinking_delta", "input_json_delta",
    "tool_use", "text", "thinking", "function_call", "response.output_text.delta",
    "response.function_call_arguments.delta", "response.output_item.added",
    "response.output_item.done", "response.completed", "response.failed", "reasoning",
]  # fmt: skip
_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False),
    st.text(max_size=5), st.sampled_from(TYPES),
)  # fmt: skip
_json = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(KEYS), inner, max_size=5),
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_json, min_size=1, max_size=6), st.sampled_from(sorted(ACCUMULATORS)))
def test_arbitrary_objects_never_raise(objs: list[Any], api: Any) -> None:
    acc = ACCUMULATORS[api](Reply(keep_text=True))
    for t, obj in enumerate(objs):
        acc.event(Event(orjson.dumps(obj)), float(t))
    acc.body(orjson.dumps(objs[0]), 200)
    acc.body(orjson.dumps(objs[-1]), 500)
    r = acc.reply
    summary = (r.text, r.reasoning, r.tool_calls, r.finish_reason, r.output_hash, r.finishing)
    assert len(summary) == 6
    assert r.message()["role"] == r.assistant_message()["role"] == "assistant"
