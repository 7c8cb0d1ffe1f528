"""The HTTP surface against a real emulator process: endpoints, gates, error
bodies and headers, byte for byte per VLLM.md §1.2 and §4."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re

import httpx
import pytest

from replayer.testing.emulator import apoll_until
from replayer.trace.tokens import approx_message_tokens, approx_text_tokens
from tests.helpers.emulator import BOUND, MODEL, chat, client

pytestmark = pytest.mark.e2e


def test_health_ping_version_load(shared_emulator):
    with client(shared_emulator) as c:
        r = c.get("/health")
        assert (r.status_code, r.content, r.headers["server"]) == (200, b"", "uvicorn")
        assert "content-type" not in r.headers
        assert c.get("/ping").status_code == 200 and c.post("/ping").status_code == 200
        r = c.get("/version")
        assert (r.content, r.headers["content-type"]) == (
            b'{"version":"0.33.0"}',
            "application/json",
        )
        assert c.get("/load").content == b'{"server_load":0}'


def test_models(shared_emulator):
    with client(shared_emulator) as c:
        body = c.get("/v1/models").json()
    (m,) = body["data"]
    assert (m["id"], m["root"], m["max_model_len"], m["owned_by"]) == (MODEL, MODEL, 1000, "vllm")
    assert re.fullmatch(r"modelperm-[0-9a-f]{16}", m["permission"][0]["id"])


def test_unknown_paths_wrong_methods_and_dev_endpoints(shared_emulator):
    with client(shared_emulator) as c:
        for path in ("/nope", "/server_info", "/is_sleeping"):
            r = c.get(path)
            assert (r.status_code, r.content) == (404, b'{"detail":"Not Found"}')
        r = c.post("/reset_prefix_cache")
        assert (r.status_code, r.content) == (404, b'{"detail":"Not Found"}')
        r = c.get("/v1/chat/completions")
        assert (r.status_code, r.content) == (405, b'{"detail":"Method Not Allowed"}')


def test_bad_requests_byte_for_byte(shared_emulator):
    with client(shared_emulator) as c:
        r = c.post(
            "/v1/chat/completions",
            content=b'{"messages": []}',
            headers={"Content-Type": "text/plain"},
        )
        assert r.status_code == 400 and r.content == (
            b'{"error":{"message":"1 validation error:\\n  Unsupported Media Type: Only '
            b'\'application/json\' is allowed","type":"Bad Request","param":null,"code":400}}'
        )
        r = c.post(
            "/v1/chat/completions",
            content=b'{"model": "x", "messages": }',
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "body.27"
        r = c.post("/v1/chat/completions", json={"model": MODEL})
        assert r.status_code == 400 and r.content == (
            b"{\"error\":{\"message\":\"1 validation error:\\n  {'type': 'missing', 'loc': "
            b"'body.messages', 'msg': 'Field required', 'input': '<dict of 1 items>'}\","
            b'"type":"Bad Request","param":"body.messages","code":400}}'
        )
        r = c.post("/v1/chat/completions", json=chat(model="gpt-4"))
        assert r.status_code == 404 and r.content == (
            b'{"error":{"message":"The model `gpt-4` does not exist. Valid aliases: '
            b'moonshotai/Kimi-K3.","type":"NotFoundError","param":"model","code":404}}'
        )
        r = c.post(
            "/v1/chat/completions",
            json=chat(stream=True) | {"stream": False, "stream_options": {"include_usage": True}},
        )
        assert r.status_code == 400 and r.json()["error"] == {
            "message": "Stream options can only be defined when `stream=True`. "
            "(parameter=stream_options)",
            "type": "BadRequestError",
            "param": "stream_options",
            "code": 400,
        }


def test_context_length_errors(shared_emulator):
    text = "x" * 4 * 2000  # 2000 text tokens + 4 framing > 1000
    with client(shared_emulator) as c:
        r = c.post("/v1/chat/completions", json=chat(text, stream=True))
        assert r.status_code == 400 and r.headers["content-type"] == "application/json"
        assert r.content == (
            b'{"error":{"message":"This model\'s maximum context length is 1000 tokens. However, '
            b"your prompt contains at least 1001 input tokens, which exceeds this limit even "
            b"without any output tokens. Please reduce the length of the input prompt. "
            b'(parameter=input_tokens, value=1001)","type":"BadRequestError",'
            b'"param":"input_tokens","code":400}}'
        )
        r = c.post("/v1/completions", json={"prompt": [1] * 1200})
        assert "your prompt contains 1200 input tokens" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": 5000})
        assert r.json()["error"]["param"] == "max_tokens"
        r = c.post("/v1/completions", json={"prompt": [1] * 990, "max_tokens": 500})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 10  # clamped
        assert r.json()["choices"][0]["finish_reason"] == "length"


def test_tokenize_counts_like_the_trace_approximation(shared_emulator):
    messages = [
        {"role": "system", "content": "You are a careful agent. " * 20},
        {"role": "user", "content": [{"type": "text", "text": "héllo wörld"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "1",
                    "type": "function",
                    "function": {"name": "ls", "arguments": '{"p":"/"}'},
                }
            ],
        },
    ]
    with client(shared_emulator) as c:
        r = c.post("/tokenize", json={"model": MODEL, "messages": messages})
        body = r.json()
        assert body["count"] == sum(approx_message_tokens(m) for m in messages)
        assert len(body["tokens"]) == body["count"] and body["max_model_len"] == 1000
        assert body["token_strs"] is None
        r = c.post("/tokenize", json={"prompt": "abcdefghij"})
        assert r.json()["count"] == approx_text_tokens("abcdefghij") == 3
        ids = r.json()["tokens"]
        assert c.post("/detokenize", json={"tokens": ids}).json() == {"prompt": "abcdefghij"}
        # The counts the emulator reports for generation are the same numbers.
        r = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
        assert r.json()["usage"]["prompt_tokens"] == body["count"]


def test_request_ids(shared_emulator):
    with client(shared_emulator) as c:
        r = c.post("/v1/chat/completions", json=chat(max_tokens=1), headers={"X-Request-Id": "t-9"})
        assert r.json()["id"] == "chatcmpl-t-9" and "x-request-id" not in r.headers
        r = c.post("/v1/chat/completions", json=chat(max_tokens=1))
        assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", r.json()["id"])
        r = c.post(
            "/v1/completions",
            json={"prompt": "hi", "max_tokens": 1},
            headers={"X-Request-Id": "t-10"},
        )
        assert r.json()["id"] == "cmpl-t-10"
        assert re.fullmatch(r"vllm-0\.33\.0-tp8-[0-9a-f]{8}", r.json()["system_fingerprint"])


def test_api_key_guards_only_v1(emulator_factory):
    emu = emulator_factory(
        ["--speed", "instant", "--api-key", "sekret", "--enable-request-id-headers"]
    )
    with client(emu) as c:
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
            r = c.request(method, path, json=chat())
            assert (r.status_code, r.content) == (401, b'{"error":"Unauthorized"}')
        r = c.post("/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer no"})
        assert r.status_code == 401
        for path in ("/health", "/metrics", "/version"):
            assert c.get(path).status_code == 200
        assert c.post("/tokenize", json={"prompt": "x"}).status_code == 200
        r = c.post(
            "/v1/chat/completions",
            json=chat(max_tokens=2),
            headers={"Authorization": "Bearer sekret", "X-Request-Id": "abc"},
        )
        assert r.status_code == 200 and r.headers["x-request-id"] == "abc"
    # Rejected generation requests are logged too, with their status.
    lines = emu.events("request")
    assert [(x["seq"], x["n"], x.get("status")) for x in lines] == [
        (1, None, 401),
        (2, None, 401),
        (3, 1, None),
    ]


def test_dev_mode_endpoints_and_prefix_cache_reset(emulator_factory):
    emu = emulator_factory(
        ["--speed", "instant", "--enable-prompt-tokens-details"],
        env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_TEST_FLAG": "7"},
    )
    body = chat("a" * 400, max_tokens=1)
    with client(emu) as c:
        info = c.get("/server_info").json()
        assert set(info) == {"vllm_config", "vllm_env", "system_env"}
        assert info["vllm_env"]["VLLM_TEST_FLAG"] == "7"
        assert "max_seq_len=262144" in info["vllm_config"]
        assert c.get("/server_info?config_format=json").json()["vllm_config"]["block_size"] == "16"
        c.post("/v1/chat/completions", json=body)
        cached = c.post("/v1/chat/completions", json=body).json()["usage"]
        assert cached["prompt_tokens_details"]["cached_tokens"] == 96  # (104 - 1) // 16 * 16
        r = c.post("/reset_prefix_cache")
        assert (r.status_code, r.content) == (200, b'{"success":true}')
        after = c.post("/v1/chat/completions", json=body).json()["usage"]
        assert after["prompt_tokens_details"]["cached_tokens"] == 0
        assert c.get("/is_sleeping").content == b'{"is_sleeping":false}'
    assert "SECURITY WARNING: Development endpoints are enabled!" in emu.read_log()


def test_request_log_records_bodies_in_arrival_order(emulator_factory):
    emu = emulator_factory(["--speed", "instant"], log_bodies=True)
    sent = [chat(f"message {i}", max_tokens=1) for i in range(5)]
    raw = b'{"messages": [{"role": "user", "content": "raw \\u00e9"}], "max_tokens": 1}'
    with client(emu) as c:
        for i, b in enumerate(sent):
            c.post(
                "/v1/chat/completions",
                json=b,
                headers={"X-Request-Id": f"r{i}", "X-Session-Id": "s1"},
            )
        c.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    lines = emu.events("request")
    assert [x["seq"] for x in lines] == [1, 2, 3, 4, 5, 6]
    assert [x["request_id"] for x in lines] == ["r0", "r1", "r2", "r3", "r4", None]
    assert [x["body"] for x in lines[:5]] == sent
    assert [(x["session"], x["turn"]) for x in lines[:5]] == [("s1", t) for t in range(1, 6)]
    assert lines[5]["body_bytes"] == len(raw)
    assert lines[5]["body_sha256"] == hashlib.sha256(raw).hexdigest()
    assert lines[5]["body"] == json.loads(raw)


async def test_aliases_model_root_load_tracking_and_log_file(emulator_factory, tmp_path):
    log_file = tmp_path / "vllm.log"
    emu = emulator_factory(
        [
            "--decode-time",
            "0.05",
            "--model",
            "/models/Kimi-K3",
            "--served-model-name",
            "kimi",
            MODEL,
            "--enable-server-load-tracking",
            "--log-file",
            str(log_file),
        ]
    )
    async with asyncio.timeout(BOUND), httpx.AsyncClient(base_url=emu.url, timeout=30) as c:
        models = (await c.get("/v1/models")).json()["data"]
        assert [(m["id"], m["root"]) for m in models] == [
            ("kimi", "/models/Kimi-K3"),
            (MODEL, "/models/Kimi-K3"),
        ]
        r = await c.post("/v1/chat/completions", json=chat(model="gpt-4"))
        assert r.json()["error"]["message"] == (
            "The model `gpt-4` does not exist. Valid aliases: kimi, moonshotai/Kimi-K3."
        )
        assert (await c.get("/load")).content == b'{"server_load":0}'
        async with c.stream(
            "POST", "/v1/chat/completions", json=chat(model="kimi", max_tokens=1000, stream=True)
        ) as s:
            chunks = s.aiter_bytes()  # keep a reference: a dropped iterator closes the stream
            assert b'"model":"kimi"' in await anext(chunks)
            assert (await c.get("/load")).content == b'{"server_load":1}'
        metrics = (await c.get("/metrics")).text
    assert 'vllm:num_requests_running{engine="0",model_name="kimi"}' in metrics
    text = log_file.read_text()
    assert "Starting vLLM server on http://127.0.0.1:" in text
    assert "vLLM server version 0.33.0, serving model /models/Kimi-K3" in text


async def test_in_process_app_records_exits_instead_of_exiting():
    from aiohttp.test_utils import TestServer

    from replayer.emulator.app import create_app
    from replayer.emulator.config import EmulatorConfig
    from replayer.emulator.generate import RUNTIME

    cfg = EmulatorConfig(
        speed=0.0, stats_interval=0, faults=("exit code=5 after=0 when request=2",)
    )
    app = create_app(cfg)
    rt = app[RUNTIME]
    async with TestServer(app) as server, httpx.AsyncClient(base_url=str(server.make_url(""))) as c:
        assert (await c.post("/v1/chat/completions", json=chat(max_tokens=2))).status_code == 200
        r = await c.post("/v1/chat/completions", json=chat(max_tokens=2))
        assert (r.status_code, r.json()["error"]["code"]) == (500, 500)
        await apoll_until(lambda: rt.exited is not None, 10)
        assert rt.exited == 5 and rt.engine.dead
        assert (await c.get("/health")).status_code == 503
