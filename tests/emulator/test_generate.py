"""The official openai SDK as a real client: chat and completions, streaming
and not, usage with cached tokens, against a real emulator process."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from replayer.trace.tokens import approx_message_tokens, approx_text_tokens
from tests.helpers.emulator import BOUND, MODEL, client, sse_events

pytestmark = pytest.mark.e2e

SYSTEM = {"role": "system", "content": "You are a coding agent with a long system prompt. " * 40}


def sdk(emu) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{emu.url}/v1", api_key="unused", max_retries=0)


def prompt_tokens(messages) -> int:
    return sum(approx_message_tokens(m) for m in messages)


def test_chat_non_streaming_and_streaming(emulator_factory):
    emu = emulator_factory(["--speed", "instant"])
    msgs = [SYSTEM, {"role": "user", "content": "list the files"}]
    c = sdk(emu)
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=7)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL
    choice = r.choices[0]
    assert (choice.finish_reason, choice.message.role) == ("length", "assistant")
    assert len(choice.message.content.split()) == 7  # one filler word per token
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (prompt_tokens(msgs), 7)
    assert r.usage.total_tokens == prompt_tokens(msgs) + 7
    assert r.usage.prompt_tokens_details is None  # no --enable-prompt-tokens-details

    stream = c.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Request-Id": "s-1"},
    )
    chunks = list(stream)
    assert {ch.id for ch in chunks} == {"chatcmpl-s-1"}
    assert (
        chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert len(text.split()) == 5
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.prompt_tokens == prompt_tokens(msgs)
    assert chunks[-1].system_fingerprint.startswith("vllm-0.33.0-tp8-")


def test_completions_text_and_token_ids(emulator_factory):
    emu = emulator_factory(["--speed", "instant"])
    c = sdk(emu)
    r = c.completions.create(model=MODEL, prompt="def fibonacci(n):", max_tokens=4)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.usage.prompt_tokens == approx_text_tokens("def fibonacci(n):") == 5
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (4, "length")
    ids = list(range(1000, 1333))
    r = c.completions.create(model=MODEL, prompt=ids, max_tokens=3)
    assert r.usage.prompt_tokens == 333
    stream = c.completions.create(
        model=MODEL, prompt=ids, max_tokens=6, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert len("".join(ch.choices[0].text for ch in chunks if ch.choices).split()) == 6
    assert chunks[-1].usage.prompt_tokens == 333 and chunks[-1].usage.completion_tokens == 6


def test_cached_tokens_across_turns(emulator_factory):
    emu = emulator_factory(["--speed", "instant", "--enable-prompt-tokens-details"])
    c = sdk(emu)
    turn1 = [SYSTEM, {"role": "user", "content": "first question"}]
    p1 = prompt_tokens(turn1)
    r1 = c.chat.completions.create(model=MODEL, messages=turn1, max_tokens=3)
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    turn2 = turn1 + [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "second question"},
    ]
    p2 = prompt_tokens(turn2)
    r2 = c.chat.completions.create(model=MODEL, messages=turn2, max_tokens=3)
    # Turn 2 re-sends turn 1's prompt: every full block of it is cached.
    assert r2.usage.prompt_tokens == p2
    assert r2.usage.prompt_tokens_details.cached_tokens == p1 // 16 * 16
    stream = c.chat.completions.create(
        model=MODEL,
        messages=turn2,
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = list(stream)[-1].usage
    assert usage.prompt_tokens_details.cached_tokens == (p2 - 1) // 16 * 16
    lines = emu.events("request")
    assert [x["cached_tokens"] for x in lines] == [0, p1 // 16 * 16, (p2 - 1) // 16 * 16]


def test_continuous_usage_stats(emulator_factory):
    emu = emulator_factory(["--speed", "instant"])
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with client(emu) as h:
        events = sse_events(h.post("/v1/chat/completions", json=body).content)
    assert events[-1] == b"[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    used = [p["usage"]["completion_tokens"] for p in parsed]
    assert used[0] == 0 and used[-1] == 3 and used == sorted(used)
    assert all(p["usage"]["prompt_tokens"] == 5 for p in parsed)  # 4 framing + "hi"
    assert parsed[-1]["choices"] == []


def test_default_length_eos_and_ignore_eos(emulator_factory):
    emu = emulator_factory(["--speed", "instant", "--default-max-tokens", "5", "--eos-after", "9"])
    c = sdk(emu)
    msgs = [{"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model=MODEL, messages=msgs)
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (9, "stop")
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4)
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (4, "length")
    r = c.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=30, extra_body={"ignore_eos": True}
    )
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (30, "length")


async def test_async_sdk_concurrent_streams(emulator_factory):
    emu = emulator_factory(["--speed", "instant", "--max-num-seqs", "4"])
    c = openai.AsyncOpenAI(base_url=f"{emu.url}/v1", api_key="x", max_retries=0)

    async def one(i: int) -> tuple[int, int]:
        stream = await c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"task {i}"}],
            max_tokens=20 + i,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for ch in stream:
            if ch.choices:
                text += ch.choices[0].delta.content or ""
            else:
                usage = ch.usage
        return len(text.split()), usage.completion_tokens

    async with asyncio.timeout(BOUND):
        results = await asyncio.gather(*(one(i) for i in range(12)))
    await c.close()
    assert results == [(20 + i, 20 + i) for i in range(12)]
    lines = emu.events("request")
    assert len(lines) == 12 and max(x["running"] for x in lines) <= 4
