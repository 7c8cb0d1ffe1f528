"""``POST /v1/chat/completions`` and ``POST /v1/completions``.

A request is validated (:mod:`.parsing`), handed to the engine, then either
streamed as SSE - one chunk per engine output, several tokens merged when the
client reads slower than the engine produces, as vLLM's output collector
merges them - or answered as one JSON body. Engine death, per-request errors
and cuts arrive through the same output channel and are rendered per VLLM.md
§2.2-2.3. A client that disconnects aborts its request
(``finished_reason="abort"``).

Every request is logged to the request log exactly once: by the engine when
it is admitted, or here when it is rejected.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import orjson
from aiohttp import web

from replayer.emulator import tokenizer
from replayer.emulator.metrics import spec_decode_object
from replayer.emulator.parsing import (
    ApiError,
    Generation,
    check_limits,
    check_tools,
    fast_token_prompt,
    out_of_vocabulary,
    parse_generation,
    parse_json_body,
)
from replayer.emulator.request import DEAD, Output, Request
from replayer.emulator.runtime import Runtime
from replayer.emulator.wire import (
    DONE,
    INTERNAL_MESSAGE,
    JSON_CONTENT_TYPE,
    SSE_CONTENT_TYPE,
    StreamShape,
    chat_body,
    completion_body,
    dead_body,
    error_body,
    error_event,
    filler,
    stream_error,
)

RUNTIME: web.AppKey[Runtime] = web.AppKey("runtime", Runtime)
T = TypeVar("T")
SESSION_HEADERS = ("X-Session-Id", "X-Session-Affinity", "X-Correlation-ID")
GENERATION_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
)


def json_response(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type=JSON_CONTENT_TYPE)


def session_of(headers: Any) -> str | None:
    for h in SESSION_HEADERS:
        v = headers.get(h)
        if v:
            return str(v)
    return None


def _body_fields(raw: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {"body_bytes": len(raw), "body_sha256": hashlib.sha256(raw).hexdigest()}
    try:
        out["body"] = orjson.loads(raw)
    except orjson.JSONDecodeError:
        out["body_text"] = raw.decode(errors="replace")
    return out


async def log_rejected(request: web.Request, rt: Runtime, status: int, error: str) -> None:
    """Log a generation request turned away before parsing (401)."""
    fields: dict[str, Any] = {
        "seq": rt.next_seq(),
        "request_id": request.headers.get("X-Request-Id"),
        "path": request.path,
    }
    if rt.cfg.log_bodies:
        fields.update(_body_fields(await request.read()))
    rt.reqlog.write("request", **fields, n=None, status=status, error=error)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def intake(request: web.Request, rt: Runtime) -> tuple[bytes, dict[str, Any]]:
    """The body and the request-log fields every generation request starts with."""
    raw = await request.read()
    xrid = request.headers.get("X-Request-Id")
    fields: dict[str, Any] = {"seq": rt.next_seq(), "request_id": xrid, "path": request.path}
    peer = request.transport.get_extra_info("peername") if request.transport else None
    fields["peer_port"] = peer[1] if peer else None  # which client connection (reuse)
    if rt.cfg.log_bodies:
        fields.update(_body_fields(raw))
    return raw, fields


async def serve(
    request: web.Request,
    rt: Runtime,
    g: Generation,
    n_out: int,
    reason: str,
    engine_id: str,
    fields: dict[str, Any],
    answer: Callable[[Request], Awaitable[T]],
) -> T:
    """Hand a validated request to the engine (logged there, faults evaluated)
    and ``answer`` it (stream or body: each API renders its own). Shared by
    every generation route so that ``rt.inflight`` counts it alike and a
    request the answer left unfinished (the client went away) is aborted."""
    cfg = rt.cfg
    hashes = (
        tokenizer.block_hashes(g.stream_bytes, cfg.block_size) if cfg.enable_prefix_caching else []
    )
    req = rt.engine.add(
        engine_id=engine_id,
        prompt_len=g.prompt_len,
        hashes=hashes,
        max_tokens=n_out,
        length_reason=reason,
        params_max_tokens=g.requested_max_tokens or n_out,
        session=session_of(request.headers),
        log_fields=fields,
    )
    rt.inflight += 1
    try:
        return await answer(req)
    finally:
        rt.inflight -= 1
        if req.error is None and req.finish is None:
            rt.engine.abort(req)


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    cfg = rt.cfg
    raw, fields = await intake(request, rt)
    xrid = fields["request_id"]
    try:
        ctype = request.headers.get("Content-Type")
        fast = None if chat else fast_token_prompt(raw, ctype)
        g = None
        if fast is not None:
            with contextlib.suppress(ApiError):  # its errors quote the body: parse it whole
                g = parse_generation(fast[0], chat, cfg, fast[1])
        if g is None:
            body = parse_json_body(raw, ctype)
            fields["model"] = body.get("model") if isinstance(body.get("model"), str) else None
            fields["stream"] = bool(body.get("stream"))
            g = parse_generation(body, chat, cfg)
        fields["model"], fields["stream"] = g.model, g.stream
        if g.model not in cfg.served_model_names:
            names = ", ".join(cfg.served_model_names)
            tail = f" Valid aliases: {names}." if cfg.modern else ""
            raise ApiError(
                404, f"The model `{g.model}` does not exist.{tail}", "NotFoundError", "model"
            )
        if rt.engine.dead:
            rt.reqlog.write("request", **fields, n=None, status=500, error="engine dead")
            rt.dead_engine_hit()
            return json_response(dead_body(cfg.profile), 500)
        check_tools(g, cfg)
        n_out, reason = check_limits(g, cfg)
        if g.out_of_vocab is not None and not g.stream:
            raise out_of_vocabulary(g.out_of_vocab)
    except ApiError as exc:
        rt.reqlog.write("request", **fields, n=None, status=exc.status, error=exc.message)
        return json_response(exc.body(cfg.profile), exc.status)
    if g.out_of_vocab is not None:
        # vLLM's input processor rejects it inside the stream generator: 200 + event.
        rej = out_of_vocabulary(g.out_of_vocab)
        rt.reqlog.write("request", **fields, n=None, status=200, error=rej.message)
        event = stream_error(cfg.profile, g.chat, rej.message, rej.type, rej.param, rej.status)
        resp = web.StreamResponse(headers={"Content-Type": SSE_CONTENT_TYPE})
        with contextlib.suppress(ConnectionError):  # the client went away
            await resp.prepare(request)
            await resp.write(event + DONE)
            await resp.write_eof()
        return resp

    base = f"{'chatcmpl' if chat else 'cmpl'}-{xrid if xrid else rt.hex(16)}"
    reply = partial(_stream if g.stream else _unary, request, rt, g, base=base)
    return await serve(request, rt, g, n_out, reason, f"{base}-{rt.hex(8)}", fields, reply)


def cut_connection(request: web.Request) -> None:
    """Drop the connection: what was written is flushed, the body never ends."""
    if request.transport is not None:
        request.transport.close()


async def last_output(
    request: web.Request, req: Request, failed: Callable[[str], web.Response]
) -> str | web.Response:
    """What a JSON body waits for: the request's finish reason, or the
    response that replaces the body (``failed(kind)`` when the engine died or
    failed; an empty one, never sent, when a cut fault dropped the connection)."""
    while True:
        out = await req.next()
        if out.error is not None:
            return failed(out.error)
        if out.cut:
            cut_connection(request)
            return json_response(b"", 500)  # never reaches the wire
        if out.finish is not None:
            return out.finish


def failed(rt: Runtime, kind: str) -> web.Response:
    """The JSON 500 of an OpenAI-shaped request whose engine died (``kind``
    ``DEAD``, which also counts toward the server's exit) or failed."""
    profile = rt.cfg.profile
    if kind == DEAD:
        rt.dead_engine_hit()
        return json_response(dead_body(profile), 500)
    msg = error_body(profile, INTERNAL_MESSAGE, "InternalServerError", None, 500)
    return json_response(msg, 500)


async def _unary(
    request: web.Request, rt: Runtime, g: Generation, req: Request, base: str
) -> web.StreamResponse:
    cfg = rt.cfg
    finish = await last_output(request, req, partial(failed, rt))
    if isinstance(finish, web.Response):
        return finish
    cached = req.num_cached if cfg.enable_prompt_tokens_details else None
    args = (
        base,
        int(time.time()),
        g.model,
        filler(req.text_seed, 0, req.num_output),
        finish,
        cfg.system_fingerprint,
        req.prompt_len,
        req.num_output,
        cached,
    )
    if g.chat:
        if g.tool_choice == "auto":
            rt.metrics.tool_parser(streaming=False)
        body = chat_body(
            *args,
            created_cache(rt, g, req),
            weight_versions=cfg.profile == "0.33",
            spec=spec_metrics(rt, req),
        )
        return json_response(body)
    return json_response(completion_body(*args, modern=cfg.modern, spec=spec_metrics(rt, req)))


def spec_metrics(rt: Runtime, req: Request) -> dict[str, Any] | None:
    """The request's ``metrics.speculative_decoding``, when the emulator was
    launched with both ``--speculative-config`` and
    ``--per-request-spec-decode-metrics summary|detailed`` (as vLLM 0.32)."""
    level = rt.cfg.per_request_spec_decode_metrics
    spec = rt.metrics.spec_decode
    if level == "none" or spec is None:
        return None
    return spec_decode_object(req.spec_steps or [], spec.k, detailed=level == "detailed")


def created_cache(rt: Runtime, g: Generation, req: Request) -> int | None:
    """``created_cache_tokens`` (vLLM 0.32, chat only, with prompt-token details):
    the full prompt blocks this request wrote to the prefix cache."""
    cfg = rt.cfg
    if not (g.chat and cfg.profile == "0.32" and cfg.enable_prompt_tokens_details):
        return None
    if not cfg.enable_prefix_caching:
        return 0
    full = req.prompt_len // cfg.block_size * cfg.block_size
    return max(0, full - req.num_cached)


async def _stream(
    request: web.Request, rt: Runtime, g: Generation, req: Request, base: str
) -> web.StreamResponse:
    cfg = rt.cfg
    shape = StreamShape(
        chat=g.chat,
        id=base,
        created=int(time.time()),
        model=g.model,
        fingerprint=cfg.system_fingerprint,
        include_usage=g.include_usage,
        continuous=g.continuous_usage,
        prompt_tokens=req.prompt_len,
        cached=req.num_cached if cfg.enable_prompt_tokens_details else None,
        created_cache=created_cache(rt, g, req),
        tail_fields=cfg.profile == "0.33",
    )
    resp, _ = await sse(request, partial(_pump, request, rt, g, req, shape))
    return resp


async def sse(
    request: web.Request, pump: Callable[[web.StreamResponse], Awaitable[T]]
) -> tuple[web.StreamResponse, T | None]:
    """An SSE response that ``pump`` writes, and what ``pump`` returned: None
    when the client went away (``serve`` then aborts the request)."""
    resp = web.StreamResponse(headers={"Content-Type": SSE_CONTENT_TYPE})
    try:
        await resp.prepare(request)
        return resp, await pump(resp)
    except ConnectionError:
        return resp, None


async def _pump(
    request: web.Request,
    rt: Runtime,
    g: Generation,
    req: Request,
    shape: StreamShape,
    resp: web.StreamResponse,
) -> None:
    cfg = rt.cfg
    role_sent = not g.chat

    def render(out: Output) -> list[bytes]:
        nonlocal role_sent
        if out.error is not None:
            if out.error == DEAD:
                rt.log.stream_error(g.chat)
            return [error_event(cfg.profile, g.chat, out.error) + DONE]
        parts: list[bytes] = []
        if out.tokens:
            if not role_sent:
                parts.append(shape.role())
                role_sent = True
            text = filler(req.text_seed, out.start, out.tokens)
            parts.append(shape.delta(text, out.start + out.tokens, out.finish))
            if g.tool_choice == "auto":
                rt.metrics.tool_parser(streaming=True)
        if out.finish is not None and not out.cut:
            if shape.include_usage:
                parts.append(shape.usage(req.num_output, spec_metrics(rt, req)))
            parts.append(DONE)
        return parts

    await write_outputs(request, req, resp, render)


async def write_outputs(
    request: web.Request,
    req: Request,
    resp: web.StreamResponse,
    render: Callable[[Output], list[bytes]],
) -> None:
    """An SSE body: each engine output as ``render`` frames it (shared by the
    APIs whose stream ends cleanly on an error). An error's frames are the
    last before the end, a cut drops the connection after its frames."""
    while True:
        out = await req.next()
        parts = render(out)
        if parts:
            await resp.write(b"".join(parts))
        if out.error is None and out.cut:
            cut_connection(request)
            return
        if out.error is not None or out.finish is not None:
            break
    await resp.write_eof()
