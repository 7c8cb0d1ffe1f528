"""OpenAI chat completions and completions, streamed and whole, on vLLM's exact
shapes; where the replay's and the recorder's old accumulators disagreed, the
case is here with the side that was right."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from replayer.wire import Api, ChatAccumulator, CompletionsAccumulator, Event, Reply, merge_delta
from tests.helpers.wire import CHAT, CHAT_DEAD, COMPLETIONS, COMPLETIONS_DEAD, read

pytestmark = pytest.mark.inprocess


def sha16(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def events(*choices_per_event: list[dict[str, Any]], **extra: Any) -> bytes:
    return b"".join(
        b"data: " + orjson.dumps({"choices": c, **extra}) + b"\n\n" for c in choices_per_event
    )


def chat(*objs: dict[str, Any]) -> Reply:
    acc = ChatAccumulator(Reply(keep_text=True))
    for t, obj in enumerate(objs):
        acc.event(Event(orjson.dumps(obj)), float(t))
    return acc.reply


# -- streams ------------------------------------------------------------------------


@pytest.mark.parametrize("step", [0, 1, 7, 64])
def test_vllm_chat_stream(step):
    r = read(Api.CHAT, CHAT, step=step)
    assert (r.text, r.finish_reason, r.done, r.events, r.chunks) == ("Hello!", "stop", True, 4, 2)
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (120345, 2, 118784)
    assert r.error is None and r.tool_calls is None and r.bad == 0 and r.choices == 1
    # the first token is the read that completed the "Hello" event, not the role chunk
    hello_end = CHAT.index(b"\n\n", CHAT.index(b'"Hello"')) + 1  # its last byte
    assert (
        r.first_token is not None and hello_end - (step or len(CHAT)) < r.first_token <= hello_end
    )
    assert r.output_hash == sha16("Hello!")  # as replayer always hashed it


def test_timing_of_output_events():
    r = chat(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"content": "a"}}]},
        {"choices": [{"index": 0, "delta": {"content": "b"}}]},
        {"choices": [], "usage": {"prompt_tokens": 1}},
        {"choices": [{"index": 0, "delta": {"content": "c"}}]},
    )
    assert (r.chunks, r.first_token, r.last_token, r.gap_sum, r.gap_max) == (3, 1.0, 4.0, 3.0, 2.0)


def test_the_text_is_kept_only_when_asked():
    r = read(Api.CHAT, CHAT, keep_text=False)
    assert r.text is None and r.output_hash == sha16("Hello!") and r.chunks == 2


@pytest.mark.parametrize("tail", [CHAT_DEAD, COMPLETIONS_DEAD])
def test_dead_engine_event_after_tokens(tail):
    r = read(Api.CHAT, CHAT[: CHAT.index(b"data", 300)] + tail, step=5)
    assert r.error == "The server had an error while processing your request."
    assert (r.error_type, r.error_code, r.text, r.done) == (
        "InternalServerError",
        500,
        "Hello",
        True,
    )
    assert r.finish_reason is None and r.finishing


def test_flat_error_of_old_vllm_and_error_null():
    r = chat({"object": "error", "message": "boom", "type": "BadRequestError", "code": 400})
    assert (r.error, r.error_type, r.error_code) == ("boom", "BadRequestError", 400)
    # The replay's accumulator took any "error" key for an error; ``null`` is none.
    r = chat({"error": None, "choices": [{"index": 0, "delta": {"content": "x"}}]})
    assert r.error is None and r.text == "x"


def test_reasoning_is_not_text():
    # The replay's accumulator appended reasoning to the text (so live mode sent
    # the model's thinking back as the assistant's content), and counted a
    # delta carrying both spellings twice. The recorder was right: reasoning
    # apart, the first spelling present taken. The hash still covers it.
    r = chat(
        {
            "choices": [
                {"index": 0, "delta": {"reasoning": "think ", "reasoning_content": "think "}}
            ]
        },
        {"choices": [{"index": 0, "delta": {"reasoning_content": "more"}}]},
        {"choices": [{"index": 0, "delta": {"content": "answer"}, "finish_reason": "stop"}]},
    )
    assert (r.text, r.reasoning, r.chunks) == ("answer", "think more", 3)
    assert r.assistant_message() == {"role": "assistant", "content": "answer"}
    assert r.output_hash == sha16("think moreanswer")


def test_tool_call_fragments_merge_like_the_sdk():
    head = {"index": 0, "id": "c1", "type": "function", "function": {"name": "ls", "arguments": ""}}
    r = chat(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [head]}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"p"'}}]},
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "type": "function", "function": {"arguments": ":1}"}}
                        ]
                    },
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"p":1}'}}
    assert r.tool_calls == [call] and r.chunks == 3 and r.finish_reason == "tool_calls"
    # the recorder's message (session matching) and live mode's differ in content only
    assert r.message() == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert r.assistant_message() == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert r.output_hash == sha16('{"p":1}')


def test_live_mode_tool_calls_have_a_request_shape():
    # a server that sends no type and no arguments: the old replay accumulator's
    # normal form (id, type "function", name and arguments strings) is kept
    r = chat({"choices": [{"index": 0, "delta": {"tool_calls": [{"function": {"name": "x"}}]}}]})
    assert r.tool_calls == [{"function": {"name": "x"}}]
    assert r.assistant_message()["tool_calls"] == [
        {"id": None, "type": "function", "function": {"name": "x", "arguments": ""}}
    ]


def test_merge_delta():
    acc: dict[str, Any] = {}
    merge_delta(acc, {"index": 0, "id": "a", "type": "function", "function": {"name": "f"}})
    merge_delta(acc, {"index": 0, "id": "b", "type": "other", "function": {"arguments": "1"}})
    merge_delta(acc, {"function": {"arguments": "2", "name": None}, "n": 1})
    merge_delta(acc, {"n": 2})
    assert acc == {
        "id": "ab",
        "type": "function",
        "function": {"name": "f", "arguments": "12"},
        "n": 2,
    }


def test_several_choices():
    # The replay's accumulator merged every choice into one text, hash and
    # finish reason; a client reads choices[0]: the recorder was right.
    # The hash is per choice, so it does not depend on how choices interleave.
    a = events(
        [{"index": 0, "delta": {"content": "zero"}}],
        [{"index": 1, "delta": {"content": "one"}, "finish_reason": "length"}],
        [{"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"}],
    )
    b = events(
        [{"index": 1, "delta": {"content": "one"}, "finish_reason": "length"}],
        [{"index": 0, "delta": {"content": "zero"}}],
        [{"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"}],
    )
    ra, rb = read(Api.CHAT, a), read(Api.CHAT, b)
    assert (ra.text, ra.finish_reason, ra.choices, ra.chunks) == ("zero!", "stop", 2, 3)
    assert ra.output_hash == rb.output_hash != sha16("zero!")


def test_usage_values_are_checked():
    # The replay's accumulator stored whatever ``usage`` held (null, strings);
    # the recorder kept ints only. Continuous usage: the last chunk's wins.
    r = chat(
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}},
        {"choices": [], "usage": {"prompt_tokens": None, "completion_tokens": "2"}},
        {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens_details": None}},
        {"choices": [], "usage": {"completion_tokens": True}},
    )
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (7, 3, None)


def test_keyed_by_api():
    # The replay's accumulator read ``delta`` and ``text`` whatever the endpoint;
    # each API's accumulator reads its own shape only.
    mixed = events([{"index": 0, "delta": {"content": "chat"}, "text": "completion"}])
    assert read(Api.CHAT, mixed).text == "chat"
    assert read(Api.COMPLETIONS, mixed).text == "completion"


def test_vllm_completions_stream():
    r = read(Api.COMPLETIONS, COMPLETIONS, step=3)
    assert (r.text, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.chunks) == (
        " world!",
        "length",
        5,
        16,
        2,
    )
    assert r.done and r.output_hash == sha16(" world!")


def test_garbage_is_counted_not_fatal():
    r = read(Api.CHAT, b"data: {not json\n\ndata: [1,2]\n\ndata:\n\n" + CHAT)
    assert (r.bad, r.events, r.text) == (3, 7, "Hello!")


# -- whole bodies -------------------------------------------------------------------

TOOL = {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_chat_body():
    acc = ChatAccumulator(Reply(keep_text=True))
    body = {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "reasoning": "hm",
                    "tool_calls": [TOOL],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 5,
            "total_tokens": 7,
            "completion_tokens": 2,
            "prompt_tokens_details": None,
        },
    }
    assert acc.body(orjson.dumps(body))
    r = acc.reply
    # content null assembles as "", as a stream of the same reply does
    assert (r.text, r.reasoning, r.tool_calls, r.finish_reason) == ("", "hm", [TOOL], "tool_calls")
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.first_token) == (
        5,
        2,
        None,
        None,
    )
    assert r.output_hash == sha16("{}hm")


def test_completions_body():
    acc = CompletionsAccumulator(Reply(keep_text=True))
    acc.body(b'{"choices":[{"index":0,"text":" done","finish_reason":"stop"}]}')
    assert (acc.reply.text, acc.reply.finish_reason) == (" done", "stop")


@pytest.mark.parametrize(
    ("raw", "status", "ok", "error", "kind", "code"),
    [
        (
            b'{"error":{"message":"no model","type":"NotFoundError","code":404}}',
            404,
            True,
            "no model",
            "NotFoundError",
            404,
        ),
        (
            b'{"error":{"message":"dead","type":"InternalServerError","code":500}}',
            200,
            True,
            "dead",
            "InternalServerError",
            500,
        ),
        (b'{"detail":"Not Found"}', 404, True, "Not Found", None, None),
        (b'{"error":"Unauthorized"}', 401, True, "Unauthorized", None, None),
        (b'{"unexpected":1}', 502, True, '{"unexpected":1}', None, None),
        (b"Internal Server Error", 500, False, "Internal Server Error", None, None),
        (b"[1]", 503, False, "[1]", None, None),
    ],
)
def test_error_bodies(raw, status, ok, error, kind, code):
    acc = ChatAccumulator()
    assert acc.body(raw, status) is ok
    r = acc.reply
    assert (r.error, r.error_type, r.error_code, r.bad) == (error, kind, code, 0)


def test_a_body_that_is_not_an_object():
    for raw in (b"[1,2]", b"nope"):
        acc = ChatAccumulator()
        assert acc.body(raw) is False and acc.reply.bad == 1 and acc.reply.error is None


# -- per-request speculative decoding (vLLM --per-request-spec-decode-metrics) ------------

# vLLM 0.32's SpeculativeDecodingMetrics (vllm/entrypoints/generate/base/protocol.py), as
# RequestSpecDecodeMetrics.to_dict builds it (vllm/v1/metrics/stats.py): k = 3, five
# verify steps accepting 0, 0, 1, 3, 3 draft tokens
SPEC = (
    b'{"mean_acceptance_length":2.4,"draft_acceptance_rate":0.4666666666666667,'
    b'"acceptance_histogram":[2,1,0,2],"num_spec_steps":5,"num_accepted_draft_tokens":7,'
    b'"num_draft_tokens":15,"num_spec_tokens":3'
)
# the chat stream's final usage chunk: model_dump_json(exclude_unset=True, exclude_none=True)
# (vllm/entrypoints/openai/chat_completion/serving.py); metrics rides on it, after usage
CHAT_USAGE_CHUNK = (
    b'{"id":"chatcmpl-9f","object":"chat.completion.chunk","created":1796551768,'
    b'"model":"tiny","choices":[],"usage":{"prompt_tokens":12,"total_tokens":18,'
    b'"completion_tokens":6},"metrics":{"speculative_decoding":' + SPEC + b"}}}"
)
# completions: exclude_unset=False, exclude_none=True (completion/serving.py)
COMPLETIONS_USAGE_CHUNK = (
    b'{"id":"cmpl-9f","object":"text_completion","created":1796551768,"model":"tiny",'
    b'"choices":[],"usage":{"prompt_tokens":12,"total_tokens":18,"completion_tokens":6},'
    b'"metrics":{"speculative_decoding":' + SPEC + b"}}}"
)
# a body is JSONResponse(model_dump()): nulls kept, the `detailed` arrays null at `summary`
BODY_METRICS = (
    b'"metrics":{"time_to_first_token_ms":null,"generation_time_ms":null,'
    b'"queue_time_ms":null,"mean_itl_ms":null,"tokens_per_second":null,'
    b'"speculative_decoding":' + SPEC + b',"per_step_accepted":null,"per_step_drafted":null}}'
)
CHAT_BODY = (
    b'{"id":"chatcmpl-9f","object":"chat.completion","created":1796551768,"model":"tiny",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"a b c d e f",'
    b'"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],'
    b'"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,'
    b'"token_ids":null,"routed_experts":null}],"service_tier":null,'
    b'"system_fingerprint":null,"usage":{"prompt_tokens":12,"total_tokens":18,'
    b'"completion_tokens":6,"prompt_tokens_details":null},"prompt_logprobs":null,'
    b'"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,'
    b'"ec_transfer_params":null,' + BODY_METRICS + b"}"
)
COMPLETIONS_BODY = (
    b'{"id":"cmpl-9f","object":"text_completion","created":1796551768,"model":"tiny",'
    b'"choices":[{"index":0,"text":"a b c d e f","logprobs":null,"finish_reason":"length",'
    b'"stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,'
    b'"routed_experts":null}],"service_tier":null,"system_fingerprint":null,'
    b'"usage":{"prompt_tokens":12,"total_tokens":18,"completion_tokens":6,'
    b'"prompt_tokens_details":null},"kv_transfer_params":null,"ec_transfer_params":null,'
    + BODY_METRICS
    + b"}"
)


def spec_of(r: Reply) -> tuple[int | None, int | None, int | None]:
    return (r.spec_drafts, r.spec_draft_tokens, r.spec_accepted_tokens)


@pytest.mark.parametrize(
    ("acc_type", "delta", "usage_chunk"),
    [
        (ChatAccumulator, {"delta": {"content": "a b c d e f"}}, CHAT_USAGE_CHUNK),
        (CompletionsAccumulator, {"text": "a b c d e f"}, COMPLETIONS_USAGE_CHUNK),
    ],
)
def test_per_request_spec_decode_from_the_streams_usage_chunk(acc_type, delta, usage_chunk):
    acc = acc_type(Reply())
    acc.event(Event(orjson.dumps({"choices": [{"index": 0, **delta}]})), 0.0)
    assert spec_of(acc.reply) == (None, None, None)  # not before the usage chunk
    acc.event(Event(usage_chunk), 1.0)
    acc.event(Event(b"[DONE]"), 1.0)
    r = acc.reply
    assert spec_of(r) == (5, 15, 7)
    assert (r.completion_tokens, r.chunks, r.done) == (6, 1, True)


@pytest.mark.parametrize(
    ("acc_type", "body"),
    [(ChatAccumulator, CHAT_BODY), (CompletionsAccumulator, COMPLETIONS_BODY)],
)
def test_per_request_spec_decode_from_a_whole_body(acc_type, body):
    acc = acc_type(Reply(keep_text=True))
    assert acc.body(body) is True
    assert spec_of(acc.reply) == (5, 15, 7)
    assert acc.reply.text == "a b c d e f"
    # the `detailed` level adds the per-step arrays; the totals read the same
    detailed = body.replace(
        b'"per_step_accepted":null,"per_step_drafted":null',
        b'"per_step_accepted":[0,3,1,0,3],"per_step_drafted":[3,3,3,3,3]',
    )
    again = acc_type(Reply())
    again.body(detailed)
    assert spec_of(again.reply) == (5, 15, 7)


@pytest.mark.parametrize(
    "metrics",
    [
        b"null",  # the server has per-request metrics off
        b'{"time_to_first_token_ms":12.5,"generation_time_ms":40.0,"queue_time_ms":0.1,'
        b'"mean_itl_ms":8.0,"tokens_per_second":150.0,"speculative_decoding":null}',
        b'{"speculative_decoding":{"num_spec_steps":"5","num_draft_tokens":true}}',
        b'"odd"',
    ],
)
def test_no_per_request_spec_decode_reads_as_none(metrics):
    body = CHAT_BODY.replace(
        CHAT_BODY[CHAT_BODY.index(b'"metrics":') : -1], b'"metrics":' + metrics
    )
    acc = ChatAccumulator()
    assert acc.body(body) is True
    assert spec_of(acc.reply) == (None, None, None) and acc.reply.bad == 0
    plain = ChatAccumulator()
    plain.event(Event(CHAT_USAGE_CHUNK.replace(b',"metrics"', b',"x"')), 0.0)
    assert spec_of(plain.reply) == (None, None, None)
