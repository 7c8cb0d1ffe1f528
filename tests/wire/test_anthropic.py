"""Anthropic Messages event streams and bodies (the shapes of Anthropic's
streaming documentation, which vLLM's ``/v1/messages`` follows)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from replayer.wire import Api, MessagesAccumulator, Reply
from tests.helpers.wire import read

pytestmark = pytest.mark.inprocess


def sse(*objs: dict[str, Any]) -> bytes:
    return b"".join(
        b"event: " + o["type"].encode() + b"\ndata: " + orjson.dumps(o) + b"\n\n" for o in objs
    )


def delta(i: int, **d: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": i, "delta": d}


EVENTS = (
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "m",
            "stop_reason": None,
            "usage": {
                "input_tokens": 25,
                "cache_creation_input_tokens": 3,
                "cache_read_input_tokens": 100,
                "output_tokens": 1,
            },
        },
    },
    {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "thinking", "thinking": ""},
    },
    delta(0, type="thinking_delta", thinking="Let me see."),
    delta(0, type="signature_delta", signature="EqQB"),
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    {"type": "ping"},
    delta(1, type="text_delta", text="Hello"),
    delta(1, type="text_delta", text="!"),
    {"type": "content_block_stop", "index": 1},
    {
        "type": "content_block_start",
        "index": 2,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
    },
    delta(2, type="input_json_delta", partial_json=""),
    delta(2, type="input_json_delta", partial_json='{"location": "San'),
    delta(2, type="input_json_delta", partial_json=' Francisco"}'),
    {"type": "content_block_stop", "index": 2},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 89},
    },
    {"type": "message_stop"},
)
STREAM = sse(*EVENTS)
CALL = {
    "type": "tool_use",
    "id": "toolu_1",
    "name": "get_weather",
    "input": {"location": "San Francisco"},
}


@pytest.mark.parametrize("step", [0, 1, 13])
def test_stream(step):
    r = read(Api.MESSAGES, STREAM, step=step)
    assert (r.text, r.reasoning, r.tool_calls, r.finish_reason) == (
        "Hello!",
        "Let me see.",
        [CALL],
        "tool_use",
    )
    assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (128, 100, 89)
    assert r.done and r.error is None and r.bad == 0
    # output: the thinking, two text pieces, the tool_use block's start, two JSON pieces
    assert r.chunks == 6 and r.first_token is not None
    assert r.output_hash == read(Api.MESSAGES, STREAM, keep_text=False).output_hash
    # the end comes without [DONE]
    assert MessagesAccumulator.end_markers == (b"message_stop",)


def test_a_cut_stream_keeps_the_tool_input_it_got():
    r = read(Api.MESSAGES, sse(*EVENTS[:13]))  # through the first piece of the input
    assert not r.done and r.finish_reason is None
    assert r.tool_calls == [{**CALL, "input": {}}]  # the block never ended
    r = read(Api.MESSAGES, sse(*EVENTS[:13], {"type": "message_stop"}))
    assert r.tool_calls == [{**CALL, "input": '{"location": "San'}] and r.done  # not JSON: as is


def test_error_event():
    dead = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    r = read(Api.MESSAGES, sse(*EVENTS[:4], dead))
    assert (r.error, r.error_type, r.reasoning, r.done) == (
        "Overloaded",
        "overloaded_error",
        "Let me see.",
        False,
    )


def test_body():
    acc = MessagesAccumulator(Reply(keep_text=True))
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "x"},
            {"type": "text", "text": "Hi"},
            CALL,
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 4},
    }
    assert acc.body(orjson.dumps(body))
    r = acc.reply
    assert (r.text, r.reasoning, r.tool_calls, r.finish_reason) == (
        "Hi",
        "hm",
        [{**CALL}],
        "tool_use",
    )
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (10, 4, None)
    err = MessagesAccumulator()
    err.body(b'{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}', 400)
    assert (err.reply.error, err.reply.error_type) == ("bad", "invalid_request_error")
