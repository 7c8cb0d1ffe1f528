"""``POST /v1/responses`` (and ``GET``/``cancel`` by id): the OpenAI Responses
API as vLLM 0.32 serves it (``vllm/entrypoints/openai/responses``).

``input`` (a string, or items: messages, ``function_call``,
``function_call_output``, ``reasoning``) and ``instructions`` become chat
messages tokenized like a chat prompt (``instructions`` first), so a session
that grows turn by turn hits the prefix cache; the request then goes through
the same engine as chat (faults, ``prompt_tokens`` conditions, death).

What the wire shows (measured on vLLM 0.32.0, see
tests/conformance/test_agent_apis.py):

* Bodies are the whole ``ResponsesResponse`` (every field, nulls kept);
  ``status`` is ``incomplete`` with ``incomplete_details.reason:
  max_output_tokens`` when the output limit ended it; ``usage`` has
  ``input_tokens_details.cached_tokens`` and ``cache_write_tokens``.
* A stream is ``event: <type>`` + ``data:`` frames with a
  ``sequence_number`` from 0: ``response.created`` and
  ``response.in_progress`` at once, then per output item ``added``, its
  deltas, ``done`` events, then ``response.completed`` (also when
  incomplete); no ``[DONE]``.
* A forced tool choice (``required`` or a named function) makes the
  emulated model call the tool: a ``function_call`` item whose arguments
  stream as ``response.function_call_arguments.delta``.
* Without ``VLLM_ENABLE_RESPONSES_API_STORE`` nothing is stored:
  ``previous_response_id`` and ``GET /v1/responses/{id}`` answer 404
  ``invalid_request_error``; ``background`` (with the default ``store``)
  is a 400. With it, answers are kept in memory (background mode is not
  emulated: 400).
* Engine death: an in-flight stream is cut after its last whole event (vLLM's
  generator raises; uvicorn drops the connection without the last chunk);
  a new request gets the JSON 500, which also ends the server at once.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import web

from replayer.emulator.generate import (
    RUNTIME,
    cut_connection,
    failed,
    intake,
    json_response,
    last_output,
    serve,
    sse,
)
from replayer.emulator.parsing import (
    ApiError,
    Generation,
    bad_request,
    check_limits,
    check_required,
    field_error,
    parse_generation,
    parse_json_body,
    validation_error,
)
from replayer.emulator.request import Request
from replayer.emulator.runtime import Runtime
from replayer.emulator.wire import (
    dead_body,
    dumps,
    filler,
)

BACKGROUND_NEEDS_STORE = (
    "This vLLM engine does not support `store=True` and therefore does not support the "
    "background mode. To enable these features, set the environment variable "
    "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."
)
FUNCTION_TOOL_FIELDS = (
    "name",
    "parameters",
    "strict",
    "type",
    "allowed_callers",
    "async",
    "defer_loading",
    "description",
    "output_schema",
)


@dataclass
class ResponseStore:
    """vLLM's in-memory response store (``VLLM_ENABLE_RESPONSES_API_STORE=1``):
    each answer, and the conversation that led to it with the answer appended."""

    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    conversations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


STORE: web.AppKey[ResponseStore] = web.AppKey("responses_store", ResponseStore)


def _invalid(status: int, message: str, param: str) -> ApiError:
    return ApiError(status, message, "invalid_request_error", param)


def not_found(response_id: str) -> ApiError:
    return _invalid(404, f"Response with id '{response_id}' not found.", "response_id")


# -- the request ------------------------------------------------------------------------------


@dataclass(slots=True)
class Parsed:
    """What the handler needs beyond the :class:`Generation`."""

    body: dict[str, Any]
    tool_choice: Any
    forced: str | None
    """The tool the emulated model calls (forced tool choice), or None."""


def _validate(body: dict[str, Any]) -> Parsed:
    """``ResponsesRequest``'s before-validators (the tool-usage one may add
    ``tool_choice``), then pydantic's field checks."""
    data = dict(body)
    if data.get("background") and data.get("store") is False:
        raise bad_request("background can only be used when `store` is true", "background")
    tools = data.get("tools") or []
    choice = data.get("tool_choice", "auto")
    named = isinstance(choice, dict) and choice.get("type") in ("function", "custom")
    forced: str | None = None
    if not tools:
        if choice in ("auto", "none"):
            choice = data["tool_choice"] = "none"
        elif choice == "required":
            raise bad_request(
                "Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice"
            )
        elif named:
            raise bad_request(
                "Tool choice 'function' not found in 'tools' parameter.", "tool_choice"
            )
    elif named:
        names = [t.get("name") for t in tools if isinstance(t, dict)]
        if not choice.get("name") or choice.get("name") not in names:
            raise bad_request(
                "Tool choice 'function' not found in 'tools' parameter.", "tool_choice"
            )
        forced = str(choice["name"])
    elif choice == "required":
        first = next(
            (t for t in tools if isinstance(t, dict) and t.get("type") == "function"), None
        )
        forced = str(first.get("name")) if first is not None else None
    errors: list[dict[str, Any] | str] = []
    check_required(data, "input", (str, list), "string_type", errors)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        errors.append(
            field_error("string_type", "body.model", "Input should be a valid string", model)
        )
    mo = data.get("max_output_tokens")
    if mo is not None and (not isinstance(mo, int) or isinstance(mo, bool)):
        errors.append(
            field_error("int_type", "body.max_output_tokens", "Input should be a valid integer", mo)
        )
    if errors:
        raise validation_error(errors)
    return Parsed(body, choice, forced)


def _content_text(content: object) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return [
        {"type": "text", "text": p["text"]}
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("text"), str)
    ]


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``input`` as chat messages (``instructions`` first)."""
    out: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        out.append({"role": "system", "content": body["instructions"]})
    inp = body["input"]
    if isinstance(inp, str):
        out.append({"role": "user", "content": inp})
        return out
    for item in inp:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            out.append(
                {
                    "role": str(item.get("role", "user")),
                    "content": _content_text(item.get("content")),
                }
            )
        elif kind == "function_call":
            call = {
                "function": {
                    "name": str(item.get("name", "")),
                    "arguments": str(item.get("arguments", "")),
                }
            }
            out.append({"role": "assistant", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "content": str(item.get("output", ""))})
        elif kind == "reasoning":
            texts = [p.get("text", "") for p in item.get("content") or [] if isinstance(p, dict)]
            out.append({"role": "assistant", "reasoning": "".join(map(str, texts))})
    return out


def _output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An answer's output items as the messages a follow-up turn would send back."""
    return input_messages({"input": [i for i in items if isinstance(i, dict)]})


# -- bodies --------------------------------------------------------------------------------


@dataclass(slots=True)
class Shape:
    """Per-request constants of one answer."""

    id: str
    created: int
    model: str
    parsed: Parsed
    max_output: int
    msg_id: str
    call_id: str = ""
    fc_id: str = ""

    def tools(self) -> list[Any]:
        out: list[Any] = []
        for t in self.parsed.body.get("tools") or []:
            if isinstance(t, dict) and t.get("type") == "function":
                out.append({k: t.get(k) for k in FUNCTION_TOOL_FIELDS})
            else:
                out.append(t)
        return out

    def tool_choice(self) -> Any:
        c = self.parsed.tool_choice
        if isinstance(c, dict) and c.get("type") == "function":
            return {"name": c.get("name"), "type": "function"}
        return c

    def text(self) -> Any:
        forced = self.parsed.forced
        if forced is None:
            return self.parsed.body.get("text")
        tools = [t for t in self.tools() if isinstance(t, dict) and t.get("type") == "function"]
        if self.parsed.tool_choice == "required":
            schema: Any = {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "anyOf": [
                        {
                            "properties": {
                                "name": {"type": "string", "enum": [t["name"]]},
                                "parameters": t["parameters"],
                            },
                            "required": ["name", "parameters"],
                        }
                        for t in tools
                    ],
                },
            }
        else:
            schema = next((t["parameters"] for t in tools if t["name"] == forced), None)
        fmt = {
            "name": "tool_calling_response",
            "schema": schema,
            "type": "json_schema",
            "description": None,
            "strict": True,
        }
        return {"format": fmt, "verbosity": None}

    def message(self, text: str, done: bool) -> dict[str, Any]:
        content = [_part(text, None)] if done else []
        status = "completed" if done else "in_progress"
        return {
            "id": self.msg_id,
            "content": content,
            "role": "assistant",
            "status": status,
            "type": "message",
            "phase": None,
        }

    def call(self, arguments: str, done: bool) -> dict[str, Any]:
        return {
            "arguments": arguments,
            "call_id": self.call_id,
            "name": self.parsed.forced,
            "type": "function_call",
            "id": self.fc_id,
            "async": None,
            "caller": None,
            "namespace": None,
            "status": "completed" if done else "in_progress",
        }

    def response(
        self, status: str, output: list[Any], usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        b = self.parsed.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "created_at": self.created,
            "incomplete_details": incomplete,
            "instructions": b.get("instructions"),
            "metadata": b.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": b.get("parallel_tool_calls", True) is not False,
            "temperature": float(b["temperature"]) if b.get("temperature") is not None else 1.0,
            "tool_choice": self.tool_choice(),
            "tools": self.tools(),
            "top_p": float(b["top_p"]) if b.get("top_p") is not None else 1.0,
            "background": bool(b.get("background")),
            "max_output_tokens": self.max_output,
            "max_tool_calls": b.get("max_tool_calls"),
            "previous_response_id": b.get("previous_response_id"),
            "prompt": b.get("prompt"),
            "reasoning": b.get("reasoning"),
            "service_tier": b.get("service_tier") or "auto",
            "status": status,
            "text": self.text(),
            "top_logprobs": None,
            "truncation": b.get("truncation") or "disabled",
            "usage": usage,
            "user": b.get("user"),
            "presence_penalty": float(b.get("presence_penalty") or 0.0),
            "frequency_penalty": float(b.get("frequency_penalty") or 0.0),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }


def _part(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def usage(rt: Runtime, req: Request) -> dict[str, Any]:
    """Responses usage: the engine's cached tokens and the full prompt blocks
    this request wrote to the prefix cache (reported whatever the flags)."""
    cfg = rt.cfg
    written = 0
    if cfg.enable_prefix_caching:
        written = max(0, req.prompt_len // cfg.block_size * cfg.block_size - req.num_cached)
    return {
        "input_tokens": req.prompt_len,
        "input_tokens_details": {
            "cached_tokens": req.num_cached,
            "cache_write_tokens": written,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": req.num_output,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": req.prompt_len + req.num_output,
    }


def _arguments_key(shape: Shape) -> str:
    """The property the emulated tool call fills: the first required string one."""
    for t in shape.tools():
        if isinstance(t, dict) and t.get("name") == shape.parsed.forced:
            params = t.get("parameters") or {}
            props = params.get("properties") or {}
            for name in params.get("required") or list(props):
                if (props.get(name) or {}).get("type", "string") == "string":
                    return str(name)
    return "input"


def arguments(shape: Shape, text: str, first: bool, last: bool) -> str:
    """A piece of the tool call's JSON arguments: the output tokens become
    one string property (always closed: the emulated call is complete)."""
    head = dumps({_arguments_key(shape): ""}).decode()[:-2] if first else ""
    body = dumps(text).decode()[1:-1]
    return head + body + ('"}' if last else "")


# -- handlers ------------------------------------------------------------------------------


async def create(request: web.Request) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    cfg = rt.cfg
    store = request.app[STORE]
    raw, fields = await intake(request, rt)
    try:
        body = parse_json_body(raw, request.headers.get("Content-Type"))
        fields["stream"] = bool(body.get("stream"))
        parsed = _validate(body)
        model = body.get("model") or cfg.served_model_name
        fields["model"] = model
        if model not in cfg.served_model_names:
            names = ", ".join(cfg.served_model_names)
            raise ApiError(
                404,
                f"The model `{model}` does not exist. Valid aliases: {names}.",
                "NotFoundError",
                "model",
            )
        keep = body.get("store", True) is not False
        if keep and body.get("background"):
            if not cfg.responses_store:
                raise _invalid(400, BACKGROUND_NEEDS_STORE, "background")
            raise bad_request(
                "The replayer emulator does not serve background responses.", "background"
            )
        if rt.engine.dead:
            rt.reqlog.write("request", **fields, n=None, status=500, error="engine dead")
            rt.dead_engine_hit()
            return json_response(dead_body(cfg.profile), 500)
        history: list[dict[str, Any]] = []
        prev = body.get("previous_response_id")
        if prev is not None:
            if not cfg.responses_store or prev not in store.conversations:
                raise not_found(str(prev))
            history = store.conversations[prev]
        messages = [*history, *input_messages(body)]
        chat = {"model": model, "messages": messages, "max_tokens": body.get("max_output_tokens")}
        g = parse_generation(chat, True, cfg)
        g.stream = bool(body.get("stream"))
        n_out, reason = _limits(g, rt)
    except ApiError as exc:
        rt.reqlog.write("request", **fields, n=None, status=exc.status, error=exc.message)
        return json_response(exc.body(cfg.profile), exc.status)
    rid = f"resp_{rt.hex(16)}"
    room = cfg.max_model_len - g.prompt_len
    shape = Shape(
        id=rid,
        created=int(time.time()),
        model=model,
        parsed=parsed,
        max_output=room if g.requested_max_tokens is None else min(g.requested_max_tokens, room),
        msg_id=f"msg_{rt.hex(16)}",
    )
    if parsed.forced is not None:
        shape.call_id, shape.fc_id = f"chatcmpl-tool-{rt.hex(16)}", f"fc_{rt.hex(16)}"
    reply = partial(_stream if g.stream else _unary, request, rt, shape)
    resp, answer = await serve(request, rt, g, n_out, reason, f"{rid}_0", fields, reply)
    if answer is not None and cfg.responses_store and keep:
        store.bodies[rid] = answer
        store.conversations[rid] = [*messages, *_output_messages(answer["output"])]
    return resp


def _limits(g: Generation, rt: Runtime) -> tuple[int, str]:
    """The renderer's length check, the engine-input check, then the output limit."""
    m, p = rt.cfg.max_model_len, g.prompt_len
    if p > m:
        check_limits(dataclasses.replace(g, requested_max_tokens=None), rt.cfg)
    if p == m:
        raise _invalid(
            400,
            f"The engine prompt length {p} exceeds the max_model_len {m}. Please reduce prompt.",
            "input",
        )
    return check_limits(g, rt.cfg, "max_output_tokens")


def _status(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def _output(shape: Shape, req: Request) -> list[Any]:
    text = filler(req.text_seed, 0, req.num_output)
    if shape.parsed.forced is not None:
        return [shape.call(arguments(shape, text, True, True), True)]
    return [shape.message(text, True)]


Answer = tuple[web.StreamResponse, dict[str, Any] | None]
"""The response to send, and the finished answer (None if it failed)."""


async def _unary(request: web.Request, rt: Runtime, shape: Shape, req: Request) -> Answer:
    finish = await last_output(request, req, partial(failed, rt))
    if isinstance(finish, web.Response):
        return finish, None
    answer = shape.response(_status(finish), _output(shape, req), usage(rt, req))
    return json_response(dumps(answer)), answer


class _Events:
    """Frames with vLLM's running ``sequence_number``."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(
        self,
        type_: str,
        obj: dict[str, Any],
        mid: dict[str, Any] | None = None,
        tail: dict[str, Any] | None = None,
    ) -> bytes:
        """``obj``, ``sequence_number``, ``mid``, ``type``, ``tail``: the
        openai event models' field order."""
        obj["sequence_number"] = self.n
        obj.update(mid or {})
        obj["type"] = type_
        obj.update(tail or {})
        self.n += 1
        return b"event: " + type_.encode() + b"\ndata: " + dumps(obj) + b"\n\n"


async def _stream(request: web.Request, rt: Runtime, shape: Shape, req: Request) -> Answer:
    return await sse(request, partial(_pump, request, rt, shape, req))


async def _pump(
    request: web.Request, rt: Runtime, shape: Shape, req: Request, resp: web.StreamResponse
) -> dict[str, Any] | None:
    ev = _Events()
    initial = shape.response("in_progress", [], None)
    head = ev("response.created", {"response": initial})
    await resp.write(head + ev("response.in_progress", {"response": initial}))
    call = shape.parsed.forced is not None
    opened = False
    pieces: list[str] = []
    while True:
        out = await req.next()
        if out.error is not None or out.cut:
            # vLLM's generator raises: the connection drops without the last chunk.
            cut_connection(request)
            return None
        parts: list[bytes] = []
        last = out.finish is not None
        if out.tokens:
            if not opened:
                parts += _open(ev, shape, call)
                opened = True
            text = filler(req.text_seed, out.start, out.tokens)
            if call:
                piece = arguments(shape, text, out.start == 0, last)
                pieces.append(piece)
                parts.append(
                    ev(
                        "response.function_call_arguments.delta",
                        {"delta": piece, "item_id": shape.fc_id, "output_index": 0},
                    )
                )
            else:
                pieces.append(text)
                parts.append(
                    ev(
                        "response.output_text.delta",
                        {
                            "content_index": 0,
                            "delta": text,
                            "item_id": shape.msg_id,
                            "logprobs": [],
                            "output_index": 0,
                        },
                    )
                )
        final = None
        if last:
            whole = "".join(pieces)
            parts += _close(ev, shape, call, whole)
            final = shape.response(_status(out.finish), _output(shape, req), usage(rt, req))
            parts.append(ev("response.completed", {"response": final}))
        if parts:
            await resp.write(b"".join(parts))
        if final is not None:
            await resp.write_eof()
            return final


def _open(ev: _Events, shape: Shape, call: bool) -> list[bytes]:
    if call:
        return [
            ev("response.output_item.added", {"item": shape.call("", False), "output_index": 0})
        ]
    return [
        ev("response.output_item.added", {"item": shape.message("", False), "output_index": 0}),
        ev(
            "response.content_part.added",
            {
                "content_index": 0,
                "item_id": shape.msg_id,
                "output_index": 0,
                "part": _part("", []),
            },
        ),
    ]


def _close(ev: _Events, shape: Shape, call: bool, whole: str) -> list[bytes]:
    if call:
        done = {"arguments": whole, "item_id": shape.fc_id, "output_index": 0}
        out = [
            ev("response.function_call_arguments.done", done, tail={"name": shape.parsed.forced})
        ]
        out.append(
            ev("response.output_item.done", {"item": shape.call(whole, True), "output_index": 0})
        )
        return out
    return [
        ev(
            "response.output_text.done",
            {
                "content_index": 0,
                "item_id": shape.msg_id,
                "logprobs": [],
                "output_index": 0,
            },
            {"text": whole},
        ),
        ev(
            "response.content_part.done",
            {
                "content_index": 0,
                "item_id": shape.msg_id,
                "output_index": 0,
                "part": _part(whole, None),
            },
        ),
        ev("response.output_item.done", {"item": shape.message(whole, True), "output_index": 0}),
    ]


async def retrieve(request: web.Request) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    rid = request.match_info["response_id"]
    body = request.app[STORE].bodies.get(rid)
    if body is None:
        exc = not_found(rid)
        return json_response(exc.body(rt.cfg.profile), exc.status)
    return json_response(dumps(body))


async def cancel(request: web.Request) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    rid = request.match_info["response_id"]
    if rid not in request.app[STORE].bodies:
        exc = not_found(rid)
    else:  # only background responses can be cancelled, and none is emulated
        exc = _invalid(400, "Cannot cancel a synchronous response.", "response_id")
    return json_response(exc.body(rt.cfg.profile), exc.status)
