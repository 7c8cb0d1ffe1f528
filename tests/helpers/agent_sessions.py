"""Agents driven by the official SDKs, turn by turn: a Claude Code-like one
over ``/v1/messages`` and a Codex-like one over ``/v1/responses`` (expanded
or chained by ``previous_response_id``), and a round robin that interleaves
their sessions in one order every run. The recorder tests run them against
the emulator, the real-vLLM tier against a real vLLM."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai

MODEL = "agent-model"
SYSTEM = [{"type": "text", "text": "You are a careful coding agent. " * 8}]
TOOLS_A: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
TOOLS_R: list[Any] = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": TOOLS_A[0]["input_schema"],
    }
]
KEY = "sk-ant-secret-0123456789"


async def claude_session(
    base_url: str, name: str, turns: int, *, model: str = MODEL
) -> AsyncIterator[Any]:
    """A Claude Code-like agent: thinking and tool use in its history, the
    reply's blocks sent back every turn, streamed on odd turns."""
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=KEY, max_retries=0)
    history: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": f"{name}: fix the build. " * 10}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Read it first.", "signature": "c2ln"},
                {
                    "type": "tool_use",
                    "id": f"toolu_{name}",
                    "name": "read_file",
                    "input": {"path": "Makefile"},
                },
            ],
        },  # fmt: skip
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": f"toolu_{name}", "content": "all:"}],
        },
    ]
    try:
        for turn in range(turns):
            kw: dict[str, Any] = dict(
                model=model, system=SYSTEM, tools=TOOLS_A, messages=history,
                max_tokens=8 + turn, extra_body={"temperature": 0},  # greedy (no SDK arg)
            )  # fmt: skip
            if turn % 2:
                async with client.messages.stream(**kw) as s:
                    msg = await s.get_final_message()
            else:
                msg = await client.messages.create(**kw)
            blocks = [b.model_dump(exclude_none=True) for b in msg.content]
            yield (msg.stop_reason, blocks, msg.usage.model_dump())
            history = [*history, {"role": "assistant", "content": blocks}]
            history.append({"role": "user", "content": [{"type": "text", "text": f"next {turn}"}]})
    finally:
        await client.close()


async def codex_session(
    base_url: str, name: str, turns: int, *, chain: bool, model: str = MODEL
) -> AsyncIterator[Any]:
    """A Codex-like agent: the full input every turn (``chain=False``), or
    only the new input, chained by ``previous_response_id``."""
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0)
    items: list[Any] = [
        {"type": "message", "role": "user", "content": f"{name}: run the tests. " * 10},
        {"type": "function_call", "call_id": f"call_{name}", "name": "read_file",
         "arguments": '{"path": "tests/test_x.py"}'},
        {"type": "function_call_output", "call_id": f"call_{name}", "output": "def test(): 1"},
    ]  # fmt: skip
    prev: str | None = None
    try:
        for turn in range(turns):
            kw: dict[str, Any] = dict(
                model=model, instructions="You are Codex.", tools=TOOLS_R,
                max_output_tokens=8 + turn, input=items, temperature=0,
            )  # fmt: skip
            if chain and prev is not None:
                kw["previous_response_id"] = prev
            if turn % 2:
                async with client.responses.stream(**kw) as s:
                    resp = await s.get_final_response()
            else:
                resp = await client.responses.create(**kw)
            out = [o.model_dump(exclude_none=True) for o in resp.output]
            yield (resp.status, resp.output_text, resp.usage.model_dump())
            prev = resp.id
            new = [{"type": "message", "role": "user", "content": f"next {turn}"}]
            # chained: only what is new; expanded: the whole context again
            items = new if chain else [*items, *out, *new]
    finally:
        await client.close()


async def round_robin(*agents: AsyncIterator[Any]) -> list[list[Any]]:
    """Each agent's next turn in turn: sessions interleave, in one order every
    run (the emulator's outputs and cache hits depend on arrival order)."""
    seen: list[list[Any]] = [[] for _ in agents]
    live = dict(enumerate(agents))
    for _ in range(100):  # bounded: agents here take a few turns
        if not live:
            break
        for i, agent in list(live.items()):
            try:
                seen[i].append(await anext(agent))
            except StopAsyncIteration:
                del live[i]
    return seen
