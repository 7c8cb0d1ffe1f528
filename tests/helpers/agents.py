"""Requests and a stream reader shared by the Anthropic Messages and OpenAI
Responses tests: tests/emulator/test_agent_apis.py (through the SDKs) and
tests/conformance/test_agent_apis.py (the wire, emulator and real vLLM); and
a trace of several API's traces (:func:`mixed_trace`). The agents the SDKs
drive are in :mod:`tests.helpers.agent_sessions`.

One agent turn in both APIs' terms - a question, a thought, a tool call and
its result, thanks - so that both suites send the same kind of history with
their own words (the emulator suite's question is long enough to fill prefix
cache blocks of 16, the conformance one keeps vLLM's measured token counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replayer.wire.apis import accumulator, api_for_path
from replayer.wire.reply import Reply
from replayer.wire.sse import SSEDecoder

TOOLS_A = [
    {
        "name": "get_weather",
        "description": "Weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
"""The one tool, as ``/v1/messages`` takes it."""
TOOLS_R: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": TOOLS_A[0]["input_schema"],
    }
]
"""The same tool, as ``/v1/responses`` takes it."""


def history(question: str, thought: str, thanks: str) -> list[Any]:
    """The turn as ``/v1/messages`` ``messages``: the assistant thinks, says a
    word and calls the tool; the user's next message carries its result."""
    return [
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": thought, "signature": "sig"},
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": thanks},
            ],
        },
    ]


def items(question: str, thought: str, thanks: str) -> list[Any]:
    """The turn as ``/v1/responses`` ``input`` items."""
    return [
        {"type": "message", "role": "user", "content": question},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": thought}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": [{"type": "input_text", "text": thanks}]},
    ]  # fmt: skip


def decode(path: str, raw: bytes) -> Reply:
    """What the repo's decoders make of a stream (event i read at time i)."""
    api = api_for_path(path)
    assert api is not None
    reply = Reply(keep_text=True)
    acc = accumulator(api, reply)
    for i, ev in enumerate(SSEDecoder().feed(raw)):
        acc.event(ev, float(i))
    return reply


def mixed_trace(out: Path, parts: Sequence[tuple[str, Path]], sep: str = "/") -> Path:
    """One trace of several (API name, trace) parts, in part order, each
    request and session id prefixed with its part's name (``chat/s1``), so a
    test can tell which API a failed or in-flight request came from."""
    import dataclasses

    from replayer.trace import Trace, TraceMeta, TraceWriter

    with TraceWriter(out, TraceMeta(source="test")) as w:
        for name, path in parts:
            t = Trace.open(path)
            for r in t.order:
                rec = t.record(r)
                w.add(
                    dataclasses.replace(
                        rec,
                        request_id=f"{name}{sep}{rec.request_id}",
                        session_id=f"{name}{sep}{rec.session_id}",
                    )
                )
    return out
