"""Facts for repro bundles: env filtering, secret redaction, cache-config
labels, and what a launched emulator says about itself."""

from __future__ import annotations

import os

import httpx
import pytest

from replayer.target.facts import (
    ServerFacts,
    cache_config_labels,
    gather_facts,
    redact_command,
    relevant_env,
)
from tests.helpers.target import MODEL

EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="fp8",enable_prefix_caching="True",\
num_gpu_blocks="65536"} 1.0
"""


@pytest.mark.inprocess
def test_relevant_env_keeps_kernel_knobs_and_drops_secrets():
    env = {
        "VLLM_ROCM_USE_AITER": "1",
        "VLLM_API_KEY": "sk-1",
        "HIP_VISIBLE_DEVICES": "0,1",
        "ROCM_PATH": "/opt/rocm",
        "NCCL_DEBUG": "INFO",
        "AITER_LOG_MORE": "1",
        "TRITON_CACHE_DIR": "/tmp/t",
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_AUTH_TOKEN": "x",
        "NCCL_IB_PASSWORD": "x",
        "TRITON_SECRET": "x",
        "HF_TOKEN": "hf_x",
        "PATH": "/bin",
        "MY_VLLM_THING": "1",
    }
    assert relevant_env(env) == {
        "AITER_LOG_MORE": "1",
        "CUDA_VISIBLE_DEVICES": "0",
        "HIP_VISIBLE_DEVICES": "0,1",
        "NCCL_DEBUG": "INFO",
        "ROCM_PATH": "/opt/rocm",
        "TRITON_CACHE_DIR": "/tmp/t",
        "VLLM_ROCM_USE_AITER": "1",
    }


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("cmd", "redacted"),
    [
        ("vllm serve m --api-key sk-123 --port 8000", "vllm serve m --api-key *** --port 8000"),
        ("vllm serve m --api-key=sk-123", "vllm serve m --api-key=***"),
        (
            "HF_TOKEN=hf_abc VLLM_API_KEY=k vllm serve m",
            "HF_TOKEN=*** VLLM_API_KEY=*** vllm serve m",
        ),
        (
            "ssh -i ~/.ssh/key node docker restart vllm",
            "ssh -i ~/.ssh/key node docker restart vllm",
        ),
        ("vllm serve m --hf-token abc", "vllm serve m --hf-token ***"),
    ],
)
def test_redact_command(cmd, redacted):
    assert redact_command(cmd) == redacted


@pytest.mark.inprocess
def test_cache_config_labels():
    assert cache_config_labels(EXPOSITION) == {
        "block_size": "16",
        "cache_dtype": "fp8",
        "enable_prefix_caching": "True",
        "num_gpu_blocks": "65536",
    }
    assert cache_config_labels("# TYPE x gauge\nx 1\n") is None
    assert cache_config_labels("not { prometheus") is None


@pytest.mark.e2e
async def test_facts_of_a_launched_server(launched):
    env = {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ROCM_USE_AITER": "1",
        "NCCL_DEBUG": "INFO",
        "VLLM_SECRET_THING": "hidden",
    }
    t = launched("--block-size", "32", env=env)
    await t.start()
    await t.wait_ready(120)
    facts = await t.facts()
    assert facts.url == t.url
    assert facts.version == "0.33.0"
    assert [m["id"] for m in facts.models] == [MODEL]
    assert isinstance(facts.server_info, dict)
    assert facts.server_info["vllm_env"]["VLLM_ROCM_USE_AITER"] == "1"
    assert facts.cache_config is not None and facts.cache_config["block_size"] == "32"
    assert facts.missing == {}
    cmd = facts.command
    assert cmd["kind"] == "launch" and cmd["launches"] == 1 and cmd["exit"] is None
    assert str(cmd["launch"]).endswith("--block-size 32")
    assert "VLLM_SECRET_THING=***" in str(cmd["launch"])
    got_env = cmd["env"]
    assert isinstance(got_env, dict)
    assert {
        k: got_env[k] for k in ("VLLM_SERVER_DEV_MODE", "VLLM_ROCM_USE_AITER", "NCCL_DEBUG")
    } == {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ROCM_USE_AITER": "1",
        "NCCL_DEBUG": "INFO",
    }
    assert "VLLM_SECRET_THING" not in got_env
    assert got_env == relevant_env({**os.environ, **env})
    assert facts.to_dict()["version"] == "0.33.0"


@pytest.mark.e2e
async def test_facts_without_dev_mode_say_what_is_missing(launched):
    t = launched()
    await t.start()
    await t.wait_ready(120)
    facts = await t.facts()
    assert facts.server_info is None
    off = "HTTP 404 (dev mode off: VLLM_SERVER_DEV_MODE=1 enables it)"
    assert facts.missing == {"/server_info?config_format=json": off}
    await t.stop()
    gone = await t.facts()
    assert gone.version is None and gone.models == () and gone.cache_config is None
    assert sorted(gone.missing) == [
        "/metrics",
        "/server_info?config_format=json",
        "/v1/models",
        "/version",
    ]
    assert all(v.startswith("ConnectError") for v in gone.missing.values())
    assert gone.command["exit"] == "code 0"


@pytest.mark.inprocess
async def test_gather_facts_from_odd_answers():
    def handler(request: httpx.Request) -> httpx.Response:
        return {
            "/version": httpx.Response(200, text="0.33.0"),  # not JSON
            "/v1/models": httpx.Response(200, json={"data": [{"id": "m"}, "junk"]}),
            "/server_info": httpx.Response(404, json={"detail": "Not Found"}),
            "/metrics": httpx.Response(200, text="# TYPE x gauge\nx 1\n"),
        }[request.url.path]

    async with httpx.AsyncClient(
        base_url="http://t", transport=httpx.MockTransport(handler)
    ) as client:
        facts = await gather_facts(client, "http://t", {"kind": "x"})
    assert facts == ServerFacts(
        url="http://t",
        version=None,
        models=({"id": "m"},),
        server_info=None,
        cache_config=None,
        command={"kind": "x"},
        missing={
            "/version": "not JSON",
            "/server_info?config_format=json": (
                "HTTP 404 (dev mode off: VLLM_SERVER_DEV_MODE=1 enables it)"
            ),
            "/metrics": "no vllm:cache_config_info",
        },
    )

    async with httpx.AsyncClient(
        base_url="http://t", transport=httpx.MockTransport(lambda r: httpx.Response(503))
    ) as client:
        facts = await gather_facts(client, "http://t", {})
    assert facts.missing == {
        "/version": "HTTP 503",
        "/v1/models": "HTTP 503",
        "/server_info?config_format=json": "HTTP 503",
        "/metrics": "HTTP 503",
    }
