"""Session inference on Anthropic Messages and OpenAI Responses traffic:
interleaved Claude Code-like and Codex-like sessions are separated exactly,
thinking blocks and reasoning items take no part in matching, a
``previous_response_id`` names the parent outright, and the APIs never
continue each other."""

from __future__ import annotations

import random
from typing import Any

import pytest

from replayer.record.sessions import SessionTracker

pytestmark = pytest.mark.inprocess


class Claude:
    """A Claude Code-like client: echoes the reply's blocks back (with its
    thinking and a moving ``cache_control``), then a tool_result."""

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": f"task {sid}"}]}
        ]
        self.turn = 0

    def request(self) -> dict[str, Any]:
        msgs = [dict(m) for m in self.messages]
        last = dict(msgs[-1])
        last["content"] = [*last["content"][:-1], {**last["content"][-1], "cache_control": {}}]
        msgs[-1] = last
        return {"model": "claude", "system": "You are Claude Code.", "messages": msgs}

    def reply(self) -> dict[str, Any]:
        """The assistant message as the recorder assembles it from the stream."""
        call = {
            "type": "tool_use",
            "id": f"toolu_{self.sid}_{self.turn}",
            "name": "Bash",
            "input": {"command": f"ls {self.sid}/{self.turn}"},
        }
        return {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, call]}

    def answered(self, reply: dict[str, Any]) -> None:
        thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig=="}
        self.messages.append({"role": "assistant", "content": [thinking, *reply["content"]]})
        call_id = reply["content"][-1]["id"]
        result = {"type": "tool_result", "tool_use_id": call_id, "content": "ok"}
        self.messages.append({"role": "user", "content": [result]})
        self.turn += 1


class Codex:
    """A Codex-like client: the full input every turn, the reply's output
    items (reasoning included) echoed back, then the call's output."""

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.items: list[dict[str, Any]] = [{"role": "user", "content": f"task {sid}"}]
        self.turn = 0

    def request(self) -> dict[str, Any]:
        return {"model": "gpt", "instructions": "You are Codex.", "input": list(self.items)}

    def reply(self) -> list[dict[str, Any]]:
        return [
            {"type": "reasoning", "id": f"rs_{self.turn}", "encrypted_content": "gAAA"},
            {
                "type": "function_call",
                "id": f"fc_{self.turn}",
                "call_id": f"call_{self.sid}_{self.turn}",
                "name": "shell",
                "arguments": '{"command": ["ls"]}',
                "status": "completed",
            },
        ]

    def answered(self, reply: list[dict[str, Any]]) -> None:
        for item in reply:  # sent back without the ids and statuses
            self.items.append({k: v for k, v in item.items() if k not in ("id", "status")})
        out = {"type": "function_call_output", "call_id": reply[-1]["call_id"], "output": "ok"}
        self.items.append(out)
        self.turn += 1


def test_interleaved_claude_and_codex_sessions_are_separated_exactly():
    for seed in range(4):
        rng = random.Random(seed)
        agents: list[Claude | Codex] = [Claude(i) for i in range(4)] + [Codex(i) for i in range(4)]
        tracker = SessionTracker()
        got: dict[str, tuple[Any, int, int]] = {}
        inflight: list[tuple[Claude | Codex, str]] = []
        n = 0
        while any(a.turn < 5 for a in agents) or inflight:
            idle = [a for a in agents if a.turn < 5 and all(a is not b for b, _ in inflight)]
            if idle and (not inflight or rng.random() < 0.5):
                a = rng.choice(idle)
                n += 1
                rid = f"r{n:03d}"
                api = "messages" if isinstance(a, Claude) else "responses"
                assignment = tracker.assign(rid, a.request(), api=api)
                got[rid] = (assignment, id(a), a.turn)
                inflight.append((a, rid))
            else:
                a, rid = inflight.pop(rng.randrange(len(inflight)))
                reply = a.reply()
                tracker.complete(rid, reply, ok=True)
                a.answered(reply)  # type: ignore[arg-type]
        first: dict[int, str] = {}
        for rid, (asg, agent, turn) in sorted(got.items()):
            first.setdefault(agent, rid)
            assert (asg.session_id, asg.turn) == (f"s-{first[agent]}", turn), (seed, rid)
            assert asg.source == ("new" if turn == 0 else "next")
        assert len(first) == 8


def test_previous_response_id_names_the_parent_and_a_second_child_forks():
    tracker = SessionTracker()
    a = tracker.assign("r1", {"input": "hi"}, api="responses")
    tracker.complete("r1", [{"type": "message", "role": "assistant", "content": "yo"}], ok=True)
    # a chained request carries only its new input: nothing to match, the id decides
    b = tracker.assign("r2", {"input": [{"role": "user", "content": "more"}]}, api="responses",
                       parent="r1")  # fmt: skip
    assert (b.session_id, b.turn, b.source, b.parent) == (a.session_id, 1, "chain", "r1")
    c = tracker.assign("r3", {"input": "again"}, api="responses", parent="r1")
    assert (c.session_id, c.turn, c.source, c.parent) == ("s-r3", 0, "fork", "r1")
    # a parent the tracker never saw: matched as usual (here: nothing)
    d = tracker.assign("r4", {"input": "x"}, api="responses", parent="never-seen")
    assert (d.session_id, d.source, d.parent) == ("s-r4", "new", None)


def test_the_apis_never_continue_each_other():
    tracker = SessionTracker()
    msg = {"role": "user", "content": "hello"}
    tracker.assign("chat", {"messages": [msg]})
    tracker.complete("chat", {"role": "assistant", "content": "hi"}, ok=True)
    body = {"messages": [msg, {"role": "assistant", "content": "hi"}, msg]}
    assert tracker.assign("anthropic", body, api="messages").source == "new"
    assert tracker.assign("chat2", body).source == "next"


def test_a_failed_messages_request_is_continued_by_its_retry():
    tracker = SessionTracker()
    body = Claude(0).request()
    tracker.assign("r1", body, api="messages")
    tracker.complete("r1", None, ok=False)
    again = tracker.assign("r2", body, api="messages")
    assert (again.source, again.parent, again.turn) == ("next", "r1", 1)
