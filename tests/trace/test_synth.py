"""synth: agent sessions of the requested shape, deterministic by seed."""

from __future__ import annotations

from collections import Counter

import pytest

from replayer.trace import Trace
from replayer.trace.synth import SynthOptions, write_trace
from replayer.trace.tokens import approx_message_tokens

pytestmark = pytest.mark.inprocess


def make(tmp_path, name="t.arrow", **kw):
    path = tmp_path / name
    write_trace(path, SynthOptions(**kw))
    return Trace.open(path)


def test_shape_and_exact_final_context(tmp_path):
    t = make(tmp_path, sessions=5, turns=7, context=20_000, seed=3)
    assert len(t) == 35
    assert Counter(t.column("session_id")) == {f"synth-{s:05d}": 7 for s in range(5)}
    last = [r for r in range(len(t)) if t.column("turn")[r] == 6]
    assert [t.column("input_tokens")[r] for r in last] == [20_000] * 5
    for r in range(len(t)):
        body = t.body(r)
        # the stored count is the project's approximation of the real body
        assert (
            sum(approx_message_tokens(m) for m in body["messages"]) == t.column("input_tokens")[r]
        )
    # every session shares the system prompt and tool schema
    firsts = [t.body(r) for r in range(len(t)) if t.column("turn")[r] == 0]
    assert len({f["messages"][0]["content"] for f in firsts}) == 1
    assert len({str(f["tools"]) for f in firsts}) == 1


def test_turns_chain_teacher_forced_and_ordered_in_time(tmp_path):
    t = make(tmp_path, sessions=2, turns=5, context=10_000, seed=1)
    assert t.column("start_us") == sorted(t.column("start_us"))  # written in trace order
    for r in range(len(t)):
        sid, k = t.column("session_id")[r], t.column("turn")[r]
        if k == 0:
            continue
        p = t.row_of(f"{sid}-t{k - 1:03d}")
        prev, cur = t.body(p), t.body(r)
        out = t.outcome(p)
        # turn k = turn k-1 + its recorded reply (a tool call) + the tool's output
        assert cur["messages"][: len(prev["messages"])] == prev["messages"]
        reply, tool = cur["messages"][len(prev["messages"]) :]
        assert reply["tool_calls"] == out["output_tool_calls"]
        assert tool["role"] == "tool" and tool["tool_call_id"] == reply["tool_calls"][0]["id"]
        assert t.column("start_us")[r] > t.column("end_us")[p]
        assert t.column("base")[r] == p  # stored as a delta on the previous turn


def test_deterministic_by_seed(tmp_path):
    a = make(tmp_path, "a.arrow", sessions=3, turns=4, context=8_000, seed=9)
    b = make(tmp_path, "b.arrow", sessions=3, turns=4, context=8_000, seed=9)
    c = make(tmp_path, "c.arrow", sessions=3, turns=4, context=8_000, seed=10)
    assert [a.body_json(r) for r in range(12)] == [b.body_json(r) for r in range(12)]
    assert a.column("start_us") == b.column("start_us")
    assert [a.body_json(r) for r in range(12)] != [c.body_json(r) for r in range(12)]


def test_blocks_payload_shares_the_system_prefix(tmp_path):
    t = make(
        tmp_path,
        sessions=3,
        turns=4,
        context=6_000,
        payload="blocks",
        block_size=64,
        system_tokens=640,
        seed=2,
    )
    assert set(t.column("kind")) == {"blocks"}
    contents = [t.content(r) for r in range(len(t))]
    shared = (640 + 4) // 64  # the system message's tokens in whole blocks
    assert {tuple(c[:shared]) for c in contents} == {tuple(range(1, shared + 1))}
    assert all(len(c) == n // 64 for c, n in zip(contents, t.column("input_tokens"), strict=True))
    # a session's turns extend each other
    rows = [t.row_of(f"synth-00001-t{k:03d}") for k in range(4)]
    assert [t.column("base")[r] for r in rows[1:]] == rows[:3]
    assert len(t.body(rows[3])["prompt"]) == t.column("input_tokens")[rows[3]]
