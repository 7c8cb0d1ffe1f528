"""Session inference: exact on interleaved header-less sessions and on forks,
tolerant of clients re-serializing what they send back, and bounded."""

from __future__ import annotations

import random

import pytest

from replayer.record.sessions import SessionTracker, norm_message

pytestmark = pytest.mark.inprocess

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools."}


def reply_for(sid: int, turn: int) -> dict:
    if turn % 2:
        call = {
            "id": f"call-{sid}-{turn}",
            "type": "function",
            "function": {"name": "bash", "arguments": f'{{"cmd": "ls {sid}/{turn}"}}'},
        }
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    return {"role": "assistant", "content": f"session {sid} says {turn}"}


def echo_back(msg: dict, style: int) -> dict:
    """How different clients send the assistant message back."""
    if style == 0:
        return msg
    if style == 1:  # SDK model_dump(): extra nulls, content None for tool calls, key order
        out = {"content": msg.get("content") or None, "refusal": None, "role": "assistant"}
        out.update(annotations=None, audio=None, function_call=None, reasoning=None)
        if msg.get("tool_calls"):
            calls = []
            for c in msg["tool_calls"]:
                args = c["function"]["arguments"]
                calls.append(
                    {
                        "function": {"arguments": args.replace(": ", ":"), "name": "bash"},
                        "id": c["id"],
                        "type": "function",
                    }
                )
            out["tool_calls"] = calls
        return out
    # style 2: content as parts, no id on the tool calls, whitespace trimmed differently
    out = {"role": "assistant"}
    if msg.get("content"):
        out["content"] = [{"type": "text", "text": msg["content"] + "\n"}]
    if msg.get("tool_calls"):
        out["tool_calls"] = [
            {"type": "function", "function": c["function"]} for c in msg["tool_calls"]
        ]
    return out


class Agent:
    def __init__(self, sid: int, style: int) -> None:
        self.sid = sid
        self.style = style
        self.messages = [SYSTEM, {"role": "user", "content": f"task {sid}"}]
        self.turn = 0

    def request(self) -> dict:
        return {"model": "m", "messages": list(self.messages), "stream": True}

    def answered(self, reply: dict) -> None:
        self.messages.append(echo_back(reply, self.style))
        if reply.get("tool_calls"):
            call_id = reply["tool_calls"][0]["id"]
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": "ok"})
        else:
            self.messages.append({"role": "user", "content": f"next {self.turn}"})
        self.turn += 1


def run_agents(seed: int, count: int, turns: int):
    """Interleaved agents through a tracker; returns {rid: (assignment, sid, turn)}."""
    rng = random.Random(seed)
    agents = [Agent(i, i % 3) for i in range(count)]
    tracker = SessionTracker()
    out = {}
    inflight: list[tuple[Agent, str]] = []
    n = 0
    while any(a.turn < turns for a in agents) or inflight:
        idle = [a for a in agents if a.turn < turns and all(a is not b for b, _ in inflight)]
        if idle and (not inflight or rng.random() < 0.5):
            a = rng.choice(idle)
            n += 1
            rid = f"r{n:03d}"
            out[rid] = (tracker.assign(rid, a.request(), None), a.sid, a.turn)
            inflight.append((a, rid))
        else:
            a, rid = inflight.pop(rng.randrange(len(inflight)))
            reply = reply_for(a.sid, a.turn)
            tracker.complete(rid, reply, ok=True)
            a.answered(reply)
    return out


def test_interleaved_sessions_without_headers_are_separated_exactly():
    for seed in range(5):
        got = run_agents(seed, count=7, turns=6)
        first: dict[int, str] = {}
        for rid, (a, sid, turn) in sorted(got.items()):
            first.setdefault(sid, rid)
            assert a.session_id == f"s-{first[sid]}", (seed, rid)
            assert a.turn == turn
            assert a.source == ("new" if turn == 0 else "next")
        assert len(first) == 7


def chat(*messages) -> dict:
    return {"messages": [SYSTEM, *messages]}


def test_forks_become_sessions_sharing_the_parent():
    t = SessionTracker()
    u0 = {"role": "user", "content": "fix the bug"}
    a0 = {"role": "assistant", "content": "which file?"}
    assert t.assign("p", chat(u0), None).source == "new"
    t.complete("p", a0, ok=True)
    c1 = t.assign("c1", chat(u0, a0, {"role": "user", "content": "main.py"}), None)
    c2 = t.assign("c2", chat(u0, a0, {"role": "user", "content": "util.py"}), None)
    assert (c1.session_id, c1.turn, c1.source, c1.parent) == ("s-p", 1, "next", "p")
    assert (c2.session_id, c2.turn, c2.source, c2.parent) == ("s-c2", 0, "fork", "p")
    # each branch continues on its own
    b1, b2 = {"role": "assistant", "content": "patched main"}, {"role": "assistant", "content": "u"}
    t.complete("c1", b1, ok=True)
    t.complete("c2", b2, ok=True)
    nxt = {"role": "user", "content": "thanks"}
    d2 = t.assign("d2", chat(u0, a0, {"role": "user", "content": "util.py"}, b2, nxt), None)
    d1 = t.assign("d1", chat(u0, a0, {"role": "user", "content": "main.py"}, b1, nxt), None)
    assert (d1.session_id, d1.turn, d1.parent) == ("s-p", 2, "c1")
    assert (d2.session_id, d2.turn, d2.parent) == ("s-c2", 1, "c2")
    # going back to an earlier point of a session that moved on is a fork too
    e = t.assign("e", chat(u0, a0, {"role": "user", "content": "no, lib.py"}), None)
    assert (e.session_id, e.turn, e.source, e.parent) == ("s-e", 0, "fork", "p")


def test_normalization_tolerates_reserialization():
    a = {"role": "assistant", "content": "hi", "tool_calls": [reply_for(1, 1)["tool_calls"][0]]}
    b = echo_back(a, 1)
    c = echo_back(a, 2)
    assert norm_message(a) == norm_message(b) == norm_message(c)
    assert norm_message({"role": "assistant", "content": None}) == norm_message(
        {"role": "assistant"}
    )
    assert norm_message({"role": "assistant", "content": ""}) == norm_message(
        {"role": "assistant", "content": None, "refusal": None}
    )
    # arguments "" and "{}" are the same call; different arguments are not
    call = {"function": {"name": "f", "arguments": ""}}
    same = {"function": {"name": "f", "arguments": "{}"}}
    other = {"function": {"name": "f", "arguments": '{"x": 1}'}}
    m = {"role": "assistant", "tool_calls": [call]}
    assert norm_message(m) == norm_message({**m, "tool_calls": [same]})
    assert norm_message(m) != norm_message({**m, "tool_calls": [other]})
    # a tool message keeps its call id; cache_control markers are ignored
    t1 = {"role": "tool", "tool_call_id": "a", "content": "x"}
    assert norm_message(t1) != norm_message({**t1, "tool_call_id": "b"})
    parts = [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]
    assert norm_message({"role": "user", "content": parts}) == norm_message(
        {"role": "user", "content": "x"}
    )


def test_header_sessions_win_and_count_turns():
    t = SessionTracker()
    assert t.assign("a", chat({"role": "user", "content": "x"}), "S1").turn == 0
    t.complete("a", {"role": "assistant", "content": "y"}, ok=True)
    b = t.assign(
        "b", chat({"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}), "S2"
    )
    # named by the header, but its delta base is still found by content
    assert (b.session_id, b.turn, b.source, b.parent) == ("S2", 0, "header", "a")
    assert t.assign("c", chat({"role": "user", "content": "z"}), "S1").turn == 1


def test_retry_after_failure_and_resume_after_abandon():
    t = SessionTracker()
    u = {"role": "user", "content": "go"}
    t.assign("a", chat(u), None)
    t.complete("a", None, ok=False)  # a 500: no reply
    r = t.assign("b", chat(u), None)  # the agent retries the same request
    assert (r.session_id, r.turn, r.parent) == ("s-a", 1, "a")
    t.complete("b", {"role": "assistant", "content": "partial"}, ok=False)  # abandoned
    # resumed without the lost reply, or with the partial one: both continue
    r1 = t.assign("c", chat(u, {"role": "user", "content": "again"}), None)
    assert (r1.session_id, r1.turn, r1.parent) == ("s-a", 2, "b")
    t.complete("c", {"role": "assistant", "content": "fine"}, ok=True)
    # a success is not matchable without its reply: the same request again is new
    other = t.assign("d", chat(u, {"role": "user", "content": "again"}), None)
    assert other.source == "fork" and other.parent == "b"


def test_text_completions_continue_on_prompt_plus_completion():
    t = SessionTracker()
    p0 = "The quick brown fox jumps over the lazy dog. " * 3
    t.assign("a", {"prompt": p0}, None)
    t.complete("a", " It ran away.", ok=True)
    other = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 2
    t.assign("x", {"prompt": other}, None)
    t.complete("x", " Sed do.", ok=True)
    b = t.assign("b", {"prompt": p0 + " It ran away. Then"}, None)
    assert (b.session_id, b.turn, b.parent) == ("s-a", 1, "a")
    # a prompt that shares only the beginning is a new session
    c = t.assign("c", {"prompt": p0 + " It ran home."}, None)
    assert c.source == "new"
    y = t.assign("y", {"prompt": other + " Sed do. Eiusmod"}, None)
    assert (y.session_id, y.turn) == ("s-x", 1)
    # raw bodies (token-id prompts) are never matched
    assert t.assign("z", {"prompt": [1, 2, 3]}, None).source == "new"


def test_memory_is_bounded():
    t = SessionTracker(memory=50)
    for i in range(500):
        t.assign(f"r{i}", chat({"role": "user", "content": f"q{i}"}), None)
        t.complete(f"r{i}", {"role": "assistant", "content": f"a{i}"}, ok=True)
    assert len(t._chat) <= 50 and len(t._info) <= 50 and t.sessions <= 50
    # recent sessions still continue
    r = t.assign(
        "z",
        chat(
            {"role": "user", "content": "q499"},
            {"role": "assistant", "content": "a499"},
            {"role": "user", "content": "more"},
        ),
        None,
    )
    assert (r.session_id, r.turn) == ("s-r499", 1)
