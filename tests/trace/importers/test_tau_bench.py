"""τ-bench importer on the real GPT-4o airline trajectories: every request
rebuilt naively from the JSON (teacher-forced prefixes of ``traj``)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from replayer.trace import Trace
from replayer.trace.stats import inspect_trace
from tests.helpers.importers import (
    approx_tokens,
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

STEM = "gpt-4o-airline"


def reply_len(m: dict[str, Any]) -> int:
    """ceil(chars / 4) of content + tool-call names and arguments, >= 1."""
    chars = len(m.get("content") or "")
    for call in m.get("tool_calls") or []:
        chars += len(call["function"]["name"]) + len(call["function"]["arguments"])
    return max(1, math.ceil(chars / 4))


def expected(runs: list[dict[str, Any]], gap=1.0, think=2.0, base=0.5, per_tok=0.02):
    """One dict per request, in source order: ids, timing, body, outcome."""
    out = []
    for s, run in enumerate(runs):
        sid = f"{STEM}/task{run['task_id']}-trial{run['trial']}"
        t = round(s * gap * 1e6)
        turn = 0
        for i, m in enumerate(run["traj"]):
            if m["role"] != "assistant":
                continue
            n = reply_len(m)
            end = t + round((base + per_tok * n) * 1e6)
            out.append(
                {
                    "request_id": f"{sid}:{turn}",
                    "session_id": sid,
                    "turn": turn,
                    "start_us": t,
                    "end_us": end,
                    "body": {"messages": run["traj"][:i], "max_tokens": n},
                    "output_text": m["content"],
                    "output_tool_calls": m.get("tool_calls"),
                    "finish_reason": "tool_calls" if m.get("tool_calls") else "stop",
                    "input_tokens": approx_tokens(run["traj"][:i]),
                }
            )
            t = end + round(think * 1e6)
            turn += 1
    return out


@pytest.fixture(scope="module")
def src(shared_data: Path) -> Path:
    return shared_data / "tau_bench" / "gpt-4o-airline.json.gz"


@pytest.fixture(scope="module")
def runs(src: Path) -> list[dict[str, Any]]:
    with gzip.open(src, "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def trace(src: Path, tmp_path_factory) -> Trace:
    return import_trace("tau-bench", [src], tmp_path_factory.mktemp("tb") / "tb.arrow")


@pytest.mark.inprocess
def test_every_request_reconstructs(trace, runs):
    exp = expected(runs)
    assert len(trace) == len(exp) == 2_454
    c = trace.column
    # rows are stored session by session in file order; trace order is by start
    by_start = sorted(range(len(exp)), key=lambda i: (exp[i]["start_us"], i))
    assert [c("request_id")[r] for r in trace.order] == [exp[i]["request_id"] for i in by_start]
    for r, e in enumerate(exp):
        assert c("request_id")[r] == e["request_id"]
        assert (c("session_id")[r], c("turn")[r]) == (e["session_id"], e["turn"])
        assert (c("start_us")[r], c("end_us")[r]) == (e["start_us"], e["end_us"])
        assert (c("kind")[r], c("path")[r]) == ("chat", "/v1/chat/completions")
        assert c("max_tokens")[r] == e["body"]["max_tokens"]
        assert c("input_tokens")[r] == e["input_tokens"]
        assert trace.body(r) == e["body"]
        out = trace.outcome(r)
        assert out["status"] == 200
        assert out["output_text"] == e["output_text"]
        assert out["output_tool_calls"] == e["output_tool_calls"]
        assert out["finish_reason"] == e["finish_reason"]
    # key order inside messages is the source's (assistant turns say content first)
    last = json.loads(trace.body_json(len(exp) - 1))["messages"]
    assert [list(m) for m in last] == [list(m) for m in runs[-1]["traj"][: len(last)]]


@pytest.mark.inprocess
def test_sessions_turns_and_meta(trace, runs):
    c = trace.column
    first = trace.row_of(f"{STEM}/task0-trial0:0")
    assert trace.meta(first) == {"task_id": 0, "trial": 0, "reward": 0.0}
    assert trace.meta(first + 1) is None
    # each request extends the previous one: only the first of a session is a keyframe
    keyframes = [r for r in range(len(trace)) if c("base")[r] is None]
    assert len(keyframes) == 200
    assert all(c("turn")[r] == 0 for r in keyframes)


def test_inspect_matches_source_and_readme(trace, runs):
    assistant = [sum(m["role"] == "assistant" for m in r["traj"]) for r in runs]
    messages = [len(r["traj"]) for r in runs]
    # the README's figures, read straight from the source
    assert len(runs) == 200 and len({(r["task_id"], r["trial"]) for r in runs}) == 200
    assert (nearest_rank(assistant, 50), max(assistant)) == (11, 30)
    assert (nearest_rank(messages, 50), max(messages)) == (24, 62)

    # README's prompt size: content + serialized tool calls, chars/4
    def readme_size(msgs: list[dict[str, Any]]) -> float:
        return (
            sum(
                len(m["content"] or "")
                + (len(json.dumps(m["tool_calls"])) if m.get("tool_calls") else 0)
                for m in msgs
            )
            / 4
        )

    sizes = [
        readme_size(r["traj"][:i])
        for r in runs
        for i, m in enumerate(r["traj"])
        if m["role"] == "assistant"
    ]
    assert (math.floor(min(sizes)), max(sizes)) == (1_546, 8_223)
    exp_max = max(e["input_tokens"] for e in expected(runs))
    for info in (inspect_trace(trace), inspect_cli(trace.path)):
        assert info["requests"] == sum(assistant) == 2_454
        assert info["sessions"] == 200
        assert info["turns_per_session"]["p50"] == 11
        assert info["turns_per_session"]["max"] == 30
        assert info["input_tokens"]["max"] == exp_max == 7_728
        assert info["kinds"] == {"chat": 2_454}
        assert info["provenance"]["timing"] == "synthetic"


@pytest.mark.inprocess
def test_timing_and_model_options(runs, tmp_path):
    small = tmp_path / "three.json"
    small.write_text(json.dumps(runs[:3]))
    t = import_trace(
        "tau-bench",
        [small],
        tmp_path / "t.arrow",
        "--session-gap",
        "30",
        "--think",
        "1.5",
        "--api-base",
        "0.25",
        "--api-per-token",
        "0.01",
        "--model",
        "gpt-4o",
    )
    exp = expected(runs[:3], 30.0, 1.5, 0.25, 0.01)
    assert len(t) == len(exp)
    for r, e in enumerate(exp):
        assert t.column("request_id")[r] == e["request_id"].replace(STEM, "three")
        assert (t.column("start_us")[r], t.column("end_us")[r]) == (e["start_us"], e["end_us"])
        assert t.body(r) == {"model": "gpt-4o", **e["body"]}
    assert t.column("start_us")[t.row_of("three/task1-trial0:0")] == 30_000_000


@pytest.mark.inprocess
def test_repeated_task_and_trial_stay_apart(runs, tmp_path):
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps([runs[0], runs[0]]))
    t = import_trace("tau-bench", [twice], tmp_path / "t.arrow")
    sessions = list(dict.fromkeys(t.column("session_id")))
    assert sessions == ["twice/task0-trial0", "twice/task0-trial0~2"]


@pytest.mark.inprocess
def test_wrong_format_and_bad_input(shared_data, src, tmp_path):
    tau2 = shared_data / "tau2_bench" / "telecom_gpt-4o_agent_gpt-4o_user_2025-08-10.json.gz"
    assert_import_fails("tau-bench", tau2, tmp_path, "not τ-bench", "not a list")
    swe = next((shared_data / "swe_agent" / "test_data").rglob("*.traj"))
    assert_import_fails("tau-bench", swe, tmp_path, "not a list")
    mini = shared_data / "mini_swe_agent" / "github_issue.traj.json"
    assert_import_fails("tau-bench", mini, tmp_path, "entry 0 has no task_id, traj")
    assert_import_fails("tau-bench", garbage_file(tmp_path), tmp_path, "invalid JSON")
    assert_import_fails(
        "tau-bench", truncated_file(src, tmp_path, 100_000), tmp_path, "invalid JSON"
    )
    assert_import_fails("tau-bench", truncated_gzip(src, tmp_path), tmp_path, "not readable")


@pytest.mark.inprocess
def test_malformed_runs_fail_cleanly(runs, tmp_path):
    ok, refused = assert_fails_cleanly_or_imports(
        "tau-bench", mutants(runs[:2], seed=1, n=40), tmp_path, ".json"
    )
    assert ok > 0 and refused > 0 and ok + refused == 40
