"""OpenAI Responses event streams and bodies (the shapes of OpenAI's streaming
reference)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from replayer.wire import Api, Reply, ResponsesAccumulator
from tests.helpers.wire import read

pytestmark = pytest.mark.inprocess


def sse(*objs: dict[str, Any]) -> bytes:
    return b"".join(
        b"event: " + o["type"].encode() + b"\ndata: " + orjson.dumps(o) + b"\n\n" for o in objs
    )


ARGS = '{"city":"Paris"}'
FINAL_CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": ARGS,
}
USAGE = {
    "input_tokens": 50,
    "input_tokens_details": {"cached_tokens": 32},
    "output_tokens": 20,
    "output_tokens_details": {"reasoning_tokens": 5},
    "total_tokens": 70,
}
HEAD = (
    {
        "type": "response.created",
        "sequence_number": 0,
        "response": {
            "id": "resp_1",
            "object": "response",
            "status": "in_progress",
            "output": [],
            "usage": None,
        },
    },
    {
        "type": "response.in_progress",
        "sequence_number": 1,
        "response": {"id": "resp_1", "status": "in_progress"},
    },
    {
        "type": "response.output_item.added",
        "output_index": 0,
        "item": {"id": "rs_1", "type": "reasoning", "summary": [], "content": []},
    },
    {
        "type": "response.reasoning_text.delta",
        "item_id": "rs_1",
        "output_index": 0,
        "content_index": 0,
        "delta": "Think",
    },
    {
        "type": "response.output_item.added",
        "output_index": 1,
        "item": {"id": "msg_1", "type": "message", "role": "assistant", "content": []},
    },
    {
        "type": "response.content_part.added",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "part": {"type": "output_text", "text": ""},
    },
    {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "delta": "Hi",
    },
    {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "delta": " there",
    },
    {
        "type": "response.output_text.done",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "text": "Hi there",
    },
    {
        "type": "response.output_item.added",
        "output_index": 2,
        "item": {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": "",
            "status": "in_progress",
        },
    },
    {
        "type": "response.function_call_arguments.delta",
        "item_id": "fc_1",
        "output_index": 2,
        "delta": '{"city":',
    },
    {
        "type": "response.function_call_arguments.delta",
        "item_id": "fc_1",
        "output_index": 2,
        "delta": '"Paris"}',
    },
    {
        "type": "response.function_call_arguments.done",
        "item_id": "fc_1",
        "output_index": 2,
        "arguments": ARGS,
    },
    {
        "type": "response.output_item.done",
        "output_index": 2,
        "item": {**FINAL_CALL, "status": "completed"},
    },
)
STREAM = sse(
    *HEAD,
    {
        "type": "response.completed",
        "response": {"id": "resp_1", "object": "response", "status": "completed", "usage": USAGE},
    },
)


@pytest.mark.parametrize("step", [0, 1, 17])
def test_stream(step):
    r = read(Api.RESPONSES, STREAM, step=step)
    assert (r.text, r.reasoning, r.tool_calls, r.finish_reason) == (
        "Hi there",
        "Think",
        [FINAL_CALL],
        "completed",
    )
    assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (50, 32, 20)
    assert r.done and r.error is None and r.bad == 0
    assert r.chunks == 6  # reasoning, two text pieces, the call's item, two argument pieces
    assert b"response.completed" in ResponsesAccumulator.end_markers


def test_incomplete_failed_and_error_event():
    r = read(
        Api.RESPONSES,
        sse(
            *HEAD,
            {
                "type": "response.incomplete",
                "response": {
                    "status": "incomplete",
                    "incomplete_details": {"reason": "max_output_tokens"},
                    "usage": USAGE,
                },
            },
        ),
    )
    assert (r.finish_reason, r.done, r.error) == ("max_output_tokens", True, None)
    r = read(
        Api.RESPONSES,
        sse(
            *HEAD[:4],
            {
                "type": "response.failed",
                "response": {
                    "status": "failed",
                    "error": {"code": "server_error", "message": "boom"},
                },
            },
        ),
    )
    assert (r.finish_reason, r.done, r.error, r.error_code, r.reasoning) == (
        "failed",
        True,
        "boom",
        "server_error",
        "Think",
    )
    r = read(
        Api.RESPONSES,
        sse(
            *HEAD[:7],
            {
                "type": "error",
                "code": "ERR_X",
                "message": "went wrong",
                "param": None,
                "sequence_number": 9,
            },
        ),
    )
    assert (r.error, r.error_type, r.error_code, r.text, r.done) == (
        "went wrong",
        None,
        "ERR_X",
        "Hi",
        False,
    )


def test_body():
    acc = ResponsesAccumulator(Reply(keep_text=True))
    body = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [
            {
                "type": "reasoning",
                "id": "rs_1",
                "content": [{"type": "reasoning_text", "text": "Think"}],
                "summary": [],
            },
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hi there", "annotations": []}],
            },
            {**FINAL_CALL, "status": "completed"},
        ],
        "usage": USAGE,
    }
    assert acc.body(orjson.dumps(body))
    r = acc.reply
    assert (r.text, r.reasoning, r.tool_calls, r.finish_reason) == (
        "Hi there",
        "Think",
        [FINAL_CALL],
        "completed",
    )
    assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (50, 32, 20)
    assert r.output_hash == read(Api.RESPONSES, STREAM).output_hash
