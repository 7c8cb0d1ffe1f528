"""Speculative decoding against real vLLM: the CPU build serves the tiny Llama
with n-gram drafting (``--speculative-config``, no draft model needed), and a
replay's ``summary.json`` must carry exactly the server's own
``vllm:spec_decode_*`` deltas, scraped by the test before and after."""

from __future__ import annotations

import json

from replayer.monitor.metrics import spec_decode_figures
from replayer.testing.vllm import VLLMServer
from tests.helpers.realvllm import cli, summary

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
"""One matching token proposes a draft: the tiny model's random-weight output
repeats itself, so its own context supplies drafts (with vLLM's default
minimum of 2 the chat trace drafted nothing)."""


def test_summary_equals_the_servers_spec_decode_deltas(vllm_env, vllm_models, traces, tmp_path):
    extra = ("--speculative-config", json.dumps(NGRAM))
    with VLLMServer(
        vllm_env,
        vllm_models["llama"],
        tmp_path / "server.log",
        extra=extra,
        served_name="tiny-spec",
    ) as srv:
        status, body = srv.get("/metrics")
        assert status == 200
        before = body.decode()
        res = cli(
            *("replay", traces["chat"], "--target", f"vllm={srv.url}", "--model", "tiny-spec"),
            *("--timing", "asap", "--out", tmp_path / "run", "--quiet"),
            timeout=300,
        )
        status, body = srv.get("/metrics")
        assert status == 200
        after = body.decode()
    assert res.returncode == 0, res.stdout + res.stderr
    expected = spec_decode_figures(before, after)
    assert expected is not None, "the server exposes no spec_decode counters"
    got = summary(tmp_path / "run")["targets"]["vllm"]["spec_decode"]
    # no --per-request-spec-decode-metrics on this server: no per-request part
    assert got == {**expected, "source": "metrics", "per_request": None}
    assert expected["drafts"] > 0 and expected["draft_tokens"] == 3 * expected["drafts"]
    assert "speculative decoding: " in res.stdout
