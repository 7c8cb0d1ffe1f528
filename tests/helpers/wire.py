"""Streams in the servers' exact wire shapes (VLLM.md §2.2, §3), shared by the
wire-layer tests, and helpers to run bytes through decoder and accumulator."""

from __future__ import annotations

from replayer.wire import Api, Reply, SSEDecoder, accumulator

# VLLM.md §3.2: a chat stream with include_usage and prompt token details
CHAT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,'
    b'"token_ids":null}]}\n\n'
    b": keep-alive\n\n"
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop",'
    b'"stop_reason":null,"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[],"usage":{"prompt_tokens":120345,"total_tokens":120347,'
    b'"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":118784}},'
    b'"system_fingerprint":"vllm-0.33.0-tp8-3f9a1c2e"}\n\n'
    b"data: [DONE]\n\n"
)
# VLLM.md §2.2: the dead engine's event in a chat stream (compact JSON) ...
CHAT_DEAD = (
    b'data: {"error":{"message":"The server had an error while processing your request.",'
    b'"type":"InternalServerError","param":null,"code":500}}\n\ndata: [DONE]\n\n'
)
# ... and in a completions stream (json.dumps: spaces)
COMPLETIONS_DEAD = (
    b'data: {"error": {"message": "The server had an error while processing your request.", '
    b'"type": "InternalServerError", "param": null, "code": 500}}\n\ndata: [DONE]\n\n'
)
# VLLM.md §3.4
COMPLETIONS = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":'
    b'[{"index":0,"text":" world","logprobs":null,"finish_reason":null,"stop_reason":null,'
    b'"prompt_token_ids":null,"token_ids":null,"weight_versions":null}],'
    b'"kv_transfer_params":null}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":'
    b'[{"index":0,"text":"!","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":5,"total_tokens":21,"completion_tokens":16}}\n\n'
    b"data: [DONE]\n\n"
)


def read(api: Api, data: bytes, *, step: int = 0, keep_text: bool = True) -> Reply:
    """``data`` through a decoder and ``api``'s accumulator, in reads of ``step``
    bytes (all at once for 0), each read timed by its offset."""
    reply = Reply(keep_text=keep_text)
    acc = accumulator(api, reply)
    dec = SSEDecoder()
    step = step or len(data)
    for i in range(0, len(data), step):
        for ev in dec.feed(data[i : i + step]):
            acc.event(ev, float(i))
    dec.close()
    return reply
