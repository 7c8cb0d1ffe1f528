"""τ²-bench importer on the real GPT-4o telecom simulations: the agent's
conversation, real timing and real token usage, rebuilt naively from the
JSON."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from replayer.trace import Trace
from replayer.trace.stats import inspect_trace
from tests.helpers.importers import (
    assert_fails_cleanly_or_imports,
    assert_import_fails,
    garbage_file,
    import_trace,
    inspect_cli,
    mutants,
    nearest_rank,
    truncated_file,
    truncated_gzip,
)

# tau2's LLMAgent system prompt (tau2/agent/llm_agent.py), typed out here on purpose
TAU2_SYSTEM = (
    "<instructions>\n"
    "You are a customer service agent that helps the user according to the <policy> "
    "provided below.\n"
    "In each turn you can either:\n"
    "- Send a message to the user.\n"
    "- Make a tool call.\n"
    "You cannot do both at the same time.\n"
    "\n"
    "Try to be helpful and always follow the policy. Always make sure you generate valid "
    "JSON only.\n"
    "</instructions>\n"
    "<policy>\n"
    "{policy}\n"
    "</policy>"
)


def ts(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f")


def calls(tc: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
        }
        for c in tc
    ]


def expected(doc: dict[str, Any], system: str | None = None) -> list[dict[str, Any]]:
    """One dict per agent LLM call, in source order."""
    policy = doc["info"]["environment_info"]["policy"]
    sys_msg = {"role": "system", "content": system or TAU2_SYSTEM.format(policy=policy)}
    origin = min(ts(m["timestamp"]) for s in doc["simulations"] for m in s["messages"])
    out = []
    for sim in doc["simulations"]:
        ctx: list[dict[str, Any]] = [sys_msg]
        last = None
        turn = 0
        for m in sim["messages"]:
            t = ts(m["timestamp"])
            if m["role"] == "assistant" and m["usage"] is not None:
                out.append(
                    {
                        "request_id": f"{sim['id']}:{turn}",
                        "session_id": sim["id"],
                        "turn": turn,
                        "start_us": (last - origin) // dt.timedelta(microseconds=1),
                        "end_us": (t - origin) // dt.timedelta(microseconds=1),
                        "body": {
                            "model": "gpt-4o",
                            "messages": list(ctx),
                            "temperature": 0.0,
                            "max_tokens": m["usage"]["completion_tokens"],
                        },
                        "prompt_tokens": m["usage"]["prompt_tokens"],
                        "completion_tokens": m["usage"]["completion_tokens"],
                        "output_text": m["content"],
                        "output_tool_calls": calls(m["tool_calls"]) if m["tool_calls"] else None,
                        "finish_reason": m["raw_data"]["finish_reason"],
                    }
                )
                turn += 1
            # what the orchestrator routes to the agent
            if m["role"] == "assistant":
                msg = {"role": "assistant", "content": m["content"]}
                if m["tool_calls"]:
                    msg["tool_calls"] = calls(m["tool_calls"])
            elif m["role"] == "user" and not m["tool_calls"]:
                msg = {"role": "user", "content": m["content"]}
            elif m["role"] == "tool" and m["requestor"] == "assistant":
                msg = {"role": "tool", "tool_call_id": m["id"], "content": m["content"]}
            else:
                continue
            ctx.append(msg)
            last = t
    return out


@pytest.fixture(scope="module")
def src(shared_data: Path) -> Path:
    return shared_data / "tau2_bench" / "telecom_gpt-4o_agent_gpt-4o_user_2025-08-10.json.gz"


@pytest.fixture(scope="module")
def doc(src: Path) -> dict[str, Any]:
    with gzip.open(src, "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def trace(src: Path, tmp_path_factory) -> Trace:
    return import_trace("tau2-bench", [src], tmp_path_factory.mktemp("t2") / "t2.arrow")


@pytest.mark.inprocess
def test_every_request_reconstructs(trace, doc):
    exp = expected(doc)
    assert len(trace) == len(exp) == 217
    c = trace.column
    for r, e in enumerate(exp):
        assert c("request_id")[r] == e["request_id"]
        assert (c("session_id")[r], c("turn")[r]) == (e["session_id"], e["turn"])
        assert (c("start_us")[r], c("end_us")[r]) == (e["start_us"], e["end_us"])
        assert c("start_us")[r] < c("end_us")[r]
        assert c("input_tokens")[r] == e["prompt_tokens"]
        assert c("max_tokens")[r] == e["completion_tokens"]
        assert c("model")[r] == "gpt-4o"
        assert trace.body(r) == e["body"]
        out = trace.outcome(r)
        assert out["status"] == 200
        assert out["usage_prompt_tokens"] == e["prompt_tokens"]
        assert out["usage_completion_tokens"] == e["completion_tokens"]
        assert out["output_text"] == e["output_text"]
        assert out["output_tool_calls"] == e["output_tool_calls"]
        assert out["finish_reason"] == e["finish_reason"]


@pytest.mark.inprocess
def test_bodies_are_valid_openai_conversations(trace):
    """Every tool message answers a call of an earlier assistant turn, every
    call is answered before the next assistant turn, no tau2-only keys."""
    allowed = {"role", "content", "tool_calls", "tool_call_id"}
    for r in range(len(trace)):
        msgs = trace.body(r)["messages"]
        assert msgs[0]["role"] == "system" and msgs[1]["role"] == "assistant"
        assert msgs[1]["content"] == "Hi! How can I help you today?"  # the canned greeting
        open_calls: set[str] = set()
        for m in msgs:
            assert set(m) <= allowed
            if m["role"] == "assistant":
                assert not open_calls
                open_calls = {c["id"] for c in m.get("tool_calls", [])}
                for c in m.get("tool_calls", []):
                    assert json.loads(c["function"]["arguments"]) is not None
            elif m["role"] == "tool":
                open_calls.remove(m["tool_call_id"])
        assert not open_calls


@pytest.mark.inprocess
def test_excluding_user_tool_traffic_matches_real_prompt_growth(doc):
    """Data evidence for the context rule: between two agent calls, the real
    prompt grows by the messages the agent sees; counting the user
    simulator's own tool calls and results too fits far worse."""

    def approx(m: dict[str, Any]) -> float:
        n = len(m.get("content") or "")
        for c in m.get("tool_calls") or []:
            n += len(c["name"]) + len(json.dumps(c["arguments"]))
        return n / 4

    def errors(include_user_tools: bool) -> list[float]:
        out = []
        for sim in doc["simulations"]:
            prev, added = None, 0.0
            for m in sim["messages"]:
                if m["role"] == "assistant" and m["usage"]:
                    if prev is not None:
                        u, p = m["usage"], prev["usage"]
                        real = u["prompt_tokens"] - p["prompt_tokens"] - p["completion_tokens"]
                        out.append(abs(real - added))
                    prev, added = m, 0.0
                    continue
                user_side = (m["role"] == "user" and m["tool_calls"]) or (
                    m["role"] == "tool" and m["requestor"] == "user"
                )
                if prev is not None and (include_user_tools or not user_side):
                    added += approx(m)
        return sorted(out)

    agent, everything = errors(False), errors(True)
    assert len(agent) == 217 - 20
    assert agent[len(agent) // 2] < 12 < 25 < everything[len(everything) // 2]


def test_inspect_matches_source_and_readme(trace, doc):
    agent_calls = [
        sum(m["role"] == "assistant" and m["usage"] is not None for m in s["messages"])
        for s in doc["simulations"]
    ]
    prompts = [
        m["usage"]["prompt_tokens"]
        for s in doc["simulations"]
        for m in s["messages"]
        if m["role"] == "assistant" and m["usage"] is not None
    ]
    exp = expected(doc)
    for info in (inspect_trace(trace), inspect_cli(trace.path)):
        assert info["requests"] == sum(agent_calls) == 217
        assert info["sessions"] == len(doc["simulations"]) == 20  # README
        # README: agent LLM calls per session p50 10, max 19
        assert info["turns_per_session"]["p50"] == nearest_rank(agent_calls, 50) == 10
        assert info["turns_per_session"]["max"] == max(agent_calls) == 19
        # README: agent prompt_tokens (real) min 6,275, p50 7,002, max 9,555
        assert info["input_tokens"]["min"] == min(prompts) == 6_275
        assert info["input_tokens"]["p50"] == nearest_rank(prompts, 50) == 7_002
        assert info["input_tokens"]["max"] == max(prompts) == 9_555
        assert info["max_tokens"]["max"] == 269  # README: completion tokens max 269
        assert info["models"] == {"gpt-4o": 217}
        first = min(e["start_us"] for e in exp)
        last = max(e["end_us"] for e in exp)
        assert info["duration_s"] == (last - first) / 1e6
        assert info["provenance"]["timing"] == "recorded"


@pytest.mark.inprocess
def test_meta_on_first_turn(trace, doc):
    sim = doc["simulations"][0]
    r = trace.row_of(f"{sim['id']}:0")
    assert trace.meta(r) == {
        "task_id": sim["task_id"],
        "trial": 0,
        "termination_reason": "user_stop",
        "reward": sim["reward_info"]["reward"],
    }
    assert trace.meta(r + 1) is None


@pytest.mark.inprocess
def test_bare_policy_system_and_model_override(src, doc, tmp_path):
    t = import_trace(
        "tau2-bench", [src], tmp_path / "p.arrow", "--system", "policy", "--model", "my-model"
    )
    policy = doc["info"]["environment_info"]["policy"]
    exp = expected(doc, system=policy)
    assert len(t) == len(exp)
    for r in range(0, len(exp), 7):
        assert t.body(r) == {**exp[r]["body"], "model": "my-model"}
    assert t.body(0)["messages"][0] == {"role": "system", "content": policy}


@pytest.mark.inprocess
def test_wrong_format_and_bad_input(shared_data, src, tmp_path):
    tau = shared_data / "tau_bench" / "gpt-4o-airline.json.gz"
    assert_import_fails("tau2-bench", tau, tmp_path, "not τ²-bench", "not an object")
    swe = next((shared_data / "swe_agent" / "test_data").rglob("*.traj"))
    assert_import_fails("tau2-bench", swe, tmp_path, "no simulations")
    kv = shared_data / "kv_cache_tester_claude_code" / "trace_0001.json.gz"
    assert_import_fails("tau2-bench", kv, tmp_path, "no simulations")
    assert_import_fails("tau2-bench", garbage_file(tmp_path), tmp_path, "invalid JSON")
    assert_import_fails(
        "tau2-bench", truncated_file(src, tmp_path, 50_000), tmp_path, "invalid JSON"
    )
    assert_import_fails("tau2-bench", truncated_gzip(src, tmp_path), tmp_path, "not readable")
    # a message without a timestamp
    broken = json.loads(truncated_file(src, tmp_path, 10**9, "whole.json").read_text())
    del broken["simulations"][3]["messages"][5]["timestamp"]
    bad = tmp_path / "no-ts.json"
    bad.write_text(json.dumps(broken))
    assert_import_fails("tau2-bench", bad, tmp_path, "simulation 3: message 5 has no timestamp")


@pytest.mark.inprocess
def test_malformed_simulations_fail_cleanly(doc, tmp_path):
    small = {**doc, "tasks": [], "simulations": doc["simulations"][:2]}
    ok, refused = assert_fails_cleanly_or_imports(
        "tau2-bench", mutants(small, seed=2, n=40), tmp_path, ".json"
    )
    assert ok > 0 and refused > 0 and ok + refused == 40
