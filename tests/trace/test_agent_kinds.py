"""Payload kinds ``messages`` (Anthropic) and ``responses`` (OpenAI Responses):
bodies come back byte for byte (so equal as JSON, key order kept), the query
string stays on the path, and a growing session stores each message once."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import orjson
import pytest

from replayer.cli import main
from replayer.errors import OptionError
from replayer.trace import RequestRecord, Trace, TraceMeta, TraceWriter
from replayer.trace.model import kind_of
from replayer.trace.schema import Kind
from replayer.trace.synth import SynthOptions, sessions

pytestmark = pytest.mark.inprocess


def cli(*args: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


SYSTEM = [
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
    {"type": "text", "text": "x" * 4000, "cache_control": {"type": "ephemeral"}},
]
TOOLS = [
    {
        "name": "Read",
        "description": "Reads a file from the local filesystem.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}},
            "required": ["file_path"],
        },
    }
]


def claude_code_session(turns: int) -> list[dict[str, Any]]:
    """Bodies as Claude Code sends them: the breakpoint ``cache_control``
    moves to the newest message every turn, thinking blocks carry signatures."""
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]}
    ]
    bodies = []
    for k in range(turns):
        msgs = json.loads(json.dumps(history))
        last = msgs[-1]["content"][-1]
        last["cache_control"] = {"type": "ephemeral"}
        bodies.append(
            {
                "model": "claude-sonnet-4-5",
                "messages": msgs,
                "temperature": 1,
                "system": SYSTEM,
                "tools": TOOLS,
                "metadata": {"user_id": "user_abc_account__session_1"},
                "max_tokens": 32000,
                "thinking": {"type": "enabled", "budget_tokens": 10000},
                "stream": True,
            }
        )
        history.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": f"step {k}: read it",
                        "signature": "Eu8B" * 20,
                    },
                    {
                        "type": "tool_use",
                        "id": f"toolu_{k:02d}",
                        "name": "Read",
                        "input": {"file_path": f"/src/mod{k}.py"},
                    },
                ],
            }
        )
        history.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{k:02d}",
                        "content": f"contents of mod{k}.py\n" + "def f(): pass\n" * 200,
                    }
                ],
            }
        )
    return bodies


def codex_session(turns: int) -> list[dict[str, Any]]:
    """Bodies as Codex sends them: full input every turn, reasoning items
    with encrypted content, function calls and their outputs."""
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "run the tests"}],
        }
    ]
    bodies = []
    for k in range(turns):
        bodies.append(
            {
                "model": "gpt-5-codex",
                "instructions": "You are Codex, based on GPT-5." + "y" * 3000,
                "input": json.loads(json.dumps(items)),
                "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
                "tool_choice": "auto",
                "parallel_tool_calls": False,
                "reasoning": {"effort": "medium", "summary": "auto"},
                "store": False,
                "stream": True,
                "include": ["reasoning.encrypted_content"],
            }
        )
        items += [
            {
                "type": "reasoning",
                "id": f"rs_{k}",
                "summary": [{"type": "summary_text", "text": "plan"}],
                "encrypted_content": "gAAAA" + "z" * 300,
            },
            {
                "type": "function_call",
                "name": "shell",
                "arguments": json.dumps({"command": ["pytest", "-x", f"t{k}"]}),
                "call_id": f"call_{k}",
            },
            {"type": "function_call_output", "call_id": f"call_{k}", "output": "ok\n" * 300},
        ]
    return bodies


def write(path, bodies, url):
    with TraceWriter(path, TraceMeta(source="test"), flush_rows=3) as w:
        for k, b in enumerate(bodies):
            w.add(
                RequestRecord.from_body(
                    b, request_id=f"r{k}", session_id="s", turn=k, start_us=k * 1000, path=url
                )
            )
    return Trace.open(path)


@pytest.mark.parametrize(
    ("make", "url", "kind"),
    [
        (claude_code_session, "/v1/messages?beta=true", "messages"),
        (codex_session, "/v1/responses", "responses"),
    ],
    ids=["messages", "responses"],
)
def test_bodies_come_back_byte_for_byte_and_each_item_is_stored_once(tmp_path, make, url, kind):
    bodies = make(12)
    t = write(tmp_path / "t.arrow", bodies, url)
    content_key = "messages" if kind == "messages" else "input"
    assert t.column("kind") == [kind] * 12
    assert t.column("path") == [url] * 12  # the query string is kept
    assert [t.body_json(r) for r in range(12)] == [orjson.dumps(b) for b in bodies]
    assert [t.body(r) for r in range(12)] == bodies
    assert t.column("body_bytes") == [len(orjson.dumps(b)) for b in bodies]
    # every turn deltas against the one before, and params (system or
    # instructions, tools, ...) are stored once per keyframe. Claude Code's
    # moving breakpoint changes the message it leaves, so that one is sent
    # again: turn 1 changes the only message turn 0 had (a keyframe)
    n = [len(b[content_key]) for b in bodies]
    moved = kind == "messages"
    keyframes = [0, 1] if moved else [0]
    assert [r for r in range(12) if t.column("base")[r] is None] == keyframes
    assert t.column("base")[2:] == list(range(1, 11))
    assert t.column("keep")[2:] == [n[k - 1] - moved for k in range(2, 12)]
    assert [len(t._cell(r, "messages")) for r in range(12)] == [n[0]] + [
        n[k] - t.column("keep")[k] for k in range(1, 12)
    ]
    assert max(n[k] - t.column("keep")[k] for k in range(2, 12)) == 3
    stored = [orjson.loads(p) for p in (t._cell(r, "params") for r in range(12)) if p]
    assert len(stored) == len(keyframes)
    assert stored[0][content_key] is None and list(stored[0]) == list(bodies[0])
    # the tokens grow with the context; the recorded JSONL is far bigger
    toks = t.column("input_tokens")
    assert all(b > a for a, b in zip(toks, toks[1:], strict=False))
    assert t.verify().bodies == 12


def test_the_path_decides_between_chat_and_anthropic_messages():
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert kind_of(chat) is Kind.CHAT
    assert kind_of(chat, "/v1/chat/completions") is Kind.CHAT
    assert kind_of(chat, "/v1/messages") is Kind.MESSAGES
    assert kind_of(chat, "/proxy/v1/messages?beta=true") is Kind.MESSAGES
    assert kind_of(chat, "/v1/messages/count_tokens") is Kind.MESSAGES
    # shapes the kind cannot hold stay raw, whole
    assert kind_of({"model": "m", "messages": "hi"}, "/v1/messages") is Kind.RAW
    assert kind_of({"model": "m", "input": "hi"}, "/v1/responses") is Kind.RAW
    assert kind_of({"model": "m", "input": ["a", "b"]}, "/v1/responses") is Kind.RAW
    assert kind_of({"model": "m", "input": [{"type": "message"}]}, "/v1/responses") is (
        Kind.RESPONSES
    )
    assert kind_of({"model": "m", "input": [{"type": "message"}]}) is Kind.RAW  # embeddings?


def test_a_string_input_is_stored_raw_and_still_round_trips(tmp_path):
    bodies = [{"model": "m", "input": "hello", "stream": False}, *codex_session(2)]
    t = write(tmp_path / "t.arrow", bodies, "/v1/responses")
    assert t.column("kind") == ["raw", "responses", "responses"]
    assert [t.body(r) for r in range(3)] == bodies


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_synth_writes_the_same_session_in_every_api(tmp_path, api):
    common = {"sessions": 2, "turns": 6, "context": 8000, "seed": 3, "rate": 1.0}
    chat = list(sessions(SynthOptions(**common)))
    other = list(sessions(SynthOptions(api=api, **common)))
    assert [r.request_id for r in other] == [r.request_id for r in chat]
    # service times follow the context, which each API's framing counts a
    # few tokens apart: microseconds
    assert all(abs(a.start_us - b.start_us) < 1000 for a, b in zip(other, chat, strict=True))
    assert [r.kind for r in other] == [Kind(api)] * 12
    last = [r for r in other if r.turn == 5]
    assert [r.input_tokens for r in last] == [8000, 8000]  # lands on --context
    rc, _, err = cli(
        "synth", "-o", tmp_path / "s.arrow", "--api", api, *("--sessions", 2, "--turns", 6),
        *("--context", 8000, "--seed", 3, "--rate", 1.0),
    )  # fmt: skip
    assert rc == 0, err
    t = Trace.open(tmp_path / "s.arrow")
    assert t.column("path") == [f"/v1/{api}"] * 12
    body = t.body(t.order[-1])
    if api == "messages":
        assert list(body) == ["model", "messages", "system", "tools", "max_tokens", "stream"]
        roles = [(m["role"], m["content"][0]["type"]) for m in body["messages"]]
        assert roles[:3] == [("user", "text"), ("assistant", "tool_use"), ("user", "tool_result")]
    else:
        assert list(body) == [
            "model",
            "instructions",
            "input",
            "tools",
            "max_output_tokens",
            "stream",
        ]
        types = [i["type"] for i in body["input"]]
        assert types[:3] == ["message", "function_call", "function_call_output"]
    rc, out, _ = cli("inspect", tmp_path / "s.arrow")
    assert rc == 0 and f"kinds        {api} 12" in out


def test_synth_refuses_an_api_it_cannot_write():
    with pytest.raises(OptionError, match="api 'grpc': want one of chat, messages"):
        SynthOptions(api="grpc")
    with pytest.raises(OptionError, match="needs chat payloads"):
        SynthOptions(api="messages", payload="blocks")
    rc, _, err = cli(
        "synth", "-o", "/nonexistent/x.arrow", "--api", "messages", "--payload", "blocks"
    )
    assert rc == 2 and "--api messages needs chat payloads" in err


def test_export_and_import_keep_the_kind(tmp_path):
    bodies = claude_code_session(4)
    write(tmp_path / "t.arrow", bodies, "/v1/messages?beta=true")
    rc, _, err = cli("export", tmp_path / "t.arrow", "-o", tmp_path / "t.jsonl")
    assert rc == 0, err
    rc, _, err = cli("import", "openai-jsonl", tmp_path / "t.jsonl", "-o", tmp_path / "back.arrow")
    assert rc == 0, err
    back = Trace.open(tmp_path / "back.arrow")
    assert back.column("kind") == ["messages"] * 4
    assert back.column("path") == ["/v1/messages?beta=true"] * 4
    assert [back.body(r) for r in back.order] == bodies
    # AIPerf's mooncake rows cannot carry Messages bodies: skipped, and said
    rc, _, err = cli(
        "export", tmp_path / "t.arrow", "-o", tmp_path / "a.jsonl", "--format", "aiperf"
    )
    assert "4 request(s) of no chat/text/blocks shape have no aiperf form" in err
