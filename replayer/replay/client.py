"""Talking to one OpenAI-compatible target: pre-flight, and the real
:class:`~replayer.replay.transport.Transport`.

Requests go out through :mod:`replayer.replay.http1` (the hot path: why
there); pre-flight through aiohttp. A request's record is filled in place,
whatever happens: an exception of the transport becomes a status and an
error class, never an escape.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from replayer._http import out_of_fds
from replayer.monitor.classify import is_engine_death_message
from replayer.options.server import Endpoint as Endpoint
from replayer.replay import http1
from replayer.replay.results import Result, Status
from replayer.replay.transport import Request, Transport
from replayer.wire import Api, SSEDecoder, accumulator, api_for_path, error_message


class TargetUnreachable(Exception):
    """The target did not answer before the first request (exit code 3)."""


@dataclass
class TargetFacts:
    """What the target says about itself before the replay."""

    models: list[str]
    max_model_len: int | None
    raw: dict[str, Any]


async def preflight(session: aiohttp.ClientSession, target: Endpoint) -> TargetFacts:
    """``GET /v1/models``, retried briefly: a refused connection here is an
    infrastructure problem, not a crash of the replay."""
    url = target.url.rstrip("/") + "/v1/models"
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(3),
            wait=wait_exponential(multiplier=0.2, max=1.0),
            retry=retry_if_exception_type((aiohttp.ClientConnectionError, TimeoutError)),
            reraise=True,
        ):
            with attempt:
                async with session.get(
                    url, headers=target.headers(), timeout=aiohttp.ClientTimeout(total=10)
                ) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise TargetUnreachable(
                            f"target {target.name} at {target.url}: GET /v1/models answered "
                            f"{resp.status}: {body[:200].decode(errors='replace')}"
                        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise TargetUnreachable(
            f"target {target.name} unreachable at {target.url}: {_describe(exc)}"
        ) from None
    try:
        raw = orjson.loads(body)
        data = raw.get("data") or []
        models = [m["id"] for m in data if isinstance(m, dict) and "id" in m]
        lens = [m.get("max_model_len") for m in data if isinstance(m, dict)]
        mml = next((int(x) for x in lens if isinstance(x, int)), None)
    except (orjson.JSONDecodeError, AttributeError, TypeError, KeyError):
        raise TargetUnreachable(
            f"target {target.name} at {target.url}: /v1/models is not an OpenAI model list"
        ) from None
    return TargetFacts(models=models, max_model_len=mml, raw=raw)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror if exc.os_error else exc})"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class HTTPTransport(Transport):
    """The real wire: keep-alive HTTP/1.1 connections of one
    :class:`~replayer.replay.http1.Pool` (one per target by default, so a
    target's connection count is its own)."""

    def __init__(self, pool: http1.Pool | None = None) -> None:
        self.pool = pool if pool is not None else http1.Pool()

    async def handle(self, request: Request) -> None:
        """Send one request and fill its result (times relative to ``t0``).

        The response is read by the accumulator of the API ``url`` names
        (chat completions for a path it does not know) into ``stats``; a
        stream's events are read on the loop callback that received them,
        stamped with that moment."""
        url, body, result, stats = request.url, request.body, request.result, request.stats
        sent, answered, go, t0 = request.sent, request.answered, request.go, request.t0
        pool = self.pool
        loop = asyncio.get_running_loop()
        if request.keep_text:
            stats.keep_text = True
        acc = accumulator(api_for_path(url) or Api.CHAT, stats)
        dec = SSEDecoder()
        abort = request.abort
        cut = abort.after_chunks if abort is not None else None

        def sink(chunk: bytes, now: float) -> None:
            for ev in dec.feed(chunk):
                acc.event(ev, now)
                if cut is not None and stats.events >= cut and not (stats.error or stats.done):
                    # the rest of this read is what the recorded client never saw
                    raise http1.ClientAbort(f"after {stats.events} streamed event(s)")

        def us(t: float) -> int:
            return round((t - t0) * 1e6)

        target = http1.split(url)
        head = http1.request_head(target, request.headers, len(body))
        conn: http1.Conn | None = None
        reuse = refused = False
        timer: asyncio.TimerHandle | None = None
        try:
            async with asyncio.timeout(request.timeout):
                conn = await pool.connect(target.origin)
                await pool.gate.clear(len(head) + len(body))
                if go is not None and not await go():
                    refused = reuse = True
                else:
                    resp = conn.request(head, body, sink)
                    if abort is not None and cut is None and abort.after_us is not None:
                        timer = loop.call_later(
                            abort.after_us / 1e6,
                            conn.abort,
                            http1.ClientAbort(f"after {abort.after_us / 1e6:g} s"),
                        )
                    if sent is not None and not sent.done():
                        sent.set_result(None)
                    await resp.head
                    if not resp.headers_in:
                        raise resp.error or http1.Disconnected("no response")
                    result.first_byte_us = us(resp.head_at)
                    if answered is not None and not answered.done():
                        answered.set_result(None)
                    result.http_status = resp.status
                    await resp.done
                    if resp.error is not None:
                        raise resp.error
                    reuse = resp.keep_alive
                    payload = b"".join(resp.body)  # empty when streamed to the sink
                    if resp.status != 200:
                        result.status = Status.HTTP_ERROR
                        result.error_class = f"http_{resp.status}"
                        result.error = error_message(payload)
                    elif not resp.streamed and not acc.body(payload):
                        result.status = Status.HTTP_ERROR
                        result.error_class = "bad_body"
                        result.error = payload[:500].decode(errors="replace")
                    elif stats.error is not None:  # an error event, or an error object in a 200
                        result.status = Status.HTTP_ERROR
                        result.error = stats.error[:2000]
                        result.error_class = stream_error_class(stats.error_code, result.error)
                    elif resp.streamed and not stats.done:
                        result.status = Status.TRANSPORT_ERROR
                        result.error_class = "stream_cut"
                        result.error = "stream ended without [DONE]"
                    else:
                        result.status = Status.OK
        except TimeoutError:
            result.status = Status.TIMEOUT
            result.error_class = "timeout"
            result.error = f"no complete response within {request.timeout:g} s"
        except http1.ConnectError as exc:
            result.status = Status.TRANSPORT_ERROR
            own = out_of_fds(exc.os_error)  # the replayer's own limit, not the target's crash
            result.error_class = "client_resources" if own else "connect"
            result.error = f"cannot connect ({exc})" + (
                " (replayer out of file descriptors)" if own else ""
            )
        except http1.Disconnected as exc:
            result.status = Status.TRANSPORT_ERROR
            result.error_class = "disconnected"
            result.error = str(exc)
        except http1.StreamCut as exc:
            result.status = Status.TRANSPORT_ERROR
            result.error_class = "stream_cut"
            result.error = str(exc)
        except http1.BadResponse as exc:
            result.status = Status.TRANSPORT_ERROR
            result.error_class = "client"
            result.error = str(exc)
        except http1.ClientAbort as exc:
            result.status = Status.ABORTED
            result.error = f"disconnected on purpose {exc}, as the recorded client did"
        finally:
            if timer is not None:
                timer.cancel()
            if conn is not None:
                if reuse:
                    pool.release(conn)
                else:
                    conn.close()
        request.release()
        if refused:
            return
        result.done_us = us(loop.time())
        if stats.first_token is not None:
            result.first_token_us = us(stats.first_token)
        result.chunks = stats.chunks
        if stats.chunks > 1:
            result.itl_mean_us = round(stats.gap_sum / (stats.chunks - 1) * 1e6)
            result.itl_max_us = round(stats.gap_max * 1e6)
        result.prompt_tokens = stats.prompt_tokens
        result.completion_tokens = stats.completion_tokens
        result.cached_tokens = stats.cached_tokens
        result.spec_drafts = stats.spec_drafts
        result.spec_draft_tokens = stats.spec_draft_tokens
        result.spec_accepted_tokens = stats.spec_accepted_tokens
        result.finish_reason = stats.finish_reason
        result.output_hash = stats.output_hash if result.status is Status.OK else None
        if request.keep_text:
            result.output_text = stats.text or ""

    async def preopen(self, url: str, n: int) -> int:
        return await self.pool.preopen(http1.split(url).origin, n)

    @property
    def opened(self) -> int:
        return self.pool.opened

    def close(self) -> None:
        self.pool.close()


def stream_error_class(code: Any, message: str) -> str:
    """``stream_error`` (the server failed), or ``stream_4xx`` for a client
    error vLLM reports inside a 200 stream (an out-of-vocabulary token id, a
    bad parameter found after the headers went out: ../shared/REAL-VLLM.md
    D1), given the error's ``code`` and message. An engine-death message
    wins whatever its code: older vLLM sent those as 400."""
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if isinstance(code, int) and 400 <= code < 500 and not is_engine_death_message(message):
        return f"stream_{code}"
    return "stream_error"


def is_client_error(r: Result) -> bool:
    """The request was rejected as the client's fault (a 4xx status, or a 4xx
    error event inside a 200 stream): recorded, never a crash."""
    if r.status is not Status.HTTP_ERROR:
        return False
    if r.http_status is not None and 400 <= r.http_status < 500:
        return True
    return (r.error_class or "").startswith("stream_4")


def is_target_failure(r: Result) -> bool:
    """Server-side failures stop a replay; a 4xx is the client's doing."""
    if r.status in (Status.TRANSPORT_ERROR, Status.TIMEOUT):
        return r.error_class != "client_resources"
    if r.status is Status.HTTP_ERROR:
        return r.error_class == "stream_error" or (r.http_status or 0) >= 500
    return False
