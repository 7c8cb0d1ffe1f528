"""Response bytes, exactly as vLLM puts them on the wire (VLLM.md §2.2, §3, §4).

* Chat chunks are ``model_dump_json(exclude_unset=True, ...)``: compact JSON,
  fields in model order, ``null`` kept in chunks with choices and dropped from
  the usage chunk. Completion chunks keep every ``null``.
* Non-streaming bodies and error bodies are compact JSON (Starlette's
  ``JSONResponse``); the in-stream error of ``/v1/completions`` alone is
  ``json.dumps`` with spaces.
* ``usage`` keys are ``prompt_tokens, total_tokens, completion_tokens`` then
  details; ``prompt_tokens_details`` only with ``--enable-prompt-tokens-details``.
* Wire variants (``--vllm-version``): ``0.32`` (measured on a real 0.32.0)
  has the EngineCore message in dead-engine errors, every in-stream error as
  spaced ``json.dumps``, no ``weight_versions``/``kv_transfer_params`` on stream
  chunks and ``created_cache_tokens`` in chat usage; ``0.10`` also has
  ``BadRequestError``/400 for the dead engine in-stream and no
  ``system_fingerprint``; ``0.9`` also uses the flat error object.

Streams are built from per-request byte templates so that a chunk costs one
``orjson.dumps`` of the delta text. Filler text is a fixed word cycle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

CLIENT_DEAD_MESSAGE = "The server had an error while processing your request."
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
INTERNAL_MESSAGE = "Internal server error"
DONE = b"data: [DONE]\n\n"
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"

WORDS = tuple(
    " " + w
    for w in (
        "the model keeps writing plain filler text so that long runs stay cheap and every "
        "token maps to one short word which is enough for replay tests that only care about "
        "lengths timing usage and the exact framing of each event on the wire while the "
        "content itself means nothing at all here"
    ).split()
)


def filler(seed: int, start: int, count: int) -> str:
    """Text of output tokens ``start .. start+count`` (one word per token)."""
    w = len(WORDS)
    return "".join([WORDS[(seed + i) % w] for i in range(start, start + count)])


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


# -- errors --------------------------------------------------------------------------


def error_obj(profile: str, message: str, type_: str, param: str | None, code: int) -> Any:
    if profile == "0.9":
        return {"object": "error", "message": message, "type": type_, "param": param, "code": code}
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_body(profile: str, message: str, type_: str, param: str | None, code: int) -> bytes:
    return dumps(error_obj(profile, message, type_, param, code))


def dead_body(profile: str) -> bytes:
    """HTTP 500 body for a request that meets a dead engine."""
    msg = CLIENT_DEAD_MESSAGE if profile == "0.33" else ENGINE_DEAD_MESSAGE
    return error_body(profile, msg, "InternalServerError", None, 500)


def error_event(profile: str, chat: bool, kind: str) -> bytes:
    """The in-stream error event (``kind``: ``dead`` or ``internal``)."""
    if kind == "internal":
        return stream_error(profile, chat, INTERNAL_MESSAGE, "InternalServerError", None, 500)
    if profile == "0.33":
        return stream_error(profile, chat, CLIENT_DEAD_MESSAGE, "InternalServerError", None, 500)
    if profile == "0.32":
        return stream_error(profile, chat, ENGINE_DEAD_MESSAGE, "InternalServerError", None, 500)
    return stream_error(profile, chat, ENGINE_DEAD_MESSAGE, "BadRequestError", None, 400)


def stream_error(
    profile: str, chat: bool, message: str, type_: str, param: str | None, code: int
) -> bytes:
    """One ``data:`` error event. vLLM's ``create_streaming_error_response`` is
    ``json.dumps`` (spaces); 0.33's chat generator alone dumps compact JSON."""
    obj = error_obj(profile, message, type_, param, code)
    text = dumps(obj) if chat and profile == "0.33" else json.dumps(obj).encode()
    return b"data: " + text + b"\n\n"


# -- usage -----------------------------------------------------------------------------


def usage_final(
    prompt: int, completion: int, cached: int | None, created: int | None = None
) -> dict[str, Any]:
    """The include_usage chunk's usage (``exclude_none``)."""
    u: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if cached is not None:
        details: dict[str, Any] = {"cached_tokens": cached}
        if created is not None:
            details["created_cache_tokens"] = created
        u["prompt_tokens_details"] = details
    return u


def usage_body(
    prompt: int, completion: int, cached: int | None, created: int | None = None
) -> dict[str, Any]:
    """Non-streaming usage (``model_dump`` keeps nulls). ``created`` is
    ``created_cache_tokens``: prompt tokens this request wrote to the prefix
    cache (vLLM 0.32 fills it for chat only)."""
    details = (
        None
        if cached is None
        else {"cached_tokens": cached, "created_cache_tokens": created, "multimodal_tokens": None}
    )
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": details,
        "completion_tokens_details": None,
    }


# -- streams ---------------------------------------------------------------------------


@dataclass(slots=True)
class StreamShape:
    """Per-request constants of one SSE stream."""

    chat: bool
    id: str
    created: int
    model: str
    fingerprint: str | None
    include_usage: bool
    continuous: bool
    prompt_tokens: int
    cached: int | None
    """``cached_tokens`` to report, or None without prompt-token details."""
    created_cache: int | None = None
    """``created_cache_tokens`` to report in the usage chunk (0.32 chat), or None."""
    tail_fields: bool = True
    """0.33's ``weight_versions``/``kv_transfer_params`` on the terminal chunk."""
    head: bytes = b""
    """``data: {"id":...,"model":...`` - the same in every chunk (computed once)."""

    def __post_init__(self) -> None:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        self.head = (
            b'data: {"id":'
            + dumps(self.id)
            + b',"object":"'
            + obj.encode()
            + b'","created":'
            + str(self.created).encode()
            + b',"model":'
            + dumps(self.model)
        )

    def _head(self) -> bytes:
        return self.head

    def _cont_usage(self, completion: int) -> bytes:
        if not self.continuous:
            return b""
        u: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "completion_tokens": completion,
        }
        if self.chat:
            u["completion_tokens_details"] = None
        return b',"usage":' + dumps(u)

    def role(self) -> bytes:
        """Chat's first chunk, sent with the first engine output."""
        return (
            self._head()
            + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            + b'"logprobs":null,"finish_reason":null}]'
            + self._cont_usage(0)
            + b',"prompt_token_ids":null,"prompt_text":null}\n\n'
        )

    def delta(self, text: str, completion: int, finish: str | None) -> bytes:
        """One content chunk; ``finish`` makes it the terminal one."""
        fp = b""
        if finish is not None and not self.include_usage and self.fingerprint is not None:
            fp = b',"system_fingerprint":' + dumps(self.fingerprint)
        wv = b',"weight_versions":null' if self.tail_fields else b""
        if self.chat:
            if finish is None:
                choice = b'"logprobs":null,"finish_reason":null,"token_ids":null}]'
            else:
                choice = (
                    b'"logprobs":null,"finish_reason":'
                    + dumps(finish)
                    + b',"stop_reason":null,"token_ids":null'
                    + wv
                    + b"}]"
                )
            tail = (
                b',"kv_transfer_params":null}\n\n'
                if finish is not None and self.tail_fields
                else b"}\n\n"
            )
            return (
                self._head()
                + b',"choices":[{"index":0,"delta":{"content":'
                + dumps(text)
                + b"},"
                + choice
                + self._cont_usage(completion)
                + fp
                + tail
            )
        return (
            self._head()
            + b',"choices":[{"index":0,"text":'
            + dumps(text)
            + b',"logprobs":null,"finish_reason":'
            + dumps(finish)
            + b',"stop_reason":null,"prompt_token_ids":null,"token_ids":null'
            + wv
            + b"}]"
            + self._cont_usage(completion)
            + fp
            + (b',"kv_transfer_params":null}\n\n' if self.tail_fields else b"}\n\n")
        )

    def usage(self, completion: int, spec: dict[str, Any] | None = None) -> bytes:
        """The final ``include_usage`` chunk (``exclude_none``); ``spec``: the
        request's ``metrics.speculative_decoding``, last (vLLM 0.32 puts
        ``metrics`` after ``system_fingerprint`` and, in chat, the unset
        ``prompt_token_ids``/``prompt_text``)."""
        fp = (
            b"" if self.fingerprint is None else b',"system_fingerprint":' + dumps(self.fingerprint)
        )
        u = usage_final(self.prompt_tokens, completion, self.cached, self.created_cache)
        m = b"" if spec is None else b',"metrics":' + dumps({"speculative_decoding": spec})
        return self._head() + b',"choices":[],"usage":' + dumps(u) + fp + m + b"}\n\n"


# -- non-streaming bodies -----------------------------------------------------------------


def chat_body(
    id_: str,
    created: int,
    model: str,
    text: str,
    finish: str,
    fingerprint: str | None,
    prompt: int,
    completion: int,
    cached: int | None,
    created_cache: int | None = None,
    weight_versions: bool = True,
    spec: dict[str, Any] | None = None,
) -> bytes:
    """``weight_versions`` False: 0.32's choice without that field; ``spec``:
    the request's ``metrics.speculative_decoding``."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        },
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": None,
        "routed_experts": None,
    }
    if weight_versions:
        choice["weight_versions"] = None
    return dumps(
        {
            "id": id_,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": fingerprint,
            "usage": usage_body(prompt, completion, cached, created_cache),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": body_metrics(spec),
        }
    )


def body_metrics(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """A body's ``metrics`` (``model_dump`` keeps nulls): vLLM 0.32's
    ``PerRequestMetrics`` with only ``speculative_decoding`` set, or None."""
    if spec is None:
        return None
    sd = {**spec}
    sd.setdefault("per_step_accepted", None)
    sd.setdefault("per_step_drafted", None)
    return {
        "time_to_first_token_ms": None,
        "generation_time_ms": None,
        "queue_time_ms": None,
        "mean_itl_ms": None,
        "tokens_per_second": None,
        "speculative_decoding": sd,
    }


def completion_body(
    id_: str,
    created: int,
    model: str,
    text: str,
    finish: str,
    fingerprint: str | None,
    prompt: int,
    completion: int,
    cached: int | None,
    modern: bool = True,
    spec: dict[str, Any] | None = None,
) -> bytes:
    """Field order of vLLM's CompletionResponse (measured on 0.32; ``modern``
    False drops what 0.32 added over the older inferred shape)."""
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
    }
    body: dict[str, Any] = {
        "id": id_,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage_body(prompt, completion, cached),
        "kv_transfer_params": None,
    }
    if modern:
        choice["routed_experts"] = None
        body["ec_transfer_params"] = None
        body["metrics"] = body_metrics(spec)
    return dumps(body)


def models_body(
    names: tuple[str, ...], root: str, max_model_len: int, created: int, perm_id: str
) -> bytes:
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": root,
            "parent": None,
            "max_model_len": max_model_len,
            "permission": [
                {
                    "id": perm_id,
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        for name in names
    ]
    return dumps({"object": "list", "data": data})
