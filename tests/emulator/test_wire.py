"""Response bytes against the samples in VLLM.md (§2.2, §3.2-3.5, §1.2)."""

from __future__ import annotations

import pytest

from replayer.emulator import wire

pytestmark = pytest.mark.inprocess

FP = "vllm-0.33.0-tp8-3f9a1c2e"
MODEL = "moonshotai/Kimi-K3"
ID = "chatcmpl-8f1c2a9e0b7d4c1e"


def chat_shape(include_usage=True, continuous=False, cached=118784):
    return wire.StreamShape(
        chat=True,
        id=ID,
        created=1764470400,
        model=MODEL,
        fingerprint=FP,
        include_usage=include_usage,
        continuous=continuous,
        prompt_tokens=120345,
        cached=cached,
    )


def test_chat_stream_matches_the_spec_sample():
    s = chat_shape()
    assert s.role() == (
        b'data: {"id":"chatcmpl-8f1c2a9e0b7d4c1e","object":"chat.completion.chunk","created":'
        b'1764470400,"model":"moonshotai/Kimi-K3","choices":[{"index":0,"delta":{"role":'
        b'"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":'
        b'null,"prompt_text":null}\n\n'
    )
    assert s.delta("Hello", 1, None) == (
        b'data: {"id":"chatcmpl-8f1c2a9e0b7d4c1e","object":"chat.completion.chunk","created":'
        b'1764470400,"model":"moonshotai/Kimi-K3","choices":[{"index":0,"delta":{"content":'
        b'"Hello"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
    )
    assert s.delta("!", 2, "stop") == (
        b'data: {"id":"chatcmpl-8f1c2a9e0b7d4c1e","object":"chat.completion.chunk","created":'
        b'1764470400,"model":"moonshotai/Kimi-K3","choices":[{"index":0,"delta":{"content":"!"},'
        b'"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null,'
        b'"weight_versions":null}],"kv_transfer_params":null}\n\n'
    )
    assert s.usage(2) == (
        b'data: {"id":"chatcmpl-8f1c2a9e0b7d4c1e","object":"chat.completion.chunk","created":'
        b'1764470400,"model":"moonshotai/Kimi-K3","choices":[],"usage":{"prompt_tokens":120345,'
        b'"total_tokens":120347,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":'
        b'118784}},"system_fingerprint":"vllm-0.33.0-tp8-3f9a1c2e"}\n\n'
    )
    assert wire.DONE == b"data: [DONE]\n\n"


def test_terminal_chunk_carries_the_fingerprint_without_include_usage():
    s = chat_shape(include_usage=False)
    assert s.delta("!", 2, "length").endswith(
        b'"choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"length",'
        b'"stop_reason":null,"token_ids":null,"weight_versions":null}],"system_fingerprint":'
        b'"vllm-0.33.0-tp8-3f9a1c2e","kv_transfer_params":null}\n\n'
    )


def test_usage_without_prompt_token_details():
    assert (
        chat_shape(cached=None)
        .usage(2)
        .endswith(
            b'"usage":{"prompt_tokens":120345,"total_tokens":120347,"completion_tokens":2},'
            b'"system_fingerprint":"vllm-0.33.0-tp8-3f9a1c2e"}\n\n'
        )
    )


def test_continuous_usage_on_every_chunk():
    s = chat_shape(continuous=True)
    assert (
        b'"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,'
        b'"token_ids":null}],"usage":{"prompt_tokens":120345,"total_tokens":120346,'
        b'"completion_tokens":1,"completion_tokens_details":null}}\n\n'
    ) in s.delta("Hello", 1, None)
    assert b'"usage":{"prompt_tokens":120345,"total_tokens":120345,"completion_tokens":0,' in (
        s.role()
    )


def test_completion_stream_matches_the_spec_sample():
    s = wire.StreamShape(
        chat=False,
        id="cmpl-8f1c2a9e0b7d4c1e",
        created=1764470400,
        model=MODEL,
        fingerprint=FP,
        include_usage=True,
        continuous=False,
        prompt_tokens=5,
        cached=None,
    )
    assert s.delta(" world", 1, None) == (
        b'data: {"id":"cmpl-8f1c2a9e0b7d4c1e","object":"text_completion","created":1764470400,'
        b'"model":"moonshotai/Kimi-K3","choices":[{"index":0,"text":" world","logprobs":null,'
        b'"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null,'
        b'"weight_versions":null}],"kv_transfer_params":null}\n\n'
    )
    assert s.usage(16) == (
        b'data: {"id":"cmpl-8f1c2a9e0b7d4c1e","object":"text_completion","created":1764470400,'
        b'"model":"moonshotai/Kimi-K3","choices":[],"usage":{"prompt_tokens":5,"total_tokens":21,'
        b'"completion_tokens":16},"system_fingerprint":"vllm-0.33.0-tp8-3f9a1c2e"}\n\n'
    )


def test_non_streaming_chat_body_matches_the_spec_sample():
    body = wire.chat_body(ID, 1764470400, MODEL, "Done.", "stop", FP, 120345, 57, None)
    assert body == (
        b'{"id":"chatcmpl-8f1c2a9e0b7d4c1e","object":"chat.completion","created":1764470400,'
        b'"model":"moonshotai/Kimi-K3","choices":[{"index":0,"message":{"role":"assistant",'
        b'"content":"Done.","refusal":null,"annotations":null,"audio":null,"function_call":null,'
        b'"reasoning":null},"logprobs":null,"finish_reason":"stop","stop_reason":null,'
        b'"token_ids":null,"routed_experts":null,"weight_versions":null}],"service_tier":null,'
        b'"system_fingerprint":"vllm-0.33.0-tp8-3f9a1c2e","usage":{"prompt_tokens":120345,'
        b'"total_tokens":120402,"completion_tokens":57,"prompt_tokens_details":null,'
        b'"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,'
        b'"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'
    )
    with_details = wire.chat_body(ID, 1, MODEL, "x", "stop", FP, 10, 1, 8)
    assert (
        b'"prompt_tokens_details":{"cached_tokens":8,"created_cache_tokens":null,'
        b'"multimodal_tokens":null}'
    ) in with_details


def test_dead_engine_payloads_per_version():
    assert wire.dead_body("0.33") == (
        b'{"error":{"message":"The server had an error while processing your request.",'
        b'"type":"InternalServerError","param":null,"code":500}}'
    )
    assert wire.error_event("0.33", True, "dead") == (
        b'data: {"error":{"message":"The server had an error while processing your request.",'
        b'"type":"InternalServerError","param":null,"code":500}}\n\n'
    )
    assert wire.error_event("0.33", False, "dead") == (
        b'data: {"error": {"message": "The server had an error while processing your request.",'
        b' "type": "InternalServerError", "param": null, "code": 500}}\n\n'
    )
    assert wire.dead_body("0.10") == (
        b'{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the '
        b'root cause.","type":"InternalServerError","param":null,"code":500}}'
    )
    assert b'"type": "BadRequestError", "param": null, "code": 400' in wire.error_event(
        "0.10", True, "dead"
    )
    measured_032 = (  # a real vLLM 0.32.0, kill -9 of EngineCore under a chat stream
        b'data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) '
        b'for the root cause.", "type": "InternalServerError", "param": null, "code": 500}}\n\n'
    )
    assert wire.error_event("0.32", True, "dead") == measured_032
    assert wire.error_event("0.32", False, "dead") == measured_032
    assert wire.dead_body("0.32") == wire.dead_body("0.10")
    assert wire.dead_body("0.9").startswith(b'{"object":"error","message":"EngineCore')
    assert wire.error_event("0.33", True, "internal") == (
        b'data: {"error":{"message":"Internal server error","type":"InternalServerError",'
        b'"param":null,"code":500}}\n\n'
    )


def test_models_body_matches_the_spec_sample():
    body = wire.models_body(
        ("moonshotai/Kimi-K3",), "/models/Kimi-K3", 262144, 1764470400, "modelperm-9c1f6a2b3d4e5f60"
    )
    assert body == (
        b'{"object":"list","data":[{"id":"moonshotai/Kimi-K3","object":"model","created":'
        b'1764470400,"owned_by":"vllm","root":"/models/Kimi-K3","parent":null,"max_model_len":'
        b'262144,"permission":[{"id":"modelperm-9c1f6a2b3d4e5f60","object":"model_permission",'
        b'"created":1764470400,"allow_create_engine":false,"allow_sampling":true,'
        b'"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,'
        b'"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}]}'
    )


def test_filler_is_one_word_per_token_and_deterministic():
    text = wire.filler(3, 5, 7)
    assert text == wire.filler(3, 5, 7)
    assert len(text.split()) == 7 and text.startswith(" ")
    assert wire.filler(3, 0, 12) == wire.filler(3, 0, 5) + wire.filler(3, 5, 7)
