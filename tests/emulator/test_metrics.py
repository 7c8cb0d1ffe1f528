"""``/metrics`` parsed by prometheus_client's own parser: vLLM's names, types
and labels, and gauges and counters that move with the engine."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from replayer.testing.emulator import apoll_until
from replayer.trace.tokens import approx_message_tokens
from tests.helpers.emulator import BOUND, MODEL, chat, client

pytestmark = pytest.mark.e2e
LABELS = {"engine": "0", "model_name": MODEL}


def scrape(emu) -> dict[str, dict]:
    """{family name: {"type": ..., "samples": {(sample name, labels...): value}}}."""
    r = httpx.get(f"{emu.url}/metrics", timeout=10)
    assert r.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    out = {}
    for fam in text_string_to_metric_families(r.text):
        out[fam.name] = {
            "type": fam.type,
            "samples": {(s.name, *sorted(s.labels.items())): s.value for s in fam.samples},
        }
    return out


def value(m, family: str, sample: str | None = None, **labels) -> float:
    key = (sample or family, *sorted((LABELS | labels).items()))
    return m[family]["samples"][key]


def test_names_types_and_labels(shared_emulator):
    m = scrape(shared_emulator)
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:request_prompt_tokens": "histogram",
        "vllm:iteration_tokens_total": "histogram",
        "vllm:cache_config_info": "gauge",
        "process_cpu_seconds": "counter",
    }
    assert {k: m[k]["type"] for k in expected} == expected
    # Counters are _total on the wire, with _created series (single API server).
    assert ("vllm:num_preemptions_total", *sorted(LABELS.items())) in m["vllm:num_preemptions"][
        "samples"
    ]
    assert m["vllm:num_preemptions_created"]["type"] == "gauge"  # as VLLM.md §5.3 shows
    reasons = {k[1:] for k in m["vllm:request_success"]["samples"] if k[0].endswith("_total")}
    assert {dict(r)["finished_reason"] for r in reasons} == {
        "stop",
        "length",
        "abort",
        "error",
        "repetition",
    }
    ((info_key, info_value),) = m["vllm:cache_config_info"]["samples"].items()
    info = dict(info_key[1:])
    assert info_value == 1.0 and info["block_size"] == "16" and info["num_gpu_blocks"] == "65536"
    buckets = [
        dict(k[1:])["le"]
        for k in m["vllm:time_to_first_token_seconds"]["samples"]
        if k[0].endswith("_bucket")
    ]
    assert buckets[:3] == ["0.001", "0.005", "0.01"] and buckets[-1] == "+Inf"


def test_counters_follow_requests_and_prefix_hits(emulator_factory):
    emu = emulator_factory(["--speed", "instant"])
    body = chat("x" * 1000, max_tokens=6)
    p = approx_message_tokens(body["messages"][0])
    with client(emu) as c:
        for _ in range(2):
            assert c.post("/v1/chat/completions", json=body).status_code == 200
    m = scrape(emu)
    assert value(m, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") == 2 * p
    assert value(m, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == (p - 1) // 16 * 16
    assert value(m, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == 2 * p
    assert value(m, "vllm:generation_tokens", "vllm:generation_tokens_total") == 12
    assert (
        value(m, "vllm:request_success", "vllm:request_success_total", finished_reason="length")
        == 2
    )
    assert (
        value(m, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") == 2
    )
    assert value(m, "vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum") == 2 * p
    assert value(m, "vllm:num_requests_running") == 0
    assert value(m, "vllm:kv_cache_usage_perc") == 0


async def test_gauges_move_as_requests_run(emulator_factory):
    # One running slot, 1000 blocks, slow decode (0.2 s a step): A runs, B waits.
    emu = emulator_factory(
        [
            "--decode-time",
            "0.2",
            "--max-num-seqs",
            "1",
            "--num-gpu-blocks-override",
            "1000",
            "--stats-interval",
            "0.2",
        ]
    )
    a = {
        "messages": [{"role": "user", "content": "a" * 4 * 157}],
        "max_tokens": 5000,
        "stream": True,
    }  # 161 prompt tokens: 11 blocks for the next 15 tokens
    b = {"messages": [{"role": "user", "content": "b" * 40}], "max_tokens": 5000, "stream": True}
    async with asyncio.timeout(BOUND), httpx.AsyncClient(base_url=emu.url, timeout=30) as c:
        async with c.stream("POST", "/v1/chat/completions", json=a) as ra:
            it = ra.aiter_bytes()
            first = await anext(it)
            assert b'"role":"assistant"' in first  # A has produced its first token
            async with c.stream("POST", "/v1/chat/completions", json=b) as rb:
                await emu.await_events("request", 2)
                m = scrape(emu)
                assert value(m, "vllm:num_requests_running") == 1
                assert value(m, "vllm:num_requests_waiting") == 1
                assert value(m, "vllm:num_requests_waiting_by_reason", reason="capacity") == 1
                assert value(m, "vllm:kv_cache_usage_perc") == 11 / 1000
                gen = value(m, "vllm:generation_tokens", "vllm:generation_tokens_total")
                assert gen >= 1
                # The periodic engine log line says the same (VLLM.md §5.2).
                emu.wait_log("Running: 1 reqs, Waiting: 1 reqs, GPU KV cache usage: 1.1%")
                await ra.aclose()  # A goes away: B is admitted
                await apoll_until(lambda: value(scrape(emu), "vllm:num_requests_waiting") == 0, 10)
                m = scrape(emu)
                assert value(m, "vllm:num_requests_running") == 1
                assert (
                    value(
                        m,
                        "vllm:request_success",
                        "vllm:request_success_total",
                        finished_reason="abort",
                    )
                    == 1
                )
                await anext(rb.aiter_bytes())
        await apoll_until(lambda: value(scrape(emu), "vllm:num_requests_running") == 0, 10)
    m = scrape(emu)
    assert value(m, "vllm:kv_cache_usage_perc") == 0
    assert (
        value(m, "vllm:request_success", "vllm:request_success_total", finished_reason="abort") == 2
    )
    assert value(m, "vllm:generation_tokens", "vllm:generation_tokens_total") > gen
