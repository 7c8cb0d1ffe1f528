"""The aiohttp application: routes, gates and headers of vLLM's API server
(VLLM.md §1.2).

* ``/health`` and ``/ping``: 200 with an empty body, 503 once the engine is
  dead; a hung engine still answers 200, unless its API is stalled too
  (``hang api=stall``): then no request gets an answer, as when the API
  server's event loop is stuck.
* ``/fault_tolerance/status`` (only with ``--enable-fault-tolerance``): the
  engine's state, ``healthy``, ``unhealthy`` (the ``unhealthy`` fault; ``/health``
  stays 200 then, as vLLM's does) or ``dead``.
* ``/v1/models``, ``/version``, ``/load``, ``/metrics``, ``/tokenize`` and
  ``/detokenize`` never touch the engine, so they answer after death too.
* Dev endpoints (``/server_info``, ``/reset_prefix_cache``, ...) exist only
  with ``VLLM_SERVER_DEV_MODE=1``; otherwise FastAPI's ``404 {"detail":"Not
  Found"}``, like any unknown path (and ``405 {"detail":"Method Not
  Allowed"}``).
* ``--api-key`` guards only paths under ``/v1``, ``/v2``, ``/inference`` and
  ``/cohere``: ``401 {"error":"Unauthorized"}``.
* Response headers look like uvicorn + Starlette's (measured on vLLM 0.32):
  lower-case names in their order (``date``, ``server: uvicorn``,
  ``content-length``, ``content-type``, ``vary: Origin``,
  ``transfer-encoding``), ``allow`` on a 405; ``x-request-id`` is echoed with
  ``--enable-request-id-headers``.
* Every request except those vLLM's instrumentator excludes is counted in the
  ``http_*`` metric families (route template, or ``none`` for unknown paths).

:func:`create_app` is usable in-process (tests); :mod:`.server` runs it as
a process. Generation lives in :mod:`.generate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from replayer.emulator import anthropic, responses, tokenizer
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.generate import (
    GENERATION_PATHS,
    RUNTIME,
    chat_completions,
    completions,
    json_response,
    log_rejected,
)
from replayer.emulator.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from replayer.emulator.parsing import ApiError, field_error, parse_json_body, validation_error
from replayer.emulator.runtime import Runtime
from replayer.emulator.wire import models_body

GUARDED = ("/v1", "/v2", "/inference", "/cohere")
MAX_BODY = 1 << 30
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HEADER_ORDER = (
    "date",
    "server",
    "allow",
    "content-length",
    "content-type",
    "vary",
    "x-request-id",
    "transfer-encoding",
    "connection",
)
_HEADER_RANK = {name: i for i, name in enumerate(HEADER_ORDER)}


@web.middleware
async def _stalled(request: web.Request, handler: Handler) -> web.StreamResponse:
    """After ``hang api=stall``: every new request waits, unanswered, until
    the server stops (outside ``_instrument``: the shutdown does not wait for
    it)."""
    if request.app[RUNTIME].api_stalled:
        await asyncio.get_running_loop().create_future()  # cancelled at shutdown
    return await handler(request)


@web.middleware
async def _instrument(request: web.Request, handler: Handler) -> web.StreamResponse:
    """prometheus-fastapi-instrumentator's ``http_*`` metrics (outermost), and the
    count of requests in progress the shutdown waits for: a request is done
    once its response is on the wire (sent here, not after the middleware)."""
    began = time.perf_counter()
    rt = request.app[RUNTIME]
    rt.request_started()
    try:
        response = await handler(request)
        with contextlib.suppress(ConnectionError):  # a cut stream, a vanished client
            await response.prepare(request)
            await response.write_eof()
    finally:
        rt.request_done()
    known = request.path in rt.paths
    size = request.content_length or 0
    sent = response.content_length if isinstance(response, web.Response) else None
    rt.metrics.http(
        request.path if known else "none",
        request.method,
        response.status,
        time.perf_counter() - began,
        size,
        sent or 0,
    )
    return response


@web.middleware
async def _gate(request: web.Request, handler: Handler) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    key = rt.cfg.api_key
    if (
        key
        and request.method != "OPTIONS"
        and request.path.startswith(GUARDED)
        and request.headers.get("Authorization") != f"Bearer {key}"
    ):
        if request.path in GENERATION_PATHS and request.method == "POST":
            await log_rejected(request, rt, 401, "Unauthorized")
        return json_response(b'{"error":"Unauthorized"}', 401)
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return json_response(b'{"detail":"Not Found"}', 404)
    except web.HTTPMethodNotAllowed as exc:
        resp = json_response(b'{"detail":"Method Not Allowed"}', 405)
        resp.headers["allow"] = ", ".join(sorted(exc.allowed_methods))
        return resp


async def _headers(request: web.Request, response: StreamResponse) -> None:
    """uvicorn's header names and order; runs after aiohttp set its own."""
    h = response.headers
    h["server"] = "uvicorn"
    h["vary"] = "Origin"  # Starlette's CORSMiddleware
    if request.app[RUNTIME].cfg.enable_request_id_headers:
        rid = request.headers.get("X-Request-Id")
        if rid:
            h["x-request-id"] = rid
    items = sorted(
        ((k.lower(), v) for k, v in h.items()),
        key=lambda kv: _HEADER_RANK.get(kv[0], len(HEADER_ORDER)),
    )
    h.clear()
    for k, v in items:
        h.add(k, v)


class AccessLog(AbstractAccessLogger):
    """uvicorn's access line: ``127.0.0.1:50712 - "POST /v1/... HTTP/1.1" 200 OK``."""

    @property
    def enabled(self) -> bool:
        return True

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        if not isinstance(request, web.Request):
            return
        rt = request.app[RUNTIME]
        peer = request.transport.get_extra_info("peername") if request.transport else None
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "-"
        v = f"{request.version.major}.{request.version.minor}"
        rt.log.access(where, request.method, request.path_qs, v, response.status, response.reason)


# -- control endpoints --------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    return web.Response(status=503 if request.app[RUNTIME].engine.dead else 200)


async def fault_tolerance_status(request: web.Request) -> web.Response:
    engines = request.app[RUNTIME].effects.engine_status()
    return web.json_response({"schema_version": 1, "total_engines": 1, "engines": engines})


async def version(request: web.Request) -> web.Response:
    return json_response(orjson.dumps({"version": request.app[RUNTIME].cfg.vllm_version}))


async def load(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    n = rt.inflight if rt.cfg.enable_server_load_tracking else 0
    return json_response(orjson.dumps({"server_load": n}))


async def metrics(request: web.Request) -> web.Response:
    body = request.app[RUNTIME].metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


async def models(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    c = rt.cfg
    return json_response(
        models_body(c.served_model_names, c.model, c.max_model_len, rt.created, rt.perm_id)
    )


def _check_model(rt: Runtime, body: dict[str, Any]) -> None:
    model = body.get("model")
    if model and model not in rt.cfg.served_model_names:
        names = ", ".join(rt.cfg.served_model_names)
        raise ApiError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {names}.",
            "NotFoundError",
            "model",
        )


async def tokenize(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    try:
        body = parse_json_body(await request.read(), request.headers.get("Content-Type"))
        _check_model(rt, body)
        if isinstance(body.get("messages"), list):
            stream = tokenizer.chat_stream(m for m in body["messages"] if isinstance(m, dict))
        elif isinstance(body.get("prompt"), str):
            stream = tokenizer.text_stream(body["prompt"])
        else:  # neither form of vLLM's TokenizeRequest union validates
            raise validation_error(_tokenize_errors(body))
    except ApiError as exc:
        return json_response(exc.body(rt.cfg.profile), exc.status)
    ids = tokenizer.in_vocab(tokenizer.token_ids(stream), rt.cfg.vocab_size)
    out = {
        "count": len(ids),
        "max_model_len": rt.cfg.max_model_len,
        "tokens": ids,
        "token_strs": None,
    }
    return json_response(orjson.dumps(out))


def _tokenize_errors(body: dict[str, Any]) -> list[dict[str, Any] | str]:
    """pydantic's errors for a body that is neither a completion nor a chat
    TokenizeRequest: one per field of each form."""
    errors: list[dict[str, Any] | str] = []
    for key, kind, what in (("prompt", "string_type", "string"), ("messages", "list_type", "list")):
        if key in body:
            errors.append(
                field_error(kind, f"body.{key}", f"Input should be a valid {what}", body[key])
            )
        else:
            errors.append(field_error("missing", f"body.{key}", "Field required", body))
    return errors


async def detokenize(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    try:
        body = parse_json_body(await request.read(), request.headers.get("Content-Type"))
        _check_model(rt, body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and t >= 0 for t in tokens):
            raise ApiError(400, "tokens must be a list of non-negative integers", "Bad Request")
    except ApiError as exc:
        return json_response(exc.body(rt.cfg.profile), exc.status)
    return json_response(orjson.dumps({"prompt": tokenizer.detokenize(tokens)}))


# -- dev mode -----------------------------------------------------------------------------


async def server_info(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    cfg = rt.cfg
    conf: Any = rt.log.config_text()
    if request.query.get("config_format") == "json":
        conf = {k: str(v) for k, v in _config_items(cfg)}
    system_env = {
        "torch_version": "2.10.0",
        "is_debug_build": "False",
        "cuda_runtime_version": None if cfg.platform == "rocm" else "13.0.88",
        "hip_runtime_version": "7.0.51831" if cfg.platform == "rocm" else None,
        "gpu_models_and_configuration": "AMD Instinct MI355X"
        if cfg.platform == "rocm"
        else "NVIDIA B300",
        "os": platform.platform(),
        "python_version": sys.version.split()[0],
        "vllm_version": cfg.vllm_version,
        "emulated": True,
    }
    body = {"vllm_config": conf, "vllm_env": dict(cfg.env), "system_env": system_env}
    return json_response(orjson.dumps(body))


def _config_items(cfg: EmulatorConfig) -> list[tuple[str, object]]:
    keep = (
        "model",
        "served_model_names",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "block_size",
        "num_gpu_blocks",
        "enable_prefix_caching",
        "tensor_parallel_size",
        "kv_cache_dtype",
        "gpu_memory_utilization",
        "seed",
    )
    return [(k, getattr(cfg, k)) for k in keep]


async def reset_prefix_cache(request: web.Request) -> web.Response:
    ok = request.app[RUNTIME].engine.reset_prefix_cache()
    return json_response(orjson.dumps({"success": ok}))


async def empty_ok(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def is_sleeping(request: web.Request) -> web.Response:
    return json_response(b'{"is_sleeping":false}')


async def sleep(request: web.Request) -> web.Response:
    level = int(request.query.get("level", "1"))
    return json_response(orjson.dumps({"status": "sleeping", "level": level}))


async def wake_up(request: web.Request) -> web.Response:
    return json_response(b'{"status":"awake","tags":null}')


# -- factory ------------------------------------------------------------------------------


def create_app(cfg: EmulatorConfig, runtime: Runtime | None = None) -> web.Application:
    """The emulator as an aiohttp app. Without ``runtime`` faults that would
    end the process are only recorded (``runtime.exited``/``killed``).

    Usage::

        app = create_app(EmulatorConfig(speed=0))
        # aiohttp.test_utils.TestServer(app) or web.AppRunner(app)
    """
    rt = runtime if runtime is not None else Runtime(cfg)
    app = web.Application(middlewares=[_stalled, _instrument, _gate], client_max_size=MAX_BODY)
    app[RUNTIME] = rt
    r = app.router
    r.add_get("/health", health, allow_head=False)
    r.add_get("/ping", health, allow_head=False)
    r.add_post("/ping", health)
    r.add_get("/version", version, allow_head=False)
    r.add_get("/load", load, allow_head=False)
    r.add_get("/metrics", metrics, allow_head=False)
    r.add_get("/v1/models", models, allow_head=False)
    r.add_post("/tokenize", tokenize)
    r.add_post("/detokenize", detokenize)
    r.add_post("/v1/chat/completions", chat_completions)
    r.add_post("/v1/completions", completions)
    r.add_post("/v1/messages", anthropic.messages)
    r.add_post("/v1/messages/count_tokens", anthropic.count_tokens)
    r.add_post("/v1/responses", responses.create)
    r.add_get("/v1/responses/{response_id}", responses.retrieve, allow_head=False)
    r.add_post("/v1/responses/{response_id}/cancel", responses.cancel)
    app[responses.STORE] = responses.ResponseStore()
    if cfg.enable_fault_tolerance:
        r.add_get("/fault_tolerance/status", fault_tolerance_status, allow_head=False)
    if cfg.dev_mode:
        r.add_get("/server_info", server_info, allow_head=False)
        r.add_post("/reset_prefix_cache", reset_prefix_cache)
        r.add_post("/reset_mm_cache", empty_ok)
        r.add_post("/reset_encoder_cache", empty_ok)
        r.add_post("/sleep", sleep)
        r.add_post("/wake_up", wake_up)
        r.add_get("/is_sleeping", is_sleeping, allow_head=False)
    app.on_response_prepare.append(_headers)
    rt.paths = frozenset(p for p, _ in routes(app))

    async def _start(_: web.Application) -> None:
        await rt.start()

    async def _stop(_: web.Application) -> None:
        await rt.stop()

    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    return app


def routes(app: web.Application) -> list[tuple[str, str]]:
    """``(path, "GET, POST")`` pairs, for the ready log."""
    by_path: dict[str, list[str]] = {}
    for route in app.router.routes():
        info = route.resource.canonical if route.resource is not None else "?"
        by_path.setdefault(info, []).append(route.method)
    return [(p, ", ".join(sorted(m))) for p, m in by_path.items()]
