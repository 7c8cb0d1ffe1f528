"""Request validation with vLLM's status codes and messages (VLLM.md §4).

The order of checks follows vLLM 0.33's request path: JSON decoding (FastAPI
parses the body when the content type is JSON or missing), then the
``Content-Type`` dependency, then pydantic field validation (and the
request models' validators: tool usage), then the model check, then the
engine-dead preflight (done by the caller), then rendering (tool choices
that need a parser, token limits), then the engine's input check (token ids
in vocabulary, in-stream for streams). FastAPI/pydantic errors are rendered the way vLLM's
``validation_exception_handler`` renders them::

    1 validation error:
      {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required',
      'input': '<dict of 1 items>'}     (one line on the wire)

with ``type: "Bad Request"`` and ``param`` = the first error's location. Only
the fields replay traffic uses are type-checked; unknown fields are ignored,
as vLLM ignores removed legacy fields.

Output length: ``max_completion_tokens`` (chat) or ``max_tokens`` if given,
clamped to the context left (0.32 and 0.33) - ``finish_reason: length``. Without it,
the answer ends "naturally" (``stop``) after ``--default-max-tokens``;
``--eos-after N`` sets a natural length even when ``max_tokens`` is given, and
``ignore_eos`` removes the natural end (vLLM's length check wins a tie).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from replayer.emulator import tokenizer
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.wire import error_body

_JSON_TYPES = ("application/json",)
_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}
MAX_ID = (1 << 64) - 1
_TYPE_MESSAGES = {
    "string_type": "Input should be a valid string",
    "list_type": "Input should be a valid list",
    "int_type": "Input should be a valid integer",
}
"""pydantic's message for each type error :func:`check_required` reports."""


class ApiError(Exception):
    """An error response: status, vLLM message, type and param."""

    def __init__(self, status: int, message: str, type_: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param

    def body(self, profile: str) -> bytes:
        return error_body(profile, self.message, self.type, self.param, self.status)


def bad_request(message: str, param: str | None = None, value: object = None) -> ApiError:
    """``VLLMValidationError``: the parameter (and value) are appended to the message."""
    if param is not None:
        tail = f"parameter={param}" + ("" if value is None else f", value={value}")
        message = f"{message} ({tail})"
    return ApiError(400, message, "BadRequestError", param)


def _summary(value: object) -> str:
    if isinstance(value, dict):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list):
        return f"<list of {len(value)} items>"
    return str(value)[:200]


def validation_error(errors: list[dict[str, Any] | str]) -> ApiError:
    n = len(errors)
    lines = [(str(e) if isinstance(e, dict) else e)[:1000] for e in errors[:10]]
    if n > 10:
        lines.append(f"...and {n - 10} more errors")
    head = f"{n} validation error{'s' if n != 1 else ''}:"
    first = errors[0]
    param = first["loc"] if isinstance(first, dict) else None
    return ApiError(400, head + "\n  " + "\n  ".join(lines), "Bad Request", param)


def field_error(type_: str, loc: str, msg: str, value: object) -> dict[str, Any]:
    """One pydantic validation error, as vLLM's 400 bodies list them."""
    return {"type": type_, "loc": loc, "msg": msg, "input": _summary(value)}


def check_required(
    body: dict[str, Any],
    key: str,
    ok: type | tuple[type, ...],
    type_: str,
    errors: list[dict[str, Any] | str],
) -> bool:
    """pydantic's check of a required field ``body.<key>``, shared by the
    APIs' request models: ``missing`` when it is absent, ``type_`` when its
    value is not an ``ok`` (a bool is not taken for an int). True when it
    passed, for the caller's further checks."""
    loc = f"body.{key}"
    if key not in body:
        errors.append(field_error("missing", loc, "Field required", body))
        return False
    value = body[key]
    oks = ok if isinstance(ok, tuple) else (ok,)
    if not isinstance(value, oks) or (isinstance(value, bool) and bool not in oks):
        errors.append(field_error(type_, loc, _TYPE_MESSAGES[type_], value))
        return False
    return True


def parse_json_body(raw: bytes, content_type: str | None) -> dict[str, Any]:
    """Decode and shape-check a JSON request body."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    body: Any = None
    if raw and (not content_type or media in _JSON_TYPES or media.endswith("+json")):
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            try:  # the stdlib gives FastAPI's exact position and message
                body = json.loads(raw)
            except json.JSONDecodeError as exc:
                e = field_error("json_invalid", f"body.{exc.pos}", "JSON decode error", {})
                e["ctx"] = {"error": exc.msg}
                raise validation_error([e]) from None
            except (UnicodeDecodeError, ValueError):
                e = field_error("json_invalid", "body.0", "JSON decode error", {})
                e["ctx"] = {"error": "Invalid UTF-8"}
                raise validation_error([e]) from None
    if media != "application/json":
        raise validation_error(["Unsupported Media Type: Only 'application/json' is allowed"])
    if not raw:
        raise validation_error([field_error("missing", "body", "Field required", None)])
    if not isinstance(body, dict):
        raise validation_error(
            [
                field_error(
                    "model_attributes_type",
                    "body",
                    "Input should be a valid dictionary or object to extract fields from",
                    body,
                )
            ]
        )
    return body


def _check_int(body: dict[str, Any], key: str, errors: list[dict[str, Any] | str]) -> None:
    v = body.get(key)
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return
    loc = f"body.{key}"
    if isinstance(v, bool):
        body[key] = int(v)
    elif isinstance(v, float):
        if v.is_integer():
            body[key] = int(v)
        else:
            errors.append(
                field_error(
                    "int_from_float",
                    loc,
                    "Input should be a valid integer, got a number with a fractional part",
                    v,
                )
            )
    elif isinstance(v, str):
        try:
            body[key] = int(v.strip())
        except ValueError:
            errors.append(
                field_error(
                    "int_parsing",
                    loc,
                    "Input should be a valid integer, unable to parse string as an integer",
                    v,
                )
            )
    else:
        errors.append(field_error("int_type", loc, "Input should be a valid integer", v))


def _check_bool(d: dict[str, Any], key: str, loc: str, errors: list[dict[str, Any] | str]) -> None:
    v = d.get(key)
    if v is None or isinstance(v, bool):
        return
    if isinstance(v, int) and v in (0, 1):
        d[key] = bool(v)
    elif isinstance(v, str) and v.lower() in _TRUE | _FALSE:
        d[key] = v.lower() in _TRUE
    elif isinstance(v, str):
        errors.append(
            field_error(
                "bool_parsing", loc, "Input should be a valid boolean, unable to interpret input", v
            )
        )
    else:
        errors.append(field_error("bool_type", loc, "Input should be a valid boolean", v))


@dataclass(slots=True)
class Generation:
    """A validated generation request."""

    chat: bool
    model: str
    stream: bool
    include_usage: bool
    continuous_usage: bool
    requested_max_tokens: int | None
    ignore_eos: bool
    stream_bytes: bytes
    """The prompt's token stream (see :mod:`.tokenizer`)."""
    token_ids_prompt: bool
    out_of_vocab: int | None = None
    """The largest token id of a token-id prompt when it is >= ``--vocab-size``
    (vLLM rejects it last, in the engine's input processing: in-stream for
    streams)."""
    tool_choice: object = None
    """The effective ``tool_choice`` (``"auto"`` when tools come without one)."""
    tools: bool = False
    """The request carries a non-empty ``tools`` list."""

    @property
    def prompt_len(self) -> int:
        return tokenizer.count(self.stream_bytes)


_PROMPT_KEY = b'"prompt":['


def fast_token_prompt(raw: bytes, content_type: str | None) -> tuple[dict[str, Any], bytes] | None:
    """A completion body whose prompt is one array of same-width token ids
    (what replayer sends for ``blocks`` traces), parsed without building a
    Python int per id: the array's digits are read as a matrix, the rest of
    the body by orjson. Returns the body (its prompt a placeholder) and the
    prompt's token stream, or None for anything else: the full parse then
    decides, with vLLM's exact errors."""
    if (content_type or "").split(";", 1)[0].strip().lower() != "application/json":
        return None
    # A duplicate prompt key later in the body wins in JSON: then the rest,
    # parsed below, does not show the placeholder, and the full parse decides.
    start = raw.find(_PROMPT_KEY)
    if start <= 0 or raw[start - 1] == 0x5C:
        return None
    lo = start + len(_PROMPT_KEY)
    end = raw.find(b"]", lo)
    if end <= lo:
        return None
    span = raw[lo:end]
    first = span.find(b",")
    width = (first if first >= 0 else len(span)) + 1  # digits and the comma after
    n, rem = divmod(len(span) + 1, width)
    if rem or not 1 <= width - 1 <= 19:
        return None
    rows = np.frombuffer(span + b",", dtype=np.uint8).reshape(n, width)
    digits = rows[:, :-1]
    if (
        (rows[:, -1] != 0x2C).any()  # ragged widths, or not a flat array of numbers
        or ((digits - np.uint8(48)) > 9).any()  # whitespace, signs, floats, nesting
        or (width > 2 and (rows[:, 0] == 0x30).any())  # a leading zero: invalid JSON
    ):
        return None
    cols = rows.T  # digit j of every id, a strided view
    ids = cols[0].astype(np.uint64)
    for j in range(1, width - 1):
        ids *= np.uint64(10)
        ids += cols[j]
    ids -= np.uint64(48 * int("1" * (width - 1)) % (1 << 64))  # each digit was ASCII
    try:
        body = orjson.loads(raw[: lo - 1] + b"[0]" + raw[end + 1 :])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or body.get("prompt") != [0]:
        return None  # the match was not the top-level prompt
    return body, ids.tobytes()


def parse_generation(
    body: dict[str, Any], chat: bool, cfg: EmulatorConfig, ids: bytes | None = None
) -> Generation:
    """Field validation and tokenization (no limits, no model check);
    ``ids``: the prompt's token stream when :func:`fast_token_prompt` read it."""
    errors: list[dict[str, Any] | str] = []
    if chat and check_required(body, "messages", list, "list_type", errors):
        for i, m in enumerate(body["messages"]):
            if not isinstance(m, dict):
                errors.append(
                    field_error(
                        "model_type",
                        f"body.messages.{i}",
                        "Input should be a valid dictionary or instance of Message",
                        m,
                    )
                )
            elif not isinstance(m.get("role"), str):
                errors.append(
                    field_error("missing", f"body.messages.{i}.role", "Field required", m)
                )
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        errors.append(
            field_error("string_type", "body.model", "Input should be a valid string", model)
        )
    for key in ("max_tokens", "max_completion_tokens", "n", "min_tokens", "seed"):
        _check_int(body, key, errors)
    for key in ("stream", "ignore_eos"):
        _check_bool(body, key, f"body.{key}", errors)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        errors.append(
            field_error(
                "model_type",
                "body.stream_options",
                "Input should be a valid dictionary or instance of StreamOptions",
                opts,
            )
        )
    elif isinstance(opts, dict):
        for key in ("include_usage", "continuous_usage_stats"):
            _check_bool(opts, key, f"body.stream_options.{key}", errors)
    if errors:
        raise validation_error(errors)

    stream = bool(body.get("stream"))
    if opts is not None and not stream:
        raise bad_request(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    tool_choice = _check_tool_usage(body) if chat else None
    if body.get("n") not in (None, 1):
        raise bad_request("The replayer emulator serves n=1 only.", "n", body.get("n"))
    oov: int | None = None
    if chat:
        stream_bytes = tokenizer.chat_stream(body["messages"])
        token_ids = False
    else:
        stream_bytes, token_ids = (ids, True) if ids is not None else _completion_prompt(body)
        if token_ids and stream_bytes:
            top = int(np.frombuffer(stream_bytes, dtype="<u8").max())
            oov = top if top >= cfg.vocab_size else None
    requested = body.get("max_completion_tokens") if chat else None
    if requested is None:
        requested = body.get("max_tokens")
    if requested is not None and requested < 1:
        raise bad_request(
            f"max_tokens must be at least 1, got {requested}.", "max_tokens", requested
        )
    force = cfg.enable_force_include_usage
    include = force or bool(stream and isinstance(opts, dict) and opts.get("include_usage"))
    continuous = force or bool(
        include and isinstance(opts, dict) and opts.get("continuous_usage_stats")
    )
    return Generation(
        chat=chat,
        model=model or cfg.served_model_name,
        stream=stream,
        include_usage=include and stream,
        continuous_usage=continuous and stream,
        requested_max_tokens=requested,
        ignore_eos=bool(body.get("ignore_eos")),
        stream_bytes=stream_bytes,
        token_ids_prompt=token_ids,
        out_of_vocab=oov,
        tool_choice=tool_choice,
        tools=bool(body.get("tools")),
    )


_NAMED_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def _check_tool_usage(body: dict[str, Any]) -> object:
    """vLLM's ``ChatCompletionRequest.check_tool_usage``; the effective tool_choice."""
    tools = body.get("tools")
    if tools == []:
        raise bad_request(
            "`tools` must not be an empty array. Either provide at least one tool or omit "
            "the field entirely.",
            "tools",
        )
    choice = body.get("tool_choice")
    if "tool_choice" not in body and tools:
        choice = "auto"
    if choice is None or choice == "none":
        return choice
    if tools is None:
        raise bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise bad_request(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", '
            '"auto" or "required" are supported.',
            "tool_choice",
        )
    if isinstance(choice, dict):
        function = choice.get("function")
        if not isinstance(function, dict):
            raise bad_request(
                f"Invalid value for `function`: `{function}` in `tool_choice`! {_NAMED_USAGE}",
                "tool_choice.function",
            )
        if "name" not in function:
            raise bad_request(
                f"Expected field `name` in `function` in `tool_choice`! {_NAMED_USAGE}",
                "tool_choice.function.name",
            )
        name = function["name"]
        if not isinstance(name, str) or not name:
            raise bad_request(
                f"Invalid `name` in `function`: `{name}` in `tool_choice`! {_NAMED_USAGE}",
                "tool_choice.function.name",
            )
        names = [
            t.get("function", {}).get("name")
            for t in tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
        ]
        if name not in names:
            raise bad_request(
                "The tool specified in `tool_choice` does not match any of the specified `tools`",
                "tool_choice",
            )
    return choice


def check_tools(g: Generation, cfg: EmulatorConfig) -> None:
    """vLLM's renderer check: tool choices that need a tool-call parser."""
    choice = g.tool_choice
    if choice is None or choice == "none":
        return
    if cfg.enable_auto_tool_choice and cfg.tool_call_parser:
        return
    if choice == "auto":
        raise ApiError(
            400,
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
            "to be set",
            "BadRequestError",
        )
    name = choice["function"]["name"] if isinstance(choice, dict) else None
    desc = f'"{choice}"' if name is None else f'function "{name}"'
    raise ApiError(
        400, f"tool_choice={desc} requires --tool-call-parser to be set", "BadRequestError"
    )


def out_of_vocabulary(token_id: int) -> ApiError:
    """The input processor's rejection (no ``param``)."""
    return ApiError(400, f"Token id {token_id} is out of vocabulary", "BadRequestError")


def _completion_prompt(body: dict[str, Any]) -> tuple[bytes, bool]:
    prompt = body.get("prompt")
    empty = "Either prompt or prompt_embeds must be provided and non-empty."
    if prompt is None or prompt == "" or prompt == []:
        e = field_error("value_error", "body", f"Value error, {empty}", body)
        e["ctx"] = {"error": empty}
        raise validation_error([e])
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tokenizer.text_stream(prompt), False
    if isinstance(prompt, list) and set(map(type, prompt)) == {int}:
        if min(prompt) < 0:
            raise validation_error(_negative_ids(prompt))
        big = max(prompt)
        if big > MAX_ID:  # beyond any vocabulary and any 64-bit id
            raise out_of_vocabulary(big)
        return tokenizer.ids_stream(prompt), True
    if isinstance(prompt, list) and all(isinstance(p, str | list) for p in prompt):
        raise bad_request(
            f"The replayer emulator serves one prompt per request, got {len(prompt)}.", "prompt"
        )
    raise validation_error(
        [field_error("string_type", "body.prompt", "Input should be a valid string", prompt)]
    )


def _negative_ids(prompt: list[int]) -> list[dict[str, Any] | str]:
    """pydantic's errors for ``prompt: list[int >= 0] | list[list[int]] | str |
    list[str]`` given a flat list with negative ids, in vLLM's order."""
    errors: list[dict[str, Any] | str] = []
    for i, t in enumerate(prompt):
        if t < 0:
            e = field_error(
                "greater_than_equal",
                f"body.prompt.{i}",
                "Input should be greater than or equal to 0",
                t,
            )
            e["ctx"] = {"ge": 0}
            errors.append(e)
    for i, t in enumerate(prompt):
        errors.append(
            field_error("list_type", f"body.prompt.{i}", "Input should be a valid list", t)
        )
    errors.append(
        field_error("string_type", "body.prompt", "Input should be a valid string", prompt)
    )
    for i, t in enumerate(prompt):
        errors.append(
            field_error("string_type", f"body.prompt.{i}", "Input should be a valid string", t)
        )
    return errors


def check_limits(
    g: Generation, cfg: EmulatorConfig, max_param: str = "max_tokens"
) -> tuple[int, str]:
    """vLLM's context checks; returns (tokens to generate, finish reason at the end).
    ``max_param`` names the output limit as the API calls it (Anthropic's
    ``max_tokens`` becomes chat's ``max_completion_tokens``; Responses has
    ``max_output_tokens``)."""
    m, p, x = cfg.max_model_len, g.prompt_len, g.requested_max_tokens
    profile = cfg.profile
    if p == 0:
        raise bad_request("The decoder prompt cannot be empty")
    if x is not None and x > m and cfg.modern:
        raise bad_request(
            f"{max_param}={x} cannot be greater than max_model_len={m}. "
            "Please request fewer output tokens.",
            max_param,
            x,
        )
    if p > m:
        if cfg.modern:
            shown = p if g.token_ids_prompt else m + 1
            least = "" if g.token_ids_prompt else "at least "
            raise bad_request(
                f"This model's maximum context length is {m} tokens. However, your prompt "
                f"contains {least}{shown} input tokens, which exceeds this limit even without "
                "any output tokens. Please reduce the length of the input prompt.",
                "input_tokens",
                shown,
            )
        raise _old_overflow(profile, m, p, x)
    if p == m:
        if profile == "0.32":  # measured: the clamp leaves 0, then SamplingParams rejects it
            raise bad_request("max_tokens must be at least 1, got 0.", "max_tokens", 0)
        raise bad_request(
            f"The decoder prompt (length {p}) plus the number of requested output tokens "
            f"(at least 1) is longer than the maximum model length of {m}. Make sure that "
            "`max_model_len` is no smaller than the number of text tokens (prompt + "
            "requested output tokens)."
        )
    room = m - p
    if x is not None and x > room and not cfg.modern:
        raise _old_overflow(profile, m, p, x)
    limit = room if x is None else min(x, room)
    natural: int | None = cfg.eos_after
    if natural is None and x is None:
        natural = cfg.default_max_tokens
    if g.ignore_eos or natural is None or natural >= limit:
        return limit, "length"
    return natural, "stop"


def _old_overflow(profile: str, m: int, p: int, x: int | None) -> ApiError:
    if profile == "0.9":
        t = p + (x or 0)
        return ApiError(
            400,
            f"This model's maximum context length is {m} tokens. However, you requested {t} "
            f"tokens ({p} in the messages, {x or 0} in the completion). Please reduce the "
            "length of the messages or completion.",
            "BadRequestError",
        )
    if p > m:
        return ApiError(
            400,
            f"This model's maximum context length is {m} tokens. However, your request has "
            f"{p} input tokens. Please reduce the length of the input messages.",
            "BadRequestError",
        )
    return bad_request(
        f"'max_tokens' or 'max_completion_tokens' is too large: {x}. This model's maximum "
        f"context length is {m} tokens and your request has {p} input tokens ({x} > {m} - {p}).",
        "max_tokens",
        x,
    )
