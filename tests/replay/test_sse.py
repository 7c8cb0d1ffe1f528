"""The event-stream decoder and stream accounting, on vLLM's exact bytes."""

from __future__ import annotations

import pytest

from replayer.replay.sse import SSEDecoder, StreamStats

# VLLM.md §3.2: a chat stream with include_usage and prompt token details
CHAT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,'
    b'"token_ids":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop",'
    b'"stop_reason":null,"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[],"usage":{"prompt_tokens":120345,"total_tokens":120347,'
    b'"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":118784}},'
    b'"system_fingerprint":"vllm-0.33.0-tp8-3f9a1c2e"}\n\n'
    b"data: [DONE]\n\n"
)
ERROR_TAIL = (
    b'data: {"error":{"message":"The server had an error while processing your request.",'
    b'"type":"InternalServerError","param":null,"code":500}}\n\ndata: [DONE]\n\n'
)


def events(data: bytes, pieces: int) -> list[bytes]:
    dec = SSEDecoder()
    step = max(1, len(data) // pieces)
    out: list[bytes] = []
    for i in range(0, len(data), step):
        out.extend(dec.feed(data[i : i + step]))
    return out


@pytest.mark.parametrize("pieces", [1, 7, 100, len(CHAT)])
def test_decoder_is_independent_of_chunking(pieces):
    got = events(CHAT, pieces)
    assert len(got) == 5
    assert got[-1] == b"[DONE]"
    assert got == events(CHAT, 1)


def test_decoder_line_rules():
    dec = SSEDecoder()
    got = list(dec.feed(b": keep-alive\n\ndata:a\ndata: b\r\n\r\nevent: x\nid: 7\ndata: c\r"))
    assert got == [b"a\nb"]
    # a CR at the end of what arrived may be half of a CRLF: it waits
    assert list(dec.feed(b"\r")) == []
    assert list(dec.feed(b"\n")) == [b"c"]  # CR, then CRLF: line end, empty line
    assert list(dec.feed(b"data: tail")) == []
    assert dec.pending
    assert dec.close() is None  # an unterminated line is no event


def test_chat_stream_accounting():
    st = StreamStats()
    st.keep_text()
    for t, e in enumerate(events(CHAT, 3)):
        st.event(e, float(t))
    # the role chunk carries no output; two content chunks do
    assert (st.chunks, st.first_token, st.last_token) == (2, 1.0, 2.0)
    assert st.done and st.error is None and st.finish_reason == "stop"
    assert (st.prompt_tokens, st.completion_tokens, st.cached_tokens) == (120345, 2, 118784)
    assert "".join(st.text or []) == "Hello!"
    assert st.assistant_message() == {"role": "assistant", "content": "Hello!"}
    same = StreamStats()
    for e in events(CHAT, 1):
        same.event(e, 0.0)
    assert same.output_hash == st.output_hash  # the hash is of the text alone


def test_error_event_then_done():
    st = StreamStats()
    for e in events(CHAT[: CHAT.index(b"data", 200)] + ERROR_TAIL, 5):
        st.event(e, 0.0)
    assert st.done
    assert st.error == {
        "message": "The server had an error while processing your request.",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
    old = StreamStats()  # < 0.10.1 flat error objects
    old.event(b'{"object":"error","message":"boom","type":"BadRequestError","code":400}', 0)
    assert old.error is not None and old.error["message"] == "boom"


def test_completions_and_tool_calls():
    st = StreamStats()
    st.event(b'{"choices":[{"index":0,"text":" world","finish_reason":null}]}', 1.0)
    st.event(b'{"choices":[{"index":0,"text":"","finish_reason":"length"}]}', 2.0)
    assert (st.chunks, st.finish_reason) == (1, "length")
    tc = StreamStats()
    tc.event(
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1",'
        b'"type":"function","function":{"name":"ls","arguments":""}}]}}]}',
        1.0,
    )
    tc.event(
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        b'"function":{"arguments":"{\\"p\\":1}"}}]}}]}',
        2.0,
    )
    assert tc.chunks == 2
    assert tc.assistant_message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"p":1}'}}
        ],
    }


def test_whole_body():
    st = StreamStats()
    st.whole(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Done."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 5,
                "total_tokens": 7,
                "completion_tokens": 2,
                "prompt_tokens_details": None,
            },
        }
    )
    assert (st.finish_reason, st.prompt_tokens, st.completion_tokens, st.cached_tokens) == (
        "stop",
        5,
        2,
        None,
    )
