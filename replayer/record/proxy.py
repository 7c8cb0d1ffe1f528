"""The recording proxy: a transparent aiohttp reverse proxy in front of a vLLM server.

Transparency comes first: every method and path is forwarded; the response's
status, reason, headers and body come back unchanged, each read relayed the
moment it arrives (SSE cadence is the upstream's), except for the
hop-by-hop headers of RFC 9110 §7.6.1 (``Connection`` and those it names,
``Keep-Alive``, ``Proxy-*``, ``TE``, ``Trailer``, ``Transfer-Encoding``,
``Upgrade``). Framing is redone per hop: a ``Content-Length`` body stays one,
a chunked one is re-chunked. Request bodies of unrecorded paths are streamed
upstream as they arrive (hundreds of MB pass through in constant memory);
only the recorded endpoints' bodies are held whole, because they are stored.

One ``aiohttp.ClientSession`` serves all traffic: a large connection pool,
no automatic decompression either way (compressed bodies pass as they are),
no cookie jar, no redirects followed, no auto-added headers, and no timeout
but the connect timeout: a long prefill can be minutes of silence before the first
byte. When the client goes away, the upstream request is closed too, as it
would be without the proxy (vLLM aborts the request). When the upstream
breaks off mid-response, the client's connection is cut the same way.

If the upstream cannot be reached, the client gets a 502 whose body is an
OpenAI error envelope naming the upstream, and the exchange is recorded
with that error. WebSocket upgrades and CONNECT are not supported (vLLM
serves neither).

Abusive clients are bounded (:mod:`replayer._http`): a request head must
arrive whole, and a stalled body resume, within ``$REPLAYER_CLIENT_TIMEOUT``
(60 s) or the connection is cut; a head past 64 KiB a line or 128 lines gets
400; a declared body past :data:`MAX_BODY` gets 413 unread; the open-files
limit is raised to fit the connections.

Recording (:mod:`replayer.record.recorder`) happens beside the relay:
``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/messages`` and
``/v1/responses``. A recorded response's end (its last bytes, or a stream's
end event) is held until the exchange's row is written
(:mod:`replayer.record.sink`): what a client saw complete survives SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from replayer._http import (
    CONNECT_TIMEOUT_S,
    MAX_HEADERS,
    SERVER_LOG,
    ClientDeadline,
    client_timeout,
    pooled_connector,
    raise_fd_limit,
    streaming_timeout,
)
from replayer.options.record import DEFAULT_SESSION_HEADERS
from replayer.options.record import parse_listen as parse_listen
from replayer.record.capture import Capture
from replayer.record.recorder import (
    RECORDED_PATHS,
    Exchange,
    Recorder,
)
from replayer.record.redact import MASK, Redactor
from replayer.record.sink import TraceSink
from replayer.wire import Api, api_for_path, is_event_stream

log = logging.getLogger("replayer.record")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Added per hop by aiohttp or meaningless past this hop.
_REQUEST_DROP = frozenset({"host", "expect"})
_STREAMED_SKIP = HOP_BY_HOP | _REQUEST_DROP
_HELD_SKIP = _STREAMED_SKIP | {"content-length"}
_MAX_HEADER = 1 << 16
_SLICE = 1 << 20
MAX_BODY = 256 << 20
"""Largest request body the recorder takes (413 past it). A recorded body is
held whole (it is stored); 256 MiB is ~50 million tokens of JSON, far past any
model's context, yet one such client cannot exhaust the recorder's memory."""


@dataclass(frozen=True)
class RecordConfig:
    """Everything ``replayer record`` is told."""

    upstream: str
    """Base URL of the server (``http://host:8000``; a path prefix is kept)."""
    output: Path
    """The trace file (already claimed: see :func:`replayer.record.segments.claim`)."""
    host: str = "127.0.0.1"
    port: int = 8001
    flush_interval: float = 1.0
    """Unused: kept so old callers still build. Rows are written per exchange,
    before its response's end is relayed (:mod:`replayer.record.sink`)."""
    session_headers: tuple[str, ...] = DEFAULT_SESSION_HEADERS
    drop_headers: tuple[str, ...] = ()
    redact: tuple[str, ...] = ()
    fsync: bool = False
    hold_limit: float = 10.0
    """Longest a response's end waits for its row to be written (a stalled disk):
    past it, traffic goes on unheld until the writer catches up."""
    drain: float = 5.0
    """Seconds in-flight exchanges get to finish at shutdown."""
    max_connections: int = 4096
    connect_timeout: float = CONNECT_TIMEOUT_S
    max_body: int = MAX_BODY
    """Largest request body accepted (a declared larger one gets 413 unread)."""
    client_timeout: float | None = None
    """Seconds a client may keep the recorder waiting for a request head or
    more of a body (:class:`replayer._http.ClientDeadline`); None:
    ``$REPLAYER_CLIENT_TIMEOUT``, else 60 s."""
    add_request_id: bool = False
    """Send the recorded request id upstream as ``X-Request-Id`` when the client sent none."""
    id_prefix: str = "rec-"
    record_count_tokens: bool = False
    """Record ``/v1/messages/count_tokens`` too (forwarded either way)."""
    details: dict[str, Any] = field(default_factory=dict)
    """Extra provenance (segment number …)."""


def safe_url(url: str) -> str:
    """A URL without user info, query or fragment: what may be stored and logged."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def hop_by_hop(headers: Any) -> set[str]:
    """Lower-case names not to forward: the fixed set plus those ``Connection`` names."""
    names = set(HOP_BY_HOP)
    for value in headers.getall("Connection", ()):
        names.update(t.strip().lower() for t in value.split(",") if t.strip())
    return names


def _without(headers: Any, skip: frozenset[str]) -> CIMultiDict[str]:
    """A copy of ``headers`` less ``skip``, hop-by-hop headers and those ``Connection`` names.

    The per-request path: without a ``Connection`` header (HTTP/1.1 clients
    rarely send one) the skip set is fixed and nothing is rebuilt."""
    if "Connection" in headers:
        skip = skip | hop_by_hop(headers)
    return CIMultiDict([(k, v) for k, v in headers.items() if k.lower() not in skip])


def error_envelope(message: str, type_: str = "BadGateway", code: int = 502) -> bytes:
    """An OpenAI/vLLM error body (VLLM.md §4.1)."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


@dataclass(frozen=True, slots=True)
class RecorderStats:
    """A recording's counters at one instant: what live metrics read."""

    recorded: int
    """Exchanges handed to the trace writer (ok and failed)."""
    failed: int
    forwarded: int
    """Requests forwarded upstream, recorded or not."""
    inflight: int
    rows_written: int
    rows_flushed: int
    """Of those, rows in a flushed batch: on disk, so they survive SIGKILL."""
    write_errors: int
    bytes_on_disk: int
    """The trace segment's size (0 before it exists)."""
    rows_lost: int = 0
    """Exchanges not in the trace because recording stopped."""
    stopped: str | None = None
    """Why recording stopped (disk full: path and free bytes); None while it records."""


class RecordingProxy:
    """The proxy server plus its recorder, in the current event loop.

    **Usage**::

        async with RecordingProxy(RecordConfig(upstream=url, output=path, port=0)) as proxy:
            client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="x")
            ...
        # on exit: in-flight exchanges drained, trace flushed and closed
    """

    def __init__(self, config: RecordConfig) -> None:
        self.config = config
        self._base = config.upstream.rstrip("/")
        self._safe_upstream = safe_url(config.upstream)
        self._runner: web.ServerRunner | None = None
        self._deadline: ClientDeadline | None = None
        self._client: aiohttp.ClientSession | None = None
        self._sink: TraceSink[Exchange] | None = None
        self.recorder: Recorder | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self.stopping = False
        self.forwarded = 0
        """Requests forwarded (recorded or not)."""
        self.address: tuple[str, int] | None = None
        self.on_stop: Callable[[str], None] | None = None
        """Told once, from the writer thread, that recording stopped and why
        (set before :meth:`start`; unset, it is logged)."""

    @property
    def _recorded_paths(self) -> frozenset[str] | set[str]:
        return self.recorder.paths if self.recorder is not None else RECORDED_PATHS

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> Self:
        """Bind, open the trace, start serving. Raises UsageError if the address is taken."""
        from replayer.errors import UsageError
        from replayer.trace.model import TraceMeta
        from replayer.trace.writer import TraceWriter

        cfg = self.config
        wait = cfg.client_timeout if cfg.client_timeout is not None else client_timeout()
        # a proxied exchange holds two descriptors, an idle client one
        if (warning := raise_fd_limit(2 * cfg.max_connections + 1024)) is not None:
            log.warning("record: %s", warning)
        family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
        try:
            sock = socket.create_server((cfg.host, cfg.port), family=family, backlog=1024)
        except OSError as exc:
            raise UsageError(f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror}") from None
        addr = sock.getsockname()
        self.address = (str(addr[0]), int(addr[1]))
        t0_ns = time.monotonic_ns()
        details = {
            "upstream": self._safe_upstream,
            "listen": f"{self.url.removeprefix('http://')}",
            "session_headers": list(cfg.session_headers),
            "durability": "each exchange written before its response's end is relayed",
            "fsync": cfg.fsync,
            "t0_unix_us": time.time_ns() // 1000,
            "redaction": {
                "applied": bool(cfg.redact),
                "patterns": len(cfg.redact),
                "mask": MASK,
                "credentials": "dropped (authorization, api-key, cookie and like headers; "
                "credential query and body fields masked)",
                "dropped_headers": sorted({h.lower() for h in cfg.drop_headers}),
            },
            **cfg.details,
        }
        try:
            writer = TraceWriter(
                cfg.output, TraceMeta(source="record", details=details), fsync=cfg.fsync
            )
        except OSError as exc:
            sock.close()
            raise UsageError(f"cannot write {cfg.output}: {exc}") from None
        recorder = Recorder(
            Redactor(cfg.redact, cfg.drop_headers),
            t0_ns=t0_ns,
            session_headers=cfg.session_headers,
            id_prefix=cfg.id_prefix,
            record_count_tokens=cfg.record_count_tokens,
        )
        self._sink = TraceSink(
            writer, recorder.build, hold_limit=cfg.hold_limit, on_stop=self.on_stop
        )
        recorder.sink = self._sink
        self.recorder = recorder
        self._sink.start()
        self._client = aiohttp.ClientSession(
            # idle upstream connections close before vLLM closes them (IDLE_CLOSE_S):
            # a request written on one the server is closing would fail as a 502
            connector=pooled_connector(cfg.max_connections),
            timeout=streaming_timeout(cfg.connect_timeout),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            trust_env=False,
            max_line_size=_MAX_HEADER,
            max_field_size=_MAX_HEADER,
        )
        server = web.Server(
            _refuse_oversized(self._handle, cfg.max_body),
            handler_cancellation=True,
            auto_decompress=False,  # a compressed request body is forwarded compressed
            access_log=None,
            logger=SERVER_LOG,
            max_line_size=_MAX_HEADER,
            max_field_size=_MAX_HEADER,
            max_headers=MAX_HEADERS,
        )
        self._runner = web.ServerRunner(server, shutdown_timeout=cfg.drain)
        await self._runner.setup()
        self._deadline = ClientDeadline(server, wait).start()
        await web.SockSite(self._runner, sock, backlog=1024).start()
        return self

    @property
    def url(self) -> str:
        if self.address is None:
            raise RuntimeError("proxy not started")
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    @property
    def upstream(self) -> str:
        """The upstream URL as it may be shown (no user info or query)."""
        return self._safe_upstream

    @property
    def inflight(self) -> int:
        return len(self._handlers)

    @property
    def sink(self) -> TraceSink[Exchange]:
        if self._sink is None:
            raise RuntimeError("proxy not started")
        return self._sink

    def stats(self) -> RecorderStats:
        """The counters now; safe from any thread (a scrape), at any time."""
        rec, sink = self.recorder, self._sink
        try:
            size = os.stat(self.config.output).st_size
        except OSError:
            size = 0
        return RecorderStats(
            recorded=rec.recorded if rec is not None else 0,
            failed=rec.failed if rec is not None else 0,
            forwarded=self.forwarded,
            inflight=self.inflight,
            rows_written=sink.rows if sink is not None else 0,
            rows_flushed=sink.flushed if sink is not None else 0,
            write_errors=sink.errors if sink is not None else 0,
            bytes_on_disk=size,
            rows_lost=sink.lost if sink is not None else 0,
            stopped=sink.stopped if sink is not None else None,
        )

    async def stop(self) -> None:
        """Stop listening, give in-flight exchanges ``drain`` s, record the rest as
        abandoned, then flush and close the trace."""
        if self.stopping:
            return
        self.stopping = True
        if self._deadline is not None:
            self._deadline.stop()
        if self._runner is not None:
            await self._runner.cleanup()  # waits up to drain, then cancels handlers
        await self._close_all()

    def hurry(self) -> None:
        """Cut in-flight exchanges now (a second Ctrl-C)."""
        for task in list(self._handlers):
            task.cancel()

    async def _close_all(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._sink is not None:
            await asyncio.to_thread(self._sink.close)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- relaying ----------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        start = time.monotonic_ns()
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        self.forwarded += 1
        try:
            expect = request.headers.get("Expect", "").lower()
            if expect == "100-continue" and request.version == aiohttp.HttpVersion11:
                # the low-level server does not answer it (curl sends it for big bodies)
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                request.writer.output_size = 0
            if request.method == "POST" and request.path in self._recorded_paths:
                return await self._recorded(request, start)
            return await self._plain(request)
        finally:
            if task is not None:
                self._handlers.discard(task)

    def _target(self, request: web.BaseRequest) -> URL:
        raw = request.raw_path
        if not raw.startswith("/"):  # absolute-form request line
            raw = URL(raw).raw_path_qs
        return URL(self._base + raw, encoded=True)

    def _upstream_headers(self, request: web.BaseRequest, *, body_held: bool) -> CIMultiDict[str]:
        # aiohttp sets Content-Length from a held body
        skip = _HELD_SKIP if body_held else _STREAMED_SKIP
        return _without(request.headers, skip)

    def _response_headers(self, resp: aiohttp.ClientResponse) -> CIMultiDict[str]:
        return _without(resp.headers, HOP_BY_HOP)

    def _bad_gateway(self, exc: BaseException) -> web.Response:
        detail = str(exc) or type(exc).__name__
        msg = f"replayer record: upstream {self._safe_upstream} unreachable: {detail}"
        return web.Response(status=502, body=error_envelope(msg), content_type="application/json")

    async def _plain(self, request: web.BaseRequest) -> web.StreamResponse:
        assert self._client is not None
        data = request.content if request.body_exists else None
        try:
            resp = await self._client.request(
                request.method,
                self._target(request),
                headers=self._upstream_headers(request, body_held=False),
                data=data,
                allow_redirects=False,
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return self._bad_gateway(exc)
        try:
            out, _ = await self._relay(request, resp, None, None)
        finally:
            _done_with(resp)
        return out

    async def _recorded(self, request: web.BaseRequest, start: int) -> web.StreamResponse:
        assert self._client is not None and self.recorder is not None
        try:
            raw = await _read_body(request.content, self.config.max_body)
        except _TooLarge as exc:  # a chunked body, no length declared: counted as it came
            return _too_large(exc.size, self.config.max_body)
        body_ns = time.monotonic_ns()
        ex = self.recorder.begin(
            path=request.path,
            raw=raw,
            sha256=hashlib.sha256(raw).hexdigest(),
            start_ns=start,
            body_ns=body_ns,
            headers=request.headers,
            query=request.query.items(),
        )
        headers = self._upstream_headers(request, body_held=True)
        if ex is not None and self.config.add_request_id and ex.client_request_id is None:
            headers["X-Request-Id"] = ex.request_id
        data: Any = raw
        if len(raw) > _SLICE:
            # large: sent in slices, so the loop keeps serving other streams meanwhile
            headers["Content-Length"] = str(len(raw))
            data = _slices(raw)
        try:
            resp = await self._client.request(
                "POST", self._target(request), headers=headers, data=data, allow_redirects=False
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            bad = self._bad_gateway(exc)
            if ex is not None:
                ex.status, ex.failure = 502, "connect"
                ex.error = f"upstream unreachable: {str(exc) or type(exc).__name__}"
                await self._commit(ex, None, 502)
            return bad
        except asyncio.CancelledError:
            if ex is not None:
                self._abandon(ex, None)
            raise
        del raw, data
        cap: Capture | None = None
        if ex is not None:
            ex.upstream_ns = time.monotonic_ns()
            ex.status = resp.status
            cap = Capture(
                api_for_path(ex.path) or Api.COMPLETIONS,
                sse=is_event_stream(resp.headers.get("Content-Type")),
                encoding=resp.headers.get("Content-Encoding"),
            )
        try:
            out, failure = await self._relay(request, resp, ex, cap)
        except asyncio.CancelledError:
            if ex is not None:
                self._abandon(ex, cap)
            raise
        finally:
            _done_with(resp)
        if ex is not None and not ex.queued:  # else committed before the response's end
            ex.end_ns = time.monotonic_ns()
            if failure == "client":
                ex.abandoned = "client"
            elif failure is not None:
                ex.failure, ex.error = "upstream", failure
            self._finish(ex, cap, resp.status)
        return out

    def _abandon(self, ex: Exchange, cap: Capture | None) -> None:
        if ex.queued:  # cancelled while its end waited for the row: recorded already
            return
        ex.end_ns = time.monotonic_ns()
        ex.abandoned = "shutdown" if self.stopping else "client"
        self._finish(ex, cap, ex.status or 0)

    def _finish(self, ex: Exchange, cap: Capture | None, status: int) -> int:
        assert self.recorder is not None
        if cap is not None:
            ex.reply = cap.finish(status)
            ex.first_token_ns = cap.first_token_ns
            ex.response_bytes = cap.bytes
        return self.recorder.finish(ex)

    async def _commit(self, ex: Exchange, cap: Capture | None, status: int) -> None:
        """Record a complete exchange and wait until its row is written: the
        caller relays the response's end only after (group commit, see
        :mod:`replayer.record.sink`), so a client never sees complete an
        exchange a SIGKILL could lose. Bounded: a stopped or stalled writer
        releases at once or after ``hold_limit``."""
        ex.end_ns = time.monotonic_ns()
        held = self.sink.wait(self._finish(ex, cap, status))
        if held is not None:
            await held

    async def _relay(
        self,
        request: web.BaseRequest,
        resp: aiohttp.ClientResponse,
        ex: Exchange | None,
        cap: Capture | None,
    ) -> tuple[web.StreamResponse, str | None]:
        """Stream the upstream response to the client. Returns the response and
        ``None``, ``"client"`` (the client went away) or the upstream's error."""
        recorder = self.recorder
        assert recorder is not None
        content = resp.content
        try:
            chunk = content.read_nowait()  # body bytes that came with the headers
        except (TimeoutError, aiohttp.ClientError, OSError):
            chunk = b""  # readany raises it again below
        out = _Relayed(
            status=resp.status,
            reason=resp.reason,
            headers=self._response_headers(resp),
            coalesce=bool(chunk),
        )
        try:
            await out.prepare(request)
        except (ConnectionError, OSError):
            return out, "client"
        while True:
            if not chunk:
                try:
                    chunk = await content.readany()
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    # the upstream broke off: cut the client the same way (no final chunk)
                    if request.transport is not None:
                        request.transport.abort()
                    return out, f"upstream broke off: {str(exc) or type(exc).__name__}"
                if not chunk:
                    break
            # the body's last bytes go out with its end (one write for a small body)
            eof = content.at_eof()
            if cap is None or ex is None or ex.queued:
                try:
                    await (out.write_eof(chunk) if eof else out.write(chunk))
                except (ConnectionError, OSError):
                    return out, "client"
                if eof:
                    return out, None
                chunk = b""
                continue
            now = time.monotonic_ns()
            if ex.first_byte_ns is None:
                ex.first_byte_ns = now
            # Relay first, parse after: the client never waits for the parsing -
            # except at the response's end (a stream's end event, a whole body's
            # last bytes), whose reply must be known before the client sees it
            # and sends its next turn (or chains to it by previous_response_id).
            last = eof or (cap.sse and cap.may_end(chunk))
            if last:
                cap.feed(chunk, now)
                if not cap.sse:
                    recorder.settle(ex, cap.finish(resp.status), now)
                elif cap.done and ex.settled_ns is None:
                    recorder.settle(ex, cap.reply(), now)
                if eof or cap.done:
                    # the response's end: the client gets it once its row is written
                    await self._commit(ex, cap, resp.status)
            try:
                await (out.write_eof(chunk) if eof else out.write(chunk))
            except (ConnectionError, OSError):
                if not last:
                    cap.feed(chunk, now)
                return out, "client"
            if not last:
                cap.feed(chunk, now)
            ex.delivered = cap.reply().events  # relayed: where a client's abort comes after
            if eof:
                return out, None
            chunk = b""
        if cap is not None and ex is not None and not ex.queued:
            await self._commit(ex, cap, resp.status)  # a body that ended without its end event
        try:
            await out.write_eof()
        except (ConnectionError, OSError):
            return out, "client"
        return out, None


class _Relayed(web.StreamResponse):
    """A relayed response. Its headers go out at once (SSE cadence is the
    upstream's), except when body bytes came with them: then both go in one
    write, as the upstream sent them (a small response costs one send, not two)."""

    def __init__(self, *, coalesce: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # honoured by aiohttp >= 3.12 (header coalescing); older ones send at once
        self._send_headers_immediately = not coalesce


class _TooLarge(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


async def _read_body(content: aiohttp.StreamReader, limit: int) -> bytes:
    """A request body, whole (usually one read: it came with the headers);
    :class:`_TooLarge` once past ``limit`` bytes (a chunked body declares no
    length, so it is counted as it comes)."""
    raw = await content.readany()
    if not raw:
        return raw
    chunks, size = [raw], len(raw)
    while chunk := await content.readany():
        size += len(chunk)
        if size > limit:
            raise _TooLarge(size)
        chunks.append(chunk)
    if size > limit:
        raise _TooLarge(size)
    return raw if len(chunks) == 1 else b"".join(chunks)


async def _slices(raw: bytes) -> AsyncIterator[memoryview]:
    view = memoryview(raw)
    for i in range(0, len(view), _SLICE):
        yield view[i : i + _SLICE]


def _refuse_oversized(
    handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]], limit: int
) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    """``handler`` behind a body limit: a declared ``Content-Length`` past
    ``limit`` gets 413 before a byte of it is read (an ``Expect: 100-continue``
    client never sends it) and is neither forwarded nor recorded."""

    async def limited(request: web.BaseRequest) -> web.StreamResponse:
        size = request.content_length
        if size is None or size <= limit:
            return await handler(request)
        return _too_large(size, limit)

    return limited


def _too_large(size: int, limit: int) -> web.Response:
    """413, the connection closed (the rest of the body is never read)."""
    msg = f"replayer record: request body of {size:,} bytes exceeds the limit of {limit:,}"
    resp = web.Response(
        status=413,
        body=error_envelope(msg, "BadRequestError", 413),
        content_type="application/json",
    )
    resp.force_close()
    return resp


def _done_with(resp: aiohttp.ClientResponse) -> None:
    """Pool the upstream connection if its response was read whole; else close it
    (so the upstream sees the disconnect, as it would without the proxy)."""
    if resp.content.at_eof():
        resp.release()
    else:
        resp.close()


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


def header_names(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(v.strip() for v in values if v.strip())
