"""The Anthropic Messages and OpenAI Responses endpoints through the official
SDKs (``anthropic``, ``openai``): history with tools and thinking blocks,
function calls, streaming event order, the prefix cache across turns, the
response store, fault rules, and the repo's own stream decoders
(:mod:`replayer.wire`) reading what the emulator sends. The wire bytes are
compared with a real vLLM in tests/conformance/test_agent_apis.py."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from replayer.testing.emulator import EmulatorProcess, poll_until
from tests.helpers.agents import TOOLS_A, TOOLS_R, decode, history, items

pytestmark = pytest.mark.e2e

MODEL = "agent-model"
BLOCK = 16
ARGS = [
    "--vllm-version", "0.32.0",
    "--speed", "instant",
    "--served-model-name", MODEL,
    "--enable-prompt-tokens-details",
    "--block-size", str(BLOCK),
    "--stats-interval", "0",
]  # fmt: skip
TURN = ("What is the weather in Paris? " * 20, "I need the tool.", "Thanks.")
"""The agent turn's words (a question long enough to fill prefix-cache blocks)."""
HISTORY = history(*TURN)
ITEMS = items(*TURN)
MESSAGE_EVENTS = ["message_start", "content_block_start"]


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    """Instant, tool calling on, the response store on."""
    proc = EmulatorProcess(
        ARGS,
        workdir=tmp_path_factory.mktemp("agent-emulator"),
        env={"VLLM_ENABLE_RESPONSES_API_STORE": "1"},
    )
    with proc:
        yield proc


@pytest.fixture
def sdk() -> Iterator[Callable[[EmulatorProcess], Any]]:
    """``sdk(emu)``: an Anthropic and an OpenAI client for ``emu``, closed at
    teardown (an unclosed socket is an error under ``filterwarnings``)."""
    made: list[Any] = []

    def make(emu: EmulatorProcess) -> Any:
        pair = Clients(
            anthropic.Anthropic(base_url=emu.url, api_key="x", max_retries=0, timeout=20),
            openai.OpenAI(base_url=f"{emu.url}/v1", api_key="x", max_retries=0, timeout=20),
        )
        made.append(pair)
        return pair

    yield make
    for pair in made:
        pair.claude.close()
        pair.oai.close()


class Clients:
    def __init__(self, claude: Any, oai: openai.OpenAI) -> None:
        self.claude = claude
        self.oai = oai


def frames(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """``(event, data)`` pairs; each frame's ``event`` must equal its data's type."""
    out = []
    for chunk in raw.decode().removesuffix("\n\n").split("\n\n"):
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), chunk
        obj = json.loads(data[6:])
        assert obj["type"] == name[7:]
        out.append((name[7:], obj))
    return out


# -- Anthropic Messages -----------------------------------------------------------------------


def test_messages_non_streaming_with_tools_and_thinking_in_history(
    emu: EmulatorProcess, sdk: Any
) -> None:
    msg = sdk(emu).claude.messages.create(
        model=MODEL,
        max_tokens=5,
        system=[{"type": "text", "text": "You are terse."}],
        tools=TOOLS_A,
        messages=HISTORY,
    )
    assert (msg.type, msg.role, msg.model, msg.stop_reason) == (
        "message",
        "assistant",
        MODEL,
        "max_tokens",
    )
    assert msg.id.startswith("chatcmpl-")
    (block,) = msg.content
    assert block.type == "text" and len(block.text.split()) == 5
    u = msg.usage
    assert u.output_tokens == 5
    assert u.cache_read_input_tokens is not None and u.cache_creation_input_tokens is not None
    total = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    count = sdk(emu).claude.messages.count_tokens(
        model=MODEL, system="You are terse.", tools=TOOLS_A, messages=HISTORY
    )
    assert count.input_tokens == total  # a string system is the same prompt as one block


def test_messages_streaming_event_order_and_decoder(emu: EmulatorProcess, sdk: Any) -> None:
    with sdk(emu).claude.messages.stream(
        model=MODEL, max_tokens=4, system="You are terse.", tools=TOOLS_A, messages=HISTORY
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    # The SDK adds its own "text" events after each delta; the wire order is below.
    wire = [k for k in kinds if k != "text"]
    assert wire[:2] == MESSAGE_EVENTS and wire[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert set(wire[2:-3]) == {"content_block_delta"}
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 4
    assert final.content[0].type == "text" and len(final.content[0].text.split()) == 4
    body = {"model": MODEL, "max_tokens": 3, "stream": True, "messages": HISTORY[:1]}
    r = httpx.post(f"{emu.url}/v1/messages?beta=true", json=body, timeout=20)
    assert (r.status_code, r.headers["content-type"]) == (200, "text/event-stream; charset=utf-8")
    got = frames(r.content)
    start = got[0][1]["message"]
    assert list(start) == [
        "id", "type", "role", "content", "model", "stop_reason", "stop_sequence", "usage",
    ]  # fmt: skip
    assert list(got[-2][1]["usage"]) == [
        "input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
    ]  # fmt: skip
    reply = decode("/v1/messages", r.content)
    assert reply.done and reply.first_token == 2.0 and reply.chunks == 3
    assert reply.choice(0).finish == "max_tokens"
    assert reply.completion_tokens == 3
    assert reply.prompt_tokens == start["usage"]["input_tokens"]
    assert "".join(reply.choice(0).text) == "".join(
        o["delta"]["text"] for k, o in got if k == "content_block_delta"
    )


def test_messages_session_grows_into_the_prefix_cache(emu: EmulatorProcess, sdk: Any) -> None:
    c = sdk(emu).claude
    history: list[Any] = [{"role": "user", "content": "Plan the trip to Lyon. " * 30}]
    reads = []
    for turn in range(3):
        msg = c.messages.create(model=MODEL, max_tokens=3, system="Be brief.", messages=history)
        reads.append(msg.usage.cache_read_input_tokens)
        history += [
            {"role": "assistant", "content": [{"type": "text", "text": msg.content[0].text}]},
            {"role": "user", "content": f"And then step {turn}?"},
        ]
    assert reads[0] == 0 and 0 < reads[1] < reads[2]
    assert all(r % BLOCK == 0 for r in reads)


def test_messages_errors(emu: EmulatorProcess, sdk: Any) -> None:
    c = sdk(emu).claude
    with pytest.raises(anthropic.NotFoundError) as nf:
        c.messages.create(model="nope", max_tokens=3, messages=HISTORY[:1])
    assert nf.value.body == {
        "type": "error",
        "error": {
            "type": "NotFoundError",
            "message": f"The model `nope` does not exist. Valid aliases: {MODEL}.",
        },
    }
    r = httpx.post(f"{emu.url}/v1/messages", json={"model": MODEL, "messages": []}, timeout=20)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body.max_tokens"


# -- OpenAI Responses --------------------------------------------------------------------------


def test_responses_non_streaming_with_function_calls(emu: EmulatorProcess, sdk: Any) -> None:
    resp = sdk(emu).oai.responses.create(
        model=MODEL, instructions="Be terse.", input=ITEMS, tools=TOOLS_R, max_output_tokens=4
    )
    assert resp.id.startswith("resp_") and resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert len(resp.output_text.split()) == 4
    assert resp.usage is not None and resp.usage.output_tokens == 4
    assert resp.instructions == "Be terse." and resp.tool_choice == "auto"


def test_responses_streaming_event_order_and_decoder(emu: EmulatorProcess, sdk: Any) -> None:
    events = list(
        sdk(emu).oai.responses.create(model=MODEL, input=ITEMS, max_output_tokens=3, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1]
    assert done.type == "response.completed"
    assert done.response.usage is not None and done.response.usage.output_tokens == 3
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 3, "stream": True}
    raw = httpx.post(f"{emu.url}/v1/responses", json=body, timeout=20).content
    reply = decode("/v1/responses", raw)
    assert reply.done and reply.first_token == 4.0
    assert reply.choice(0).finish == "max_output_tokens"
    assert (reply.completion_tokens, reply.cached_tokens) == (3, 0)


def test_responses_forced_function_call_streams_its_arguments(
    emu: EmulatorProcess, sdk: Any
) -> None:
    stream = sdk(emu).oai.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        tools=TOOLS_R,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=5,
        stream=True,
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[2] == "response.output_item.added"
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) == 5
    args = json.loads("".join(deltas))
    assert list(args) == ["city"] and len(args["city"].split()) == 5
    final = events[-1].response  # type: ignore[union-attr]
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("chatcmpl-tool-") and json.loads(call.arguments) == args


def test_responses_store_chains_turns_into_the_prefix_cache(emu: EmulatorProcess, sdk: Any) -> None:
    c = sdk(emu).oai
    first = c.responses.create(
        model=MODEL, input="Plan the trip to Lyon. " * 30, max_output_tokens=3
    )
    second = c.responses.create(
        model=MODEL, input="And then?", previous_response_id=first.id, max_output_tokens=3
    )
    assert first.usage is not None and second.usage is not None
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens
    assert (
        second.usage.input_tokens_details.cached_tokens
        >= first.usage.input_tokens // BLOCK * BLOCK - BLOCK
    )
    assert c.responses.retrieve(second.id).model_dump() == second.model_dump()
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve("resp_nope")
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model=MODEL, input="x", previous_response_id="resp_nope")


# -- faults ---------------------------------------------------------------------------------


def test_fault_rules_apply_to_both_endpoints(emulator_factory: Any, sdk: Any) -> None:
    """The engine sees these requests as it sees chat ones: ``request=N`` and
    ``prompt_tokens`` conditions pick them, and their effects show in each
    API's own framing."""
    emu = emulator_factory(
        [
            *ARGS,
            "--fault",
            "error when prompt_tokens>=300 times=0",
            "--fault",
            "dead when request=4",
        ]
    )
    long = "word " * 1200
    r = httpx.post(
        f"{emu.url}/v1/messages",
        json={
            "model": MODEL,
            "max_tokens": 3,
            "stream": True,
            "messages": [{"role": "user", "content": long}],
        },
        timeout=20,
    )
    ((kind, obj),) = frames(r.content)
    assert kind == "error" and obj["error"]["type"] == "internal_error"
    assert "'Internal server error'" not in obj["error"]["message"]  # pydantic shortens the repr
    r = httpx.post(f"{emu.url}/v1/responses", json={"model": MODEL, "input": long}, timeout=20)
    assert r.status_code == 500 and r.json()["error"]["message"] == "Internal server error"
    ok = sdk(emu).claude.messages.create(model=MODEL, max_tokens=2, messages=HISTORY[:1])
    assert ok.stop_reason == "max_tokens"
    with pytest.raises(anthropic.InternalServerError) as dead:
        sdk(emu).claude.messages.create(model=MODEL, max_tokens=2, messages=HISTORY[:1])
    assert dead.value.body["error"]["type"] == "InternalServerError"
    assert [e["n"] for e in emu.events("request") if e.get("n")] == [1, 2, 3, 4]
    assert emu.health() == 503


def test_engine_killed_mid_stream(emulator_factory: Any, sdk: Any) -> None:
    """SIGUSR1 (the emulator's ``kill -9`` of EngineCore) ends an open Messages
    stream with the error event; the same on Responses cuts the body."""
    emu = emulator_factory([*ARGS, "--speed", "1", "--decode-time", "0.01"])
    body = {"model": MODEL, "max_tokens": 5000, "stream": True, "messages": HISTORY[:1]}
    with httpx.stream("POST", f"{emu.url}/v1/messages", json=body, timeout=20) as r:
        seen = bytearray()
        chunks = r.iter_raw()
        for chunk in chunks:
            seen += chunk
            if seen.count(b"content_block_delta") >= 6:
                break
        os.kill(emu.pid, signal.SIGUSR1)
        for chunk in chunks:
            seen += chunk
    got = frames(bytes(seen))
    assert got[-1][0] == "error" and got[-2][0] == "content_block_delta"
    assert "2 validation errors for ChatCompletionStreamResponse" in got[-1][1]["error"]["message"]
    reply = decode("/v1/messages", bytes(seen))
    assert not reply.done and reply.error_type == "internal_error"
    poll_until(lambda: emu.health() == 503, 10, what="/health 503")
