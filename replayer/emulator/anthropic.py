"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: the Anthropic
Messages API as vLLM 0.32 serves it (``vllm/entrypoints/anthropic``).

vLLM converts a Messages request into a chat completion request and runs the
chat path, so this module does the same: the request becomes chat messages
(top-level ``system`` first, ``tool_use`` blocks as ``tool_calls`` with
``json.dumps`` arguments, ``thinking`` as ``reasoning``, a user's
``tool_result`` as a ``tool`` message before it), tokenized like a chat
prompt - a conversation that grows turn by turn hits the prefix cache - and
admitted to the engine like a chat request, so faults, ``prompt_tokens``
conditions and engine death apply unchanged.

What the wire shows (measured on vLLM 0.32.0, see
tests/conformance/test_agent_apis.py):

* Field validation errors stay vLLM's OpenAI-shaped ``Bad Request`` 400;
  every later error (unknown model, tool choice, limits, dead engine) is
  ``{"type":"error","error":{"type":...,"message":...}}`` with the status.
* A body is the message with ``None`` fields dropped; ``usage`` is
  ``input_tokens`` (prompt minus cache reads and writes), ``output_tokens``
  and, with ``--enable-prompt-tokens-details``, ``cache_creation_input_tokens``
  and ``cache_read_input_tokens``.
* A stream is ``event: <type>`` + ``data:`` frames: ``message_start`` (usage
  of the first chunk: the whole prompt as ``input_tokens``, no cache fields),
  ``content_block_start``, ``content_block_delta`` per engine output,
  ``content_block_stop``, ``message_delta`` (stop reason, final usage) and
  ``message_stop``; no ``[DONE]``.
* Engine death: in-flight streams end with one ``event: error`` whose
  message is pydantic's failure to read chat's error chunk as a chunk
  (``internal_error``), and no ``message_stop``; a new request gets the 500
  body. The route catches the error itself, so unlike chat it does not make
  the server exit at once (the watchdog does).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from aiohttp import web

from replayer.emulator.generate import (
    RUNTIME,
    created_cache,
    intake,
    json_response,
    last_output,
    serve,
    sse,
    write_outputs,
)
from replayer.emulator.parsing import (
    ApiError,
    Generation,
    check_limits,
    check_required,
    check_tools,
    field_error,
    parse_generation,
    parse_json_body,
    validation_error,
)
from replayer.emulator.request import DEAD, Output, Request
from replayer.emulator.runtime import Runtime
from replayer.emulator.wire import (
    CLIENT_DEAD_MESSAGE,
    ENGINE_DEAD_MESSAGE,
    INTERNAL_MESSAGE,
    dumps,
    error_obj,
    filler,
)

ROLES = ("user", "assistant", "system")
BILLING = "x-anthropic-billing-header"
"""Claude Code's per-request attribution block, which vLLM drops from ``system``."""
STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}
NO_REASONING_CONFIG = (
    "thinking_token_budget is set but reasoning_config is not configured. Please set "
    "--reasoning-parser and/or --reasoning-config to use thinking_token_budget."
)
"""A thinking budget needs a reasoning parser, which the emulator never has."""
PYDANTIC_URL = "https://errors.pydantic.dev/2.14/v/missing"
"""The pydantic build of vLLM 0.32's environment, named in the stream error."""


class _Repr:
    """A value pydantic shows unquoted in an error's ``ctx`` (an exception)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


# -- errors -----------------------------------------------------------------------------


def error_body(type_: str, message: str) -> bytes:
    return dumps({"type": "error", "error": {"type": type_, "message": message}})


def _error(exc: ApiError) -> web.Response:
    return json_response(error_body(exc.type, exc.message), exc.status)


def _failed(profile: str, kind: str) -> web.Response:
    """The 500 of a request whose engine died or failed, in this API's shape."""
    message = dead_message(profile) if kind == DEAD else INTERNAL_MESSAGE
    return json_response(error_body("InternalServerError", message), 500)


def dead_message(profile: str) -> str:
    return CLIENT_DEAD_MESSAGE if profile == "0.33" else ENGINE_DEAD_MESSAGE


def _short_repr(obj: object) -> str:
    """pydantic's ``input_value``: a repr over 50 characters keeps 25 + 24."""
    r = repr(obj)
    return r if len(r) <= 50 else f"{r[:25]}...{r[-24:]}"


def stream_error_event(profile: str, kind: str) -> bytes:
    """The ``event: error`` that ends a stream whose chat generator failed:
    vLLM's converter reads chat's error chunk as ``ChatCompletionStreamResponse``
    and reports pydantic's complaint (``model`` and ``choices`` missing)."""
    if kind == DEAD:
        obj = error_obj(profile, dead_message(profile), "InternalServerError", None, 500)
    else:
        obj = error_obj(profile, INTERNAL_MESSAGE, "InternalServerError", None, 500)
    shown = _short_repr(obj)
    one = (
        "  Field required [type=missing, input_value={}, input_type=dict]\n"
        f"    For further information visit {PYDANTIC_URL}"
    ).format(shown)
    message = f"2 validation errors for ChatCompletionStreamResponse\nmodel\n{one}\nchoices\n{one}"
    return frame(
        "error", {"type": "error", "error": {"type": "internal_error", "message": message}}
    )


def frame(event: str, obj: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + dumps(obj) + b"\n\n"


# -- request conversion ---------------------------------------------------------------------


def _validate(body: dict[str, Any], count: bool) -> None:
    """The pydantic checks of ``AnthropicMessagesRequest`` the emulator models,
    in field order."""
    errors: list[dict[str, Any] | str] = []
    check_required(body, "model", str, "string_type", errors)
    if check_required(body, "messages", list, "list_type", errors):
        for i, m in enumerate(body["messages"]):
            loc = f"body.messages.{i}"
            if not isinstance(m, dict):
                errors.append(
                    field_error(
                        "model_type",
                        loc,
                        "Input should be a valid dictionary or instance of AnthropicMessage",
                        m,
                    )
                )
                continue
            role = m.get("role")
            if "role" not in m:
                errors.append(field_error("missing", f"{loc}.role", "Field required", m))
            elif role not in ROLES:
                e = field_error(
                    "literal_error",
                    f"{loc}.role",
                    "Input should be 'user', 'assistant' or 'system'",
                    role,
                )
                e["ctx"] = {"expected": "'user', 'assistant' or 'system'"}
                errors.append(e)
            if "content" not in m:
                errors.append(field_error("missing", f"{loc}.content", "Field required", m))
    if not count and check_required(body, "max_tokens", int, "int_type", errors):
        mt = body["max_tokens"]
        if mt <= 0:
            e = field_error(
                "value_error",
                "body.max_tokens",
                "Value error, max_tokens must be positive",
                mt,
            )
            e["ctx"] = {"error": _Repr("ValueError('max_tokens must be positive')")}
            errors.append(e)
    if errors:
        raise validation_error(errors)


def _text_of(content: object) -> str | None:
    """A system message's text (billing header blocks dropped)."""
    if isinstance(content, str):
        return None if content.startswith(BILLING) else content
    blocks = content if isinstance(content, list) else []
    texts = [b.get("text") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    kept = [t for t in texts if isinstance(t, str) and t and not t.startswith(BILLING)]
    return "".join(kept) or None


def to_chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's ``to_chat_completion_request`` message conversion."""
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        text = system if isinstance(system, str) else _text_of(system)
        if text:
            out.append({"role": "system", "content": text})
    for msg in body["messages"]:
        role = msg["role"]
        content = msg["content"]
        if role == "system":
            text = _text_of(content)
            if text:
                out.append({"role": "system", "content": text})
            continue
        m: dict[str, Any] = {"role": role}
        if isinstance(content, str):
            m["content"] = content
        elif isinstance(content, list):
            _convert_blocks(content, role, m, out)
        if not (role == "user" and "content" not in m):
            out.append(m)
    return out


def _convert_blocks(
    blocks: list[Any], role: str, m: dict[str, Any], out: list[dict[str, Any]]
) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for b in blocks:
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if kind == "text" and b.get("text"):
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            reasoning.append(b["thinking"])
        elif kind == "tool_use":
            calls.append(
                {
                    "id": b.get("id") or "call_0",
                    "type": "function",
                    "function": {
                        "name": b.get("name") or "",
                        "arguments": json.dumps(b.get("input") or {}),
                    },
                }
            )
        elif kind == "tool_result":
            result = b.get("content")
            if role == "user":
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": b.get("tool_use_id") or "",
                        "content": _tool_text(result),
                    }
                )
            else:
                parts.append({"type": "text", "text": f"Tool result: {result if result else ''}"})
    if reasoning:
        m["reasoning"] = "".join(reasoning)
    if calls:
        m["tool_calls"] = calls
    if parts:
        m["content"] = parts[0]["text"] if len(parts) == 1 else parts


def _tool_text(result: object) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, list):
        return "\n".join(
            str(i.get("text", ""))
            for i in result
            if isinstance(i, dict) and i.get("type") == "text"
        )
    return ""


def _chat_tools(body: dict[str, Any]) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` in chat's terms (tools mean ``auto``)."""
    out: dict[str, Any] = {}
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "tool":
            out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        else:
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(
                str(kind), "auto"
            )
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name"),
                    "description": t.get("description"),
                    "parameters": t.get("input_schema"),
                },
            }
            for t in tools
            if isinstance(t, dict)
        ]
        out.setdefault("tool_choice", "auto")
    return out


def parse_messages(body: dict[str, Any], rt: Runtime, count: bool = False) -> Generation:
    _validate(body, count)
    chat: dict[str, Any] = {"model": body["model"], "messages": to_chat_messages(body)}
    if not count:
        chat["max_tokens"] = body["max_tokens"]
        if body.get("stream"):
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    chat.update(_chat_tools(body))
    return parse_generation(chat, True, rt.cfg)


# -- handlers ------------------------------------------------------------------------------


def _check_model(rt: Runtime, model: str) -> None:
    names = rt.cfg.served_model_names
    if model not in names:
        raise ApiError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}.",
            "NotFoundError",
        )


async def count_tokens(request: web.Request) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    try:
        body = parse_json_body(await request.read(), request.headers.get("Content-Type"))
        g = parse_messages(body, rt, count=True)
    except ApiError as exc:
        return json_response(exc.body(rt.cfg.profile), exc.status)
    try:
        _check_model(rt, g.model)
        if rt.engine.dead:
            return json_response(
                error_body("InternalServerError", dead_message(rt.cfg.profile)), 500
            )
    except ApiError as exc:
        return _error(exc)
    n = g.prompt_len
    return json_response(
        dumps({"input_tokens": n, "context_management": {"original_input_tokens": n}})
    )


async def messages(request: web.Request) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    cfg = rt.cfg
    raw, fields = await intake(request, rt)
    try:
        body = parse_json_body(raw, request.headers.get("Content-Type"))
        fields["stream"] = bool(body.get("stream"))
        g = parse_messages(body, rt)
        fields["model"] = g.model
    except ApiError as exc:  # pydantic's errors keep the OpenAI shape
        rt.reqlog.write("request", **fields, n=None, status=exc.status, error=exc.message)
        return json_response(exc.body(cfg.profile), exc.status)
    try:
        _check_model(rt, g.model)
        if rt.engine.dead:
            rt.reqlog.write("request", **fields, n=None, status=500, error="engine dead")
            return json_response(error_body("InternalServerError", dead_message(cfg.profile)), 500)
        check_tools(g, cfg)
        n_out, reason = check_limits(g, cfg, "max_completion_tokens")
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") == "enabled":
            raise ApiError(400, NO_REASONING_CONFIG, "BadRequestError")
    except ApiError as exc:
        rt.reqlog.write("request", **fields, n=None, status=exc.status, error=exc.message)
        return _error(exc)
    xrid = fields["request_id"]
    base = f"chatcmpl-{xrid if xrid else rt.hex(16)}"
    reply = partial(_stream if g.stream else _unary, request, rt, g, base=base)
    return await serve(request, rt, g, n_out, reason, f"{base}-{rt.hex(8)}", fields, reply)


def usage(rt: Runtime, g: Generation, req: Request, final: bool = True) -> dict[str, Any]:
    """Anthropic usage from chat's: ``input_tokens`` excludes cache reads and writes."""
    cfg = rt.cfg
    if not final:
        return {"input_tokens": req.prompt_len, "output_tokens": 0}
    if not cfg.enable_prompt_tokens_details:
        return {"input_tokens": req.prompt_len, "output_tokens": req.num_output}
    created = created_cache(rt, g, req)
    fresh = req.prompt_len - req.num_cached - (created or 0)
    u: dict[str, Any] = {"input_tokens": max(0, fresh), "output_tokens": req.num_output}
    if created is not None:
        u["cache_creation_input_tokens"] = created
    u["cache_read_input_tokens"] = req.num_cached
    return u


async def _unary(
    request: web.Request, rt: Runtime, g: Generation, req: Request, base: str
) -> web.StreamResponse:
    finish = await last_output(request, req, partial(_failed, rt.cfg.profile))
    if isinstance(finish, web.Response):
        return finish
    text = filler(req.text_seed, 0, req.num_output)
    body = {
        "id": base,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": g.model,
        "stop_reason": STOP_REASONS.get(finish, "end_turn"),
        "usage": usage(rt, g, req),
    }
    return json_response(dumps(body))


async def _stream(
    request: web.Request, rt: Runtime, g: Generation, req: Request, base: str
) -> web.StreamResponse:
    resp, _ = await sse(request, partial(_pump, request, rt, g, req, base))
    return resp


async def _pump(
    request: web.Request,
    rt: Runtime,
    g: Generation,
    req: Request,
    base: str,
    resp: web.StreamResponse,
) -> None:
    started = False

    def render(out: Output) -> list[bytes]:
        nonlocal started
        if out.error is not None:
            return [stream_error_event(rt.cfg.profile, out.error)]
        parts: list[bytes] = []
        if out.tokens:
            if not started:
                start: dict[str, Any] = {
                    "id": base,
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": g.model,
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": usage(rt, g, req, final=False),
                }
                parts.append(frame("message_start", {"type": "message_start", "message": start}))
                block = {"type": "text", "text": ""}
                parts.append(
                    frame(
                        "content_block_start",
                        {"type": "content_block_start", "content_block": block, "index": 0},
                    )
                )
                started = True
            delta = {"type": "text_delta", "text": filler(req.text_seed, out.start, out.tokens)}
            parts.append(
                frame(
                    "content_block_delta",
                    {"type": "content_block_delta", "delta": delta, "index": 0},
                )
            )
        if out.finish is not None and not out.cut:
            stop = {"stop_reason": STOP_REASONS.get(out.finish, "end_turn"), "stop_sequence": None}
            parts.append(frame("content_block_stop", {"type": "content_block_stop", "index": 0}))
            parts.append(
                frame(
                    "message_delta",
                    {"type": "message_delta", "delta": stop, "usage": usage(rt, g, req)},
                )
            )
            parts.append(frame("message_stop", {"type": "message_stop"}))
        return parts

    await write_outputs(request, req, resp, render)
