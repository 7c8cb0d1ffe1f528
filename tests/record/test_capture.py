"""The recorder's response assembly: what it adds to the wire layer (tests/wire)
- gzip bodies, the size bound, bytes counted, first-token time per read, the
end-of-stream check the proxy runs before relaying - on vLLM's wire shapes
(VLLM.md §2.2, §3)."""

from __future__ import annotations

import gzip

import orjson
import pytest

from replayer.record.capture import Capture
from replayer.wire import Api
from tests.helpers.record import TOOL_CALL, tool_body, tool_stream

pytestmark = pytest.mark.inprocess

CHAT_SSE = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
    b'"prompt_token_ids":null,"prompt_text":null}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,'
    b'"token_ids":null}]}\n\n'
    b": keep-alive\n\n"
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop",'
    b'"stop_reason":null,"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":120345,"total_tokens":120347,"completion_tokens":2,'
    b'"prompt_tokens_details":{"cached_tokens":118784}},"system_fingerprint":"vllm-0.33.0"}\n\n'
    b"data: [DONE]\n\n"
)


def assemble(data: bytes, *, chat: bool = True, sse: bool = True, step: int = 0, **kw):
    cap = Capture(Api.CHAT if chat else Api.COMPLETIONS, sse=sse, **kw)
    if step:
        for i in range(0, len(data), step):
            cap.feed(data[i : i + step], i)
    else:
        cap.feed(data, 0)
    return cap, cap.finish()


def test_chat_stream_text_usage_and_cached_tokens():
    cap, r = assemble(CHAT_SSE)
    assert (r.text, r.finish_reason, r.done, r.events) == ("Hello!", "stop", True, 4)
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (120345, 2, 118784)
    assert r.error is None and r.tool_calls is None and r.bad == 0
    assert cap.bytes == len(CHAT_SSE)


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64])
def test_events_split_anywhere_assemble_the_same(step):
    cap, r = assemble(CHAT_SSE, step=step)
    assert (r.text, r.finish_reason, r.cached_tokens, r.events) == ("Hello!", "stop", 118784, 4)
    # the first token is the chunk that completed the "Hello" event, not the role chunk
    end_of_hello = CHAT_SSE.index(b'"Hello"')
    assert cap.first_token_ns is not None and cap.first_token_ns >= end_of_hello - step


def test_crlf_framing_and_unterminated_last_event():
    # an event the upstream cut before its blank line is dropped, as a client
    # drops it (the recorder used to count it: tests/wire/test_sse.py)
    data = CHAT_SSE.replace(b"\n", b"\r\n").replace(b"data: [DONE]\r\n\r\n", b"")
    _, r = assemble(data[: -len(b"\r\n\r\n")] + b'\r\n\r\ndata: {"choices":[]}')
    assert r.text == "Hello!" and r.done is False and r.events == 4


def test_tool_call_fragments_accumulate_like_the_sdk():
    _, r = assemble(b"".join(tool_stream()), step=5)
    assert r.tool_calls == [TOOL_CALL]
    assert (r.text, r.finish_reason, r.cached_tokens) == ("", "tool_calls", 96)
    assert r.message() == {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]}


def test_json_bodies_chat_tool_calls_completion_and_errors():
    _, r = assemble(orjson.dumps(tool_body()), sse=False, step=10)
    assert r.tool_calls == [TOOL_CALL] and r.finish_reason == "tool_calls"
    # content null assembles as "", as a stream of the same reply does
    assert (r.text, r.prompt_tokens, r.cached_tokens) == ("", 120, 96)
    assert r.message() == {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]}

    body = {"choices": [{"index": 0, "text": " done", "finish_reason": "stop"}]}
    _, r = assemble(orjson.dumps(body), chat=False, sse=False)
    assert (r.text, r.finish_reason) == (" done", "stop")

    err = b'{"error":{"message":"The model `x` does not exist.","type":"NotFoundError","code":404}}'
    cap = Capture(Api.CHAT, sse=False)
    cap.feed(err, 0)
    r = cap.finish(404)
    assert (r.error, r.error_type, r.error_code) == (
        "The model `x` does not exist.",
        "NotFoundError",
        404,
    )
    cap = Capture(Api.CHAT, sse=False)
    cap.feed(b"Internal Server Error", 0)
    assert cap.finish(500).error == "Internal Server Error"


def test_gzip_body_is_decoded_for_assembly_only():
    raw = gzip.compress(orjson.dumps(tool_body()))
    cap, r = assemble(raw, sse=False, step=9, encoding="gzip")
    assert r.tool_calls == [TOOL_CALL] and cap.bytes == len(raw)
    _, r = assemble(raw, sse=False, encoding="br")
    assert r.truncated and r.tool_calls is None


def test_garbage_is_counted_not_fatal():
    _, r = assemble(b"data: {not json\n\ndata: [1,2]\n\n" + CHAT_SSE)
    assert (r.bad, r.text) == (2, "Hello!")
    _, r = assemble(b"x" * 100, sse=False, limit=10)
    assert r.truncated and r.text is None


def test_the_end_is_seen_in_the_read_that_holds_it():
    # the proxy parses a read before relaying it once the stream may end in it,
    # so the reply is known before the client sees [DONE] and sends its next turn
    stop = CHAT_SSE.index(b"\n\n", CHAT_SSE.index(b'"finish_reason":"stop"')) + 2
    cap = Capture(Api.CHAT, sse=True)
    cap.feed(CHAT_SSE[: stop - 1], 1)
    assert not cap.finishing and not cap.may_end(b"data: {}")
    assert cap.may_end(b"data: [DONE]\n\n")
    cap.feed(CHAT_SSE[stop - 1 : stop + 10], 2)
    assert cap.finishing and cap.may_end(b"") and not cap.done
    cap.feed(CHAT_SSE[stop + 10 :], 3)
    assert cap.done and cap.reply().text == "Hello!" and cap.first_token_ns == 1


def test_an_unterminated_line_past_the_bound_stops_the_assembly():
    first = CHAT_SSE[: CHAT_SSE.index(b"\n\n") + 2]
    cap = Capture(Api.CHAT, sse=True, limit=100)
    cap.feed(first + b"data: " + b"x" * 200, 0)  # a complete event, then no line end
    cap.feed(b"\n\n" + CHAT_SSE, 1)
    r = cap.finish()
    assert r.truncated and r.events == 1 and cap.bytes == len(first) + 206 + 2 + len(CHAT_SSE)
