"""The ``--vllm-version 0.32.0`` profile: what a real vLLM 0.32.0 (the CPU
build, ../shared/REAL-VLLM.md) put on the wire, byte for byte where it was
measured. tests/conformance runs the same assertions against both servers;
these pin the emulator's side without a real vLLM, in-process where they can."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp.test_utils import TestServer

from replayer._async import spawn
from replayer.emulator.app import create_app
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.generate import RUNTIME
from replayer.emulator.runtime import Runtime
from replayer.testing.emulator import apoll_until, poll_until
from tests.helpers.emulator import BOUND, DONE, Stream, sse_events

MODEL = "tiny-llama"
ENGINE_DEAD = (
    b'{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the '
    b'root cause.","type":"InternalServerError","param":null,"code":500}}'
)
ENGINE_DEAD_EVENT = (
    b'data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) '
    b'for the root cause.", "type": "InternalServerError", "param": null, "code": 500}}\n\n'
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def cfg032(**kw: object) -> EmulatorConfig:
    base: dict[str, object] = {
        "vllm_version": "0.32.0",
        "served_model_names": (MODEL,),
        "model": "/models/tiny-llama",
        "vocab_size": 8192,
        "max_model_len": 16384,
        "block_size": 128,
        "tensor_parallel_size": 1,
        "enable_prompt_tokens_details": True,
        "speed": 0.0,
        "stats_interval": 0,
        "enable_auto_tool_choice": False,  # a bare `vllm serve`
        "tool_call_parser": None,
    }
    base.update(kw)
    return EmulatorConfig(**base)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def serve(cfg: EmulatorConfig) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    app = create_app(cfg)
    async with (
        TestServer(app) as server,
        httpx.AsyncClient(base_url=str(server.make_url("")), timeout=BOUND) as c,
    ):
        yield c, app[RUNTIME]


@pytest.fixture
async def emu() -> AsyncIterator[httpx.AsyncClient]:
    async with serve(cfg032()) as (c, _):
        yield c


def chat(content: str = "hi", **kw: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}


def completion(prompt: object, **kw: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": prompt, **kw}


def error(message: str, type_: str = "BadRequestError", param: str | None = None) -> dict:
    code = {"BadRequestError": 400, "NotFoundError": 404}[type_]
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@pytest.mark.inprocess
def test_profile_selection():
    assert EmulatorConfig(vllm_version="0.32.0").profile == "0.32"
    assert EmulatorConfig(vllm_version="0.32.1rc1").profile == "0.32"
    assert EmulatorConfig(vllm_version="0.31.9").profile == "0.10"
    assert EmulatorConfig(vllm_version="0.33.0").profile == "0.33"
    assert EmulatorConfig(vllm_version="0.32.0", tensor_parallel_size=1).system_fingerprint


@pytest.mark.inprocess
def test_auto_tool_choice_needs_a_parser_at_start_up():
    from replayer.errors import UsageError

    with pytest.raises(UsageError, match="--enable-auto-tool-choice requires --tool-call-parser"):
        EmulatorConfig(enable_auto_tool_choice=True, tool_call_parser=None)


@pytest.mark.inprocess
async def test_out_of_vocabulary_token_ids(emu):
    r = await emu.post("/v1/completions", json=completion([1, 2, 20000], max_tokens=3))
    assert r.status_code == 400
    assert r.content == (
        b'{"error":{"message":"Token id 20000 is out of vocabulary","type":"BadRequestError",'
        b'"param":null,"code":400}}'
    )
    r = await emu.post("/v1/completions", json=completion([9000, 8192, 3], max_tokens=3))
    assert r.json() == error("Token id 9000 is out of vocabulary")  # the largest id is named
    r = await emu.post("/v1/completions", json=completion([1, 2, 8191], max_tokens=3))
    assert r.status_code == 200
    # Streaming: the input processor runs inside the generator: 200, one event, [DONE].
    r = await emu.post("/v1/completions", json=completion([1, 20000], max_tokens=3, stream=True))
    assert (r.status_code, r.headers["content-type"]) == (200, "text/event-stream; charset=utf-8")
    assert r.content == (
        b'data: {"error": {"message": "Token id 20000 is out of vocabulary", "type": '
        b'"BadRequestError", "param": null, "code": 400}}\n\n' + DONE
    )
    # A too-long prompt is rejected first (rendering comes before the engine).
    r = await emu.post("/v1/completions", json=completion([20000] * 17000, stream=True))
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_tokens"


@pytest.mark.inprocess
async def test_default_vocabulary_accepts_every_64_bit_id():
    async with serve(EmulatorConfig(speed=0.0, stats_interval=0)) as (c, _):
        body = {"prompt": [0, 1 << 40, (1 << 64) - 1], "max_tokens": 1}
        assert (await c.post("/v1/completions", json=body)).status_code == 200


@pytest.mark.inprocess
async def test_tokenize_answers_ids_inside_the_vocabulary(emu):
    r = await emu.post("/tokenize", json={"model": MODEL, "prompt": "hello world"})
    body = r.json()
    assert list(body) == ["count", "max_model_len", "tokens", "token_strs"]
    assert body["count"] == len(body["tokens"]) == 3 and body["max_model_len"] == 16384
    assert all(0 <= t < 8192 for t in body["tokens"]) and body["token_strs"] is None
    again = (await emu.post("/tokenize", json={"prompt": "hello world"})).json()
    assert again == body  # deterministic
    chat_ids = (await emu.post("/tokenize", json={"messages": chat()["messages"]})).json()
    assert all(0 <= t < 8192 for t in chat_ids["tokens"])
    r = await emu.post("/tokenize", json={"model": MODEL, "prompt": [1, 2, 3]})
    assert r.status_code == 400 and r.json()["error"] == {
        "message": "2 validation errors:\n"
        "  {'type': 'string_type', 'loc': 'body.prompt', 'msg': 'Input should be a valid "
        "string', 'input': '<list of 3 items>'}\n"
        "  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', 'input': "
        "'<dict of 2 items>'}",
        "type": "Bad Request",
        "param": "body.prompt",
        "code": 400,
    }


AUTO = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("extra", "status", "message"),
    [
        ({"tool_choice": "auto"}, 400, AUTO),
        ({}, 400, AUTO),  # tools without tool_choice mean "auto"
        ({"tool_choice": "auto", "stream": True}, 400, AUTO),
        (
            {"tool_choice": "required"},
            400,
            'tool_choice="required" requires --tool-call-parser to be set',
        ),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            400,
            'tool_choice=function "get_weather" requires --tool-call-parser to be set',
        ),
        ({"tool_choice": "none"}, 200, None),
    ],
)
async def test_tool_choice_without_the_tool_flags(emu, extra, status, message):
    r = await emu.post("/v1/chat/completions", json=chat(max_tokens=3, tools=TOOLS, **extra))
    assert r.status_code == status
    if message is not None:
        assert r.json() == error(message)


@pytest.mark.inprocess
async def test_tool_usage_validation(emu):
    r = await emu.post("/v1/chat/completions", json=chat(max_tokens=3, tool_choice="auto"))
    assert r.json() == error(
        "When using `tool_choice`, `tools` must be set. (parameter=tool_choice)",
        param="tool_choice",
    )
    r = await emu.post("/v1/chat/completions", json=chat(max_tokens=3, tools=[]))
    assert r.json()["error"]["param"] == "tools"
    named = {"type": "function", "function": {"name": "nope"}}
    r = await emu.post("/v1/chat/completions", json=chat(tools=TOOLS, tool_choice=named))
    assert r.json()["error"]["message"].startswith("The tool specified in `tool_choice` does not")


@pytest.mark.inprocess
async def test_tools_are_accepted_by_default():
    """The defaults describe an agent deployment: tool calling is on."""
    async with serve(EmulatorConfig(speed=0.0, stats_interval=0)) as (c, _):
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "max_tokens": 2}
        assert (await c.post("/v1/chat/completions", json=body)).status_code == 200


@pytest.mark.inprocess
async def test_tool_choice_with_the_tool_flags_and_the_parser_metric():
    cfg = cfg032(enable_auto_tool_choice=True, tool_call_parser="pythonic")
    async with serve(cfg) as (c, _):
        for body in (chat(max_tokens=3, tools=TOOLS), chat(max_tokens=3, tools=TOOLS, stream=True)):
            assert (await c.post("/v1/chat/completions", json=body)).status_code == 200
        assert (await c.post("/v1/chat/completions", json=chat(max_tokens=3))).status_code == 200
        text = (await c.get("/metrics")).text
    series = 'vllm:tool_call_parser_invocations_total{mode="%s",model_name="tiny-llama",outcome='
    assert series % "non_streaming" + '"no_tool_call",request_type="chat_completions"} 1.0' in text
    # one per delta, as real vLLM counts them (3 tokens, 3 deltas)
    assert series % "streaming" + '"no_tool_call",request_type="chat_completions"} 3.0' in text
    # Only a --tool-call-parser without --enable-auto-tool-choice: still no "auto".
    async with serve(cfg032(tool_call_parser="pythonic")) as (c, _):
        r = await c.post("/v1/chat/completions", json=chat(tools=TOOLS))
        assert r.json() == error(AUTO)
        assert "tool_call_parser" not in (await c.get("/metrics")).text


@pytest.mark.inprocess
async def test_overflow_is_clamped_and_a_full_context_leaves_zero_tokens(emu):
    r = await emu.post("/v1/completions", json=completion([5] * 16000, max_tokens=1000))
    body = r.json()
    assert r.status_code == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 384 and body["usage"]["total_tokens"] == 16384
    r = await emu.post("/v1/completions", json=completion([5] * 16384, max_tokens=3))
    assert r.json() == error(
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", param="max_tokens"
    )
    r = await emu.post("/v1/completions", json=completion("hi", max_tokens=20000))
    assert r.json() == error(
        "max_tokens=20000 cannot be greater than max_model_len=16384. Please request fewer "
        "output tokens. (parameter=max_tokens, value=20000)",
        param="max_tokens",
    )


@pytest.mark.inprocess
async def test_validation_wording(emu):
    r = await emu.post("/v1/completions", json=completion([5] * 17000, max_tokens=3))
    assert r.json() == error(
        "This model's maximum context length is 16384 tokens. However, your prompt contains "
        "17000 input tokens, which exceeds this limit even without any output tokens. Please "
        "reduce the length of the input prompt. (parameter=input_tokens, value=17000)",
        param="input_tokens",
    )
    for path, body in (("/v1/completions", completion("hi")), ("/v1/chat/completions", chat())):
        r = await emu.post(path, json=body | {"model": "nope"})
        assert r.status_code == 404
        assert r.content == (
            b'{"error":{"message":"The model `nope` does not exist. Valid aliases: tiny-llama.",'
            b'"type":"NotFoundError","param":"model","code":404}}'
        )
    for key, value in (("max_tokens", 0), ("max_completion_tokens", 0), ("max_tokens", -3)):
        r = await emu.post("/v1/chat/completions", json=chat(**{key: value}))
        assert r.json() == error(
            f"max_tokens must be at least 1, got {value}. (parameter=max_tokens, value={value})",
            param="max_tokens",
        )


@pytest.mark.inprocess
async def test_bodies_and_chunks_have_0_32_fields(emu):
    fp = re.compile(r"vllm-0\.32\.0-[0-9a-f]{8}")
    body = (await emu.post("/v1/chat/completions", json=chat(max_tokens=2))).json()
    assert fp.fullmatch(body["system_fingerprint"])
    assert list(body["choices"][0]) == [
        "index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
        "routed_experts",
    ]  # fmt: skip
    body = (await emu.post("/v1/completions", json=completion("hi", max_tokens=2))).json()
    assert list(body) == [
        "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
        "usage", "kv_transfer_params", "ec_transfer_params", "metrics",
    ]  # fmt: skip
    assert list(body["choices"][0])[-1] == "routed_experts"
    assert body["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": None,
        "multimodal_tokens": None,
    }
    for path, req in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
        raw = (await emu.post(path, json=req("hi", max_tokens=2, stream=True))).content
        *chunks, done = sse_events(raw)
        assert done == b"[DONE]"
        last = json.loads(chunks[-1])
        assert fp.fullmatch(last["system_fingerprint"])
        assert "kv_transfer_params" not in last and "weight_versions" not in last["choices"][0]


@pytest.mark.inprocess
async def test_created_cache_tokens_in_chat_usage(emu):
    text = "".join(f"w{i:05d} " for i in range(150))  # 225 tokens of 4 bytes + 4 framing
    first = (await emu.post("/v1/chat/completions", json=chat(text, max_tokens=2))).json()
    p = first["usage"]["prompt_tokens"]
    full = p // 128 * 128
    assert full > 0
    assert first["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": full,
        "multimodal_tokens": None,
    }
    body = chat(text, max_tokens=2, stream=True, stream_options={"include_usage": True})
    raw = (await emu.post("/v1/chat/completions", json=body)).content
    usage = json.loads(sse_events(raw)[-2])["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": full, "created_cache_tokens": 0}


@pytest.mark.inprocess
async def test_headers_are_uvicorn_lower_case_with_vary(emu):
    r = await emu.get("/health")
    assert list(r.headers.raw) == [
        (b"date", r.headers["date"].encode()),
        (b"server", b"uvicorn"),
        (b"content-length", b"0"),
        (b"vary", b"Origin"),
    ]
    r = await emu.post("/health")
    assert [k for k, _ in r.headers.raw] == [
        b"date", b"server", b"allow", b"content-length", b"content-type", b"vary"
    ]  # fmt: skip
    assert r.headers["allow"] == "GET"
    async with emu.stream("POST", "/v1/completions", json=completion("hi", stream=True)) as s:
        assert [k for k, _ in s.headers.raw] == [
            b"date", b"server", b"content-type", b"vary", b"transfer-encoding"
        ]  # fmt: skip


@pytest.mark.inprocess
async def test_metric_families_of_a_real_0_32(emu):
    await emu.post("/v1/completions", json=completion("hi", max_tokens=2))
    await emu.get("/nope")
    text = (await emu.get("/metrics")).text
    for sample in (
        'vllm:prompt_tokens_cached_total{engine="0",model_name="tiny-llama"} 0.0',
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny-llama",'
        'source="local_compute"} 1.0',
        'vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="tiny-llama",'
        'source="device"} 0.0',
        'vllm:request_prefill_kv_computed_tokens_count{engine="0",model_name="tiny-llama"} 1.0',
        'vllm:request_prefill_kv_computed_tokens_sum{engine="0",model_name="tiny-llama"} 1.0',
        'vllm:engine_sleep_state{engine="0",model_name="tiny-llama",sleep_state="awake"} 1.0',
        'vllm:admission_rejections_total{model_name="tiny-llama",reason="max_num_queued_reqs"} 0.0',
        'vllm:request_params_n_count{engine="0",model_name="tiny-llama"} 1.0',
        'http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 1.0',
        'http_requests_total{handler="none",method="GET",status="4xx"} 1.0',
        "http_request_duration_highr_seconds_count 2.0",
    ):
        assert sample in text, sample
    assert 'handler="/metrics"' not in text and 'handler="/health"' not in text


@pytest.mark.inprocess
async def test_a_new_request_after_death_gets_json_500_and_ends_the_server():
    """Measured on 0.32: once the API server knows the engine is dead, a new
    request - streaming or not - fails in the preflight with plain JSON 500,
    and the error handler's terminate_if_errored shuts the server down."""
    async with serve(cfg032(faults=("exit when request=1",))) as (c, rt):
        r = await c.post("/v1/chat/completions", json=chat(stream=True))
        assert r.content == ENGINE_DEAD_EVENT + DONE  # died during its prefill
        assert (await c.get("/health")).status_code == 503
        assert (await c.get("/v1/models")).status_code == 200
        assert (await c.get("/metrics")).status_code == 200
        r = await c.post("/v1/chat/completions", json=chat(stream=True))
        assert (r.status_code, r.content) == (500, ENGINE_DEAD)
        await apoll_until(lambda: rt.exited is not None, 2)
        assert rt.exited == 0


@pytest.mark.inprocess
async def test_watchdog_decides_the_503_window():
    async with serve(cfg032()) as (_, rt):
        rt.started_at = time.monotonic() - 3.6  # the watchdog ticks 1.4 s from now
        assert 1.3 < rt.exit_delay() <= 1.4
        rt.started_at = time.monotonic() - 10.2
        assert 4.7 < rt.exit_delay() <= 4.8
    async with serve(cfg032(vllm_version="0.33.0")) as (_, rt):
        assert rt.exit_delay() == 1.0  # other profiles: a fixed second


@pytest.mark.e2e
async def test_sigusr1_is_kill_9_of_engine_core(emulator_factory):
    emu = emulator_factory(
        ["--vllm-version", "0.32.0", "--served-model-name", MODEL, "--decode-time", "0.005"]
    )
    body = chat(max_tokens=8000, ignore_eos=True, stream=True)
    async with httpx.AsyncClient(base_url=emu.url, timeout=BOUND) as c:
        s = Stream()
        task = spawn(s.run(c, "/v1/chat/completions", body), name="stream")
        await apoll_until(lambda: s.buf.count(b"data: ") >= 5, BOUND)
        os.kill(emu.pid, signal.SIGUSR1)
        killed = time.monotonic()
        await asyncio.wait_for(task, BOUND)
        assert s.status == 200 and s.body.endswith(ENGINE_DEAD_EVENT + DONE)
        assert (await c.get("/health")).status_code == 503
    # No request meets the dead engine: the watchdog's next 5 s tick ends it.
    poll_until(lambda: emu.health() is None, 6.0, what="connection refused")
    assert emu.wait_exit(5) == 0
    assert 2.0 <= time.monotonic() - killed <= 5.5  # killed ~0.2 s after start: the first tick
    log = emu.read_log()
    assert "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup" in log
    assert "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue" in log
    assert "Error in chat completion stream generator." in log
    assert "EngineCore encountered a fatal error." not in log  # it was killed, not failing
