"""SWE-agent importer on the 22 real ``.traj`` files and the mini-swe-agent
message list: every request is a history prefix, rebuilt naively."""

from __future__ import annotations

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
    truncated_file,
)

OPENAI_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")


def clean(m: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in m.items():
        if k in OPENAI_KEYS and (v is not None or k == "content"):
            out[k] = v
        if k == "tool_call_ids":
            out["tool_call_id"] = v[0]
    return out


def reply_len(m: dict[str, Any]) -> int:
    chars = len(m["content"] or "")
    for c in m.get("tool_calls") or []:
        chars += len(c["function"]["name"]) + len(c["function"]["arguments"])
    return max(1, math.ceil(chars / 4))


def sources(shared_data: Path) -> list[tuple[str, list[dict[str, Any]]]]:
    """(session id, history) per file, in import order: the swe_agent tree
    sorted by relative path, then the mini-swe-agent file."""
    root = shared_data / "swe_agent"
    files = sorted(root.rglob("*.traj"), key=lambda p: p.relative_to(root).as_posix())
    out = [
        (p.relative_to(root).as_posix()[: -len(".traj")], json.loads(p.read_text())["history"])
        for p in files
    ]
    mini = shared_data / "mini_swe_agent" / "github_issue.traj.json"
    out.append(("github_issue", json.loads(mini.read_text())))
    return out


def expected(srcs, gap=1.0, think=2.0, base=0.5, per_tok=0.02) -> list[dict[str, Any]]:
    out = []
    for s, (sid, history) in enumerate(srcs):
        t = round(s * gap * 1e6)
        turn = 0
        for i, m in enumerate(history):
            if m["role"] != "assistant":
                continue
            n = reply_len(m)
            end = t + round((base + per_tok * n) * 1e6)
            msgs = [clean(x) for x in history[:i]]
            out.append(
                {
                    "request_id": f"{sid}:{turn}",
                    "session_id": sid,
                    "turn": turn,
                    "start_us": t,
                    "end_us": end,
                    "body": {"messages": msgs, "max_tokens": n},
                    "input_tokens": approx_tokens(msgs),
                    "output_text": m["content"],
                    "output_tool_calls": m.get("tool_calls"),
                }
            )
            t = end + round(think * 1e6)
            turn += 1
    return out


@pytest.fixture(scope="module")
def srcs(shared_data: Path):
    return sources(shared_data)


@pytest.fixture(scope="module")
def trace(shared_data: Path, tmp_path_factory) -> Trace:
    return import_trace(
        "swe-agent",
        [shared_data / "swe_agent", shared_data / "mini_swe_agent" / "github_issue.traj.json"],
        tmp_path_factory.mktemp("swe") / "swe.arrow",
    )


@pytest.mark.inprocess
def test_every_request_reconstructs(trace, srcs):
    exp = expected(srcs)
    assert len(srcs) == 23  # README: 22 .traj files + the mini-swe-agent run
    assert len(trace) == len(exp) == 240
    c = trace.column
    for r, e in enumerate(exp):
        assert c("request_id")[r] == e["request_id"]
        assert (c("session_id")[r], c("turn")[r]) == (e["session_id"], e["turn"])
        assert (c("start_us")[r], c("end_us")[r]) == (e["start_us"], e["end_us"])
        assert c("input_tokens")[r] == e["input_tokens"]
        assert trace.body(r) == e["body"]
        out = trace.outcome(r)
        assert out["status"] is None  # mostly replays, not live calls
        assert out["output_text"] == e["output_text"]
        assert out["output_tool_calls"] == e["output_tool_calls"]
        assert out["finish_reason"] == ("tool_calls" if e["output_tool_calls"] else "stop")


@pytest.mark.inprocess
def test_bodies_hold_only_openai_keys_and_answered_tool_calls(trace):
    for r in range(len(trace)):
        open_calls: set[str] = set()
        for m in trace.body(r)["messages"]:
            assert set(m) <= set(OPENAI_KEYS), m.keys()
            if m["role"] == "assistant":
                open_calls = {tc["id"] for tc in m.get("tool_calls", [])}
            elif m["role"] == "tool":
                open_calls.remove(m["tool_call_id"])


@pytest.mark.inprocess
def test_function_calling_runs_and_readme_figures(trace, srcs):
    c = trace.column
    per_session: dict[str, list[int]] = {}
    for r in range(len(trace)):
        per_session.setdefault(c("session_id")[r], []).append(r)
    # README: the three *function_calling* marshmallow replays have 11-13 tool calls each
    fc = sorted(
        sum(trace.outcome(r)["output_tool_calls"] is not None for r in rows)
        for sid, rows in per_session.items()
        if "marshmallow-1867__function_calling" in sid
    )
    assert fc == [11, 11, 13]
    # README: mini-swe-agent run of 22 messages, 10 assistant -> 10 requests
    assert len(per_session["github_issue"]) == 10
    mini = dict(srcs)["github_issue"]
    last_reply = max(i for i, m in enumerate(mini) if m["role"] == "assistant")
    assert (len(mini), last_reply) == (22, 20)
    assert trace.body(per_session["github_issue"][-1])["messages"] == mini[:20]
    # README: the 3 real GPT-4 runs made 5-12 API calls; the history keeps 4-12 replies
    real = sorted(len(rows) for sid, rows in per_session.items() if sid.startswith("test_data/"))
    assert real == [4, 5, 12]
    # turn 0 meta keeps the run's exit status and model stats
    r0 = per_session[next(s for s in per_session if "pydicom" in s)][0]
    meta = trace.meta(r0)
    assert meta["model_stats"]["tokens_sent"] == 122_612  # README
    assert meta["source"].endswith("pydicom__pydicom-1458.traj")


def test_inspect_matches_source(trace, srcs):
    exp = expected(srcs)
    for info in (inspect_trace(trace), inspect_cli(trace.path)):
        assert (
            info["requests"]
            == sum(sum(m["role"] == "assistant" for m in h) for _, h in srcs)
            == 240
        )
        assert info["sessions"] == 23
        assert info["input_tokens"]["max"] == max(e["input_tokens"] for e in exp) == 14_189
        assert info["kinds"] == {"chat": 240}
        assert info["duration_s"] == (max(e["end_us"] for e in exp)) / 1e6


@pytest.mark.inprocess
def test_single_file_and_duplicate_names(shared_data, tmp_path):
    demos = sorted((shared_data / "swe_agent" / "demonstrations").rglob("marshmallow*.traj"))
    t = import_trace("swe-agent", demos[:2], tmp_path / "two.arrow", "--model", "gpt-4")
    sessions = list(dict.fromkeys(t.column("session_id")))
    assert sessions == [
        "marshmallow-code__marshmallow-1867",
        "marshmallow-code__marshmallow-1867~2",
    ]
    assert set(t.column("model")) == {"gpt-4"}


@pytest.mark.inprocess
def test_wrong_format_and_bad_input(shared_data, tmp_path):
    tau2 = shared_data / "tau2_bench" / "telecom_gpt-4o_agent_gpt-4o_user_2025-08-10.json.gz"
    assert_import_fails("swe-agent", tau2, tmp_path, "not a SWE-agent trajectory", "no history")
    tau = shared_data / "tau_bench" / "gpt-4o-airline.json.gz"
    assert_import_fails("swe-agent", tau, tmp_path, "message 0 is not an object with a role")
    assert_import_fails("swe-agent", garbage_file(tmp_path), tmp_path, "invalid JSON")
    traj = next((shared_data / "swe_agent" / "test_data").rglob("*.traj"))
    assert_import_fails(
        "swe-agent", truncated_file(traj, tmp_path, 5_000), tmp_path, "invalid JSON"
    )
    empty_dir = tmp_path / "nothing"
    empty_dir.mkdir()
    (empty_dir / "readme.txt").write_text("no trajectories here")
    assert_import_fails("swe-agent", empty_dir, tmp_path, "holds no .traj")


@pytest.mark.inprocess
def test_malformed_trajectories_fail_cleanly(shared_data, tmp_path):
    path = sorted((shared_data / "swe_agent" / "test_data").rglob("*.traj"))[0]
    ok, refused = assert_fails_cleanly_or_imports(
        "swe-agent", mutants(json.loads(path.read_text()), seed=3, n=40), tmp_path, ".traj"
    )
    assert ok > 0 and refused > 0 and ok + refused == 40
