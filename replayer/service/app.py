"""The HTTP API of ``replayer serve`` (aiohttp).

Routes (JSON unless said otherwise; every one but ``/healthz`` needs the
token, see :mod:`replayer.service.auth`)::

    GET  /healthz                          {"status": "ok"}            (no auth)
    GET  /metrics                          Prometheus text
    GET  /                                 the jobs page (HTML)
    GET  /api/openapi.json                 this API's OpenAPI 3.1 document (from ROUTES)
    GET  /api/targets                      configured targets and pools (no commands)
    GET  /api/traces                       uploaded and registered traces
    PUT  /api/traces/{name}                upload a trace: the raw body, streamed
    POST /api/traces/register              {"path": "incoming/prod.arrow"}
    GET  /api/jobs[?state=S&kind=K]        {"jobs": [...]}, newest first (unknown S, K: 400)
    POST /api/jobs                         submit: {"kind", "trace"|"bundle"|"job",
                                            "target"|"targets"|"pool", "max_servers",
                                            "control", "options", "label"}
    GET  /api/jobs/{id}                    status, progress, result, links
    POST /api/jobs/{id}/cancel             202
    GET  /api/jobs/{id}/log[?offset=N&follow=1]   text, chunked; follow streams until the end
    GET  /api/jobs/{id}/files              {"files": [{"path", "bytes"}]} under out/
    GET  /api/jobs/{id}/files/{path}       one file under out/
    GET  /api/jobs/{id}/bundle             out/bundle.tar.gz
    GET  /api/jobs/{id}/report             the HTML report

Errors are ``{"error": "one line"}`` with 400 (bad input, refused paths,
launch commands in a body), 401, 404, 409 (a state conflict), 413 (upload
too large) or 500 (a bug: logged, the service carries on). A refused request
changes nothing: validation happens before anything is written.

Served files carry ``X-Content-Type-Options: nosniff`` and a sandboxing
Content-Security-Policy, so an HTML file in a run directory (a report, or a
crafted trace's output) runs, if at all, in an opaque origin that cannot use
the viewer's credentials against this API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import PayloadEncodingError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from replayer._async import spawn
from replayer.service import hooks
from replayer.service.auth import authorized
from replayer.service.config import Targets
from replayer.service.jobs import Job, JobState, JobStore, new_job_id
from replayer.service.metrics import ServiceMetrics
from replayer.service.openapi import Query, Route, document, job_request
from replayer.service.page import CSP, render_jobs
from replayer.service.paths import (
    SAFE_NAME,
    PathRejected,
    confine,
    safe_name,
    suspicious_raw_path,
)
from replayer.service.progress import ProgressReader
from replayer.service.scheduler import Scheduler
from replayer.service.specs import (
    KINDS,
    REFUSED,
    SpecError,
    plan_job,
    redact_argv,
)
from replayer.service.traces import TraceRejected, TraceStore, UploadTooLarge

log = logging.getLogger("replayer.service")


class _BodyTooLarge(Exception):
    """A JSON body past :data:`MAX_JSON_BYTES`: 413, the connection closed."""


JOB_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")
MAX_JSON_BYTES = 1 << 20
DEFAULT_MAX_UPLOAD = 8 << 30
LOG_POLL = 0.25
MAX_OFFSET = (1 << 62) - 1
FILE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "sandbox",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATES = [s.value for s in JobState]
ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", "healthz", "liveness", schema="Health", errors=(), public=True),
    Route("GET", "/metrics", "prometheus", "Prometheus text", media="text/plain", errors=()),
    Route("GET", "/", "page", "the jobs page", media="text/html", errors=()),
    Route("GET", "/api/openapi.json", "openapi", "this document", schema="OpenAPI", errors=()),
    Route(
        "GET",
        "/api/targets",
        "list_targets",
        "configured targets and pools",
        schema="TargetList",
        errors=(),
    ),
    Route(
        "GET",
        "/api/traces",
        "list_traces",
        "uploaded and registered traces",
        schema="TraceList",
        errors=(),
    ),
    Route(
        "POST",
        "/api/traces/register",
        "register_trace",
        "register a trace inside DIR",
        ok=201,
        schema="Trace",
        body="TraceRegister",
        errors=(400, 413),
    ),
    Route(
        "PUT",
        "/api/traces/{name}",
        "upload_trace",
        "upload a trace (the raw body)",
        ok=201,
        schema="Trace",
        body="application/octet-stream",
        errors=(400, 409, 413),
    ),
    Route(
        "GET",
        "/api/jobs",
        "list_jobs",
        "jobs, newest first",
        schema="JobList",
        query=(
            Query("state", {"type": "string", "enum": _STATES}, "only jobs in this state"),
            Query("kind", {"type": "string", "enum": list(KINDS)}, "only jobs of this kind"),
        ),
    ),
    Route(
        "POST",
        "/api/jobs",
        "submit",
        "submit a job",
        ok=201,
        schema="Job",
        body="JobRequest",
        errors=(400, 413),
    ),
    Route(
        "GET",
        "/api/jobs/{id}",
        "job_status",
        "a job's status, progress and result",
        schema="Job",
        errors=(404,),
    ),
    Route(
        "POST",
        "/api/jobs/{id}/cancel",
        "cancel",
        "cancel a job",
        ok=202,
        schema="Job",
        errors=(404, 409),
    ),
    Route(
        "GET",
        "/api/jobs/{id}/log",
        "job_log",
        "a job's log (follow: until it ends)",
        media="text/plain",
        errors=(404,),
        query=(
            Query("offset", {"type": "integer", "minimum": 0}, "start at this byte"),
            Query(
                "follow",
                {"type": "string", "enum": ["0", "1", "true", "false", "yes", "no"]},
                "stream until the job ends",
            ),
        ),
    ),
    Route(
        "GET",
        "/api/jobs/{id}/files",
        "job_files",
        "the files under the job's out/",
        schema="FileList",
        errors=(404,),
    ),
    Route(
        "GET",
        "/api/jobs/{id}/files/{path:.+}",
        "job_file",
        "one file under out/",
        media="application/octet-stream",
        errors=(404,),
    ),
    Route(
        "GET",
        "/api/jobs/{id}/bundle",
        "job_bundle",
        "out/bundle.tar.gz",
        media="application/gzip",
        errors=(404,),
    ),
    Route(
        "GET",
        "/api/jobs/{id}/report",
        "job_report",
        "the HTML report",
        media="text/html",
        errors=(404,),
    ),
)
"""Every route: the router registers these and :mod:`~replayer.service.openapi`
describes them; the auth middleware reads ``public`` from here."""
PUBLIC = {r.handler: r for r in ROUTES}
PATH_PARAMS = {
    "id": {"type": "string", "pattern": JOB_ID.pattern, "description": "a job id"},
    "name": {"type": "string", "pattern": SAFE_NAME.pattern, "description": "a file name"},
    "path": {"type": "string", "description": "a relative path inside the job's out/"},
}


@dataclass
class ServeConfig:
    """Everything ``serve`` was started with."""

    data: Path
    token: str
    targets: Targets
    max_concurrent: int = 1
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD
    cancel_grace: float = 30.0


def _error(status: int, message: str, **headers: str) -> web.Response:
    resp = web.json_response({"error": message}, status=status, headers=headers or None)
    if headers.get("Connection") == "close":
        resp.force_close()  # not kept alive: unread body bytes may follow
    return resp


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


class Service:
    """The application state; :meth:`app` builds the aiohttp application.

    **Usage**::

        svc = Service(ServeConfig(data=Path("/data").resolve(), token=tok, targets=targets))
        web.run_app(svc.app(), host="127.0.0.1", port=9000)
    """

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.data = cfg.data.resolve()
        self.store = JobStore(self.data / "jobs")
        self.traces = TraceStore(self.data)
        self.progress = ProgressReader()
        self.metrics = ServiceMetrics(self.store.by_state)
        self.scheduler = Scheduler(
            self.store,
            max_concurrent=cfg.max_concurrent,
            progress=self.progress,
            cancel_grace=cfg.cancel_grace,
            on_finish=self._finished,
            pools=cfg.targets.pools,
        )
        self._recovery: asyncio.Task[None] | None = None
        self._openapi: bytes | None = None

    def _finished(self, job: Job) -> None:
        self.metrics.transitions.labels(kind=job.kind, state=job.state.value).inc()

    # -- the application ------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=MAX_JSON_BYTES,
            middlewares=[self._measure, self._auth, self._guard],
        )
        for route in ROUTES:
            handler = getattr(self, route.handler)
            if route.method == "GET":  # HEAD too, as aiohttp's add_get does
                app.router.add_get(route.path, handler, name=route.handler)
            else:
                app.router.add_route(route.method, route.path, handler, name=route.handler)
        app.on_startup.append(self._startup)
        app.on_shutdown.append(self._shutdown)
        return app

    async def _startup(self, app: web.Application) -> None:
        # recovery may wait for a dead serve's workers to finish stopping: the
        # API answers meanwhile (those jobs still show as running)
        self._recovery = spawn(self._recover_then_run(), name="serve-recover")

    async def _recover_then_run(self) -> None:
        try:
            await self.scheduler.recover()
        finally:
            self.scheduler.start()
            self.scheduler.kick()

    async def _shutdown(self, app: web.Application) -> None:
        if self._recovery is not None and not self._recovery.done():
            await asyncio.wait([self._recovery], timeout=self.cfg.cancel_grace + 5)
        await self.scheduler.shutdown()

    # -- middlewares ----------------------------------------------------------------

    @web.middleware
    async def _measure(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        t0 = time.perf_counter()
        route = "unmatched"
        info = request.match_info
        if info.route.resource is not None:
            route = info.route.resource.canonical
        status = 500
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            self.metrics.requests.labels(route=route, method=request.method, status=status).inc()
            self.metrics.latency.labels(route=route).observe(time.perf_counter() - t0)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = PUBLIC.get(request.match_info.route.name or "")
        if route is not None and route.public:
            return await handler(request)
        if not authorized(request.headers.get("Authorization"), request.method, self.cfg.token):
            challenge = 'Bearer realm="replayer"'
            if request.method in ("GET", "HEAD"):
                challenge += ', Basic realm="replayer", charset="UTF-8"'
            return _error(
                401,
                "unauthorized: send Authorization: Bearer <token>",
                **{"WWW-Authenticate": challenge},
            )
        return await handler(request)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        why = suspicious_raw_path(request.raw_path)
        if why is not None:
            return _error(400, f"refused: {why}")
        try:
            resp = await handler(request)
        except _BodyTooLarge as exc:
            # unread bytes may follow: the connection cannot be reused
            return _error(413, str(exc), Connection="close")
        except (SpecError, PathRejected, TraceRejected) as exc:
            return _error(400, str(exc))
        except web.HTTPException:
            raise
        except (ConnectionResetError, PayloadEncodingError) as exc:  # the client left mid-body
            log.debug("%s %s: the client went away: %s", request.method, request.path, exc)
            return _error(400, "the request body did not arrive whole")
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, "internal error (logged by the service)")
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        return resp

    # -- helpers --------------------------------------------------------------------

    def _job(self, request: web.Request) -> Job:
        job_id = request.match_info["id"]
        if not JOB_ID.match(job_id):
            raise PathRejected("not a job id")
        job = self.store.jobs.get(job_id)
        if job is None:
            raise web.HTTPNotFound(
                text=orjson.dumps({"error": f"no job {job_id}"}).decode(),
                content_type="application/json",
            )
        return job

    async def _body(self, request: web.Request) -> Any:
        if request.content_type != "application/json":
            raise SpecError("want a JSON body (Content-Type: application/json)")
        too_large = f"the body exceeds {MAX_JSON_BYTES:,} bytes"
        if (request.content_length or 0) > MAX_JSON_BYTES:
            raise _BodyTooLarge(too_large)  # refused before a byte of it is read
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise _BodyTooLarge(too_large) from None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise SpecError(f"not JSON: {exc}") from None

    def _links(self, job: Job) -> dict[str, str]:
        base = f"/api/jobs/{job.id}"
        links = {"self": base, "log": f"{base}/log", "files": f"{base}/files"}
        out = str(self.store.out(job))
        if os.path.isfile(out + "/bundle.tar.gz"):
            links["bundle"] = f"{base}/bundle"
        if os.path.isfile(out + "/report.html") or job.terminal:
            links["report"] = f"{base}/report"
        return links

    def _queue_positions(self) -> dict[str, int]:
        return {j.id: i + 1 for i, j in enumerate(self.scheduler.queued())}

    def _job_json(
        self, job: Job, *, progress: bool = True, positions: dict[str, int] | None = None
    ) -> dict[str, Any]:
        d = job.public()
        d["links"] = self._links(job)
        if progress and job.state is not JobState.QUEUED:
            d["progress"] = self.progress.progress(
                job.kind, self.store.out(job), self.store.log_path(job), slots=job.slots
            )
        if job.state is JobState.QUEUED:
            pos = positions if positions is not None else self._queue_positions()
            d["queue_position"] = pos.get(job.id)
        return d

    # -- routes ---------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def openapi(self, request: web.Request) -> web.Response:
        if self._openapi is None:
            t = self.cfg.targets
            request_schema = job_request(KINDS, REFUSED, t.by_name, t.pools, JOB_ID.pattern)
            doc = document(ROUTES, path_params=PATH_PARAMS, request=request_schema, states=_STATES)
            self._openapi = orjson.dumps(doc)
        return web.Response(body=self._openapi, content_type="application/json")

    async def prometheus(self, request: web.Request) -> web.Response:
        await self._fetch_job_metrics()
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _fetch_job_metrics(self) -> None:
        """The live metrics of each running job (see hooks)."""
        ports = {
            jid: r.metrics_port
            for jid, r in self.scheduler.running.items()
            if r.metrics_port is not None
        }
        texts: dict[str, str] = {}
        if ports:
            import aiohttp

            timeout = aiohttp.ClientTimeout(total=1.0)
            async with aiohttp.ClientSession(timeout=timeout) as s:
                for jid, port in ports.items():
                    try:
                        async with s.get(f"http://127.0.0.1:{port}/metrics") as resp:
                            if resp.status == 200:
                                texts[jid] = await resp.text()
                    except (aiohttp.ClientError, TimeoutError):
                        continue
        self.metrics.jobs.texts = texts

    async def page(self, request: web.Request) -> web.Response:
        def has(job: Job, name: str) -> bool:
            return (self.store.out(job) / name).is_file()

        def servers(job: Job) -> list[dict[str, Any]] | None:
            if job.pool is None or job.state is JobState.QUEUED:
                return None
            return self.progress.servers(self.store.out(job), job.slots)

        text = render_jobs(self.store.listing(), has, servers)
        return web.Response(
            text=text,
            content_type="text/html",
            headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store"},
        )

    async def list_targets(self, request: web.Request) -> web.Response:
        t = self.cfg.targets
        return _json(
            {
                "targets": [c.public() for c in t.by_name.values()],
                "pools": [p.public() for p in t.pools.values()],
            }
        )

    async def list_traces(self, request: web.Request) -> web.Response:
        return _json({"traces": self.traces.listing()})

    async def upload_trace(self, request: web.Request) -> web.Response:
        name = safe_name(request.match_info["name"], "trace name")
        limit = self.cfg.max_upload_bytes
        if request.content_length is not None and request.content_length > limit:
            return _error(413, f"the upload exceeds the limit of {limit:,} bytes")

        async def chunks() -> AsyncIterator[bytes]:
            async for chunk in request.content.iter_chunked(1 << 20):
                self.metrics.upload_bytes.inc(len(chunk))
                yield chunk

        try:
            info = await self.traces.upload(name, chunks(), limit)
        except UploadTooLarge as exc:
            return _error(413, str(exc), Connection="close")
        except FileExistsError as exc:
            return _error(409, str(exc))
        return _json(info.to_json(), status=201)

    async def register_trace(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if not isinstance(body, dict) or set(body) != {"path"}:
            raise SpecError('want {"path": "a/path/inside/DIR"}')
        info = await self.traces.register(self._input(body["path"], "path"))
        return _json(info.to_json(), status=201)

    async def list_jobs(self, request: web.Request) -> web.Response:
        state, kind = request.query.get("state"), request.query.get("kind")
        if state is not None and state not in _STATES:
            raise SpecError(f"state: one of {', '.join(_STATES)}")
        if kind is not None and kind not in KINDS:
            raise SpecError(f"kind: one of {', '.join(KINDS)}")
        positions = self._queue_positions()
        jobs = [
            self._job_json(j, progress=False, positions=positions)
            for j in self.store.listing()
            if (state is None or j.state.value == state) and (kind is None or j.kind == kind)
        ]
        return _json({"jobs": jobs})

    def _input(self, value: object, field: str) -> Path:
        """A path inside DIR that a request may read: never the service's own
        files (the token, job state, hidden files), only a job's ``out/``."""
        if not isinstance(value, str):
            raise PathRejected(f"{field}: want a path inside DIR")
        real = confine(self.data, value, field)
        parts = real.relative_to(self.data).parts
        internal = (
            parts in ((), ("serve.token",))
            or any(p.startswith(".") for p in parts)
            or (parts[0] == "jobs" and (len(parts) < 3 or parts[2] != "out"))
        )
        if internal:
            raise PathRejected(f"{field}: {value} is not an input (the service's own files)")
        return real

    def _resolve_input(self, field: str, value: object) -> tuple[Path, str]:
        if field == "job":
            if not isinstance(value, str) or not JOB_ID.match(value):
                raise PathRejected("job: not a job id")
            src = self.store.jobs.get(value)
            if src is None or src.kind != "bisect":
                raise SpecError(f"job: {value} is not a bisect job")
            bundle = self.store.out(src) / "bundle"
            if not (bundle / "manifest.json").is_file():
                raise SpecError(f"job: {value} has no bundle yet")
            return bundle.resolve(), str(bundle.relative_to(self.data))
        real = self._input(value, field)
        if field == "bundle" and not (real / "manifest.json").is_file():
            raise SpecError(f"bundle: {value} is not a repro bundle (no manifest.json)")
        if field == "trace" and not real.is_file():
            raise SpecError(f"trace: {value} is not a file")
        return real, str(real.relative_to(self.data))

    async def submit(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        job_id = new_job_id()
        while job_id in self.store.jobs:
            job_id = new_job_id()
        out = self.store.dir(job_id) / "out"
        plan = plan_job(body, self.cfg.targets, self._resolve_input, out)
        if "trace" in plan.inputs:
            from replayer.service.traces import _validate

            await asyncio.to_thread(_validate, self.data / plan.inputs["trace"])
        job = self.store.create(
            job_id=job_id,
            kind=plan.kind,
            argv=plan.argv,
            targets=list(plan.targets),
            inputs=plan.inputs,
            options=plan.options,
            label=body.get("label"),
            spec=plan.spec,
            pool=plan.pool,
            max_servers=plan.max_servers,
        )
        self.store.note(job, "submitted: replayer " + " ".join(redact_argv(plan.argv)))
        self.scheduler.kick()
        return _json(self._job_json(job, progress=False), status=201)

    async def job_status(self, request: web.Request) -> web.Response:
        return _json(self._job_json(self._job(request)))

    async def cancel(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job.terminal or job.state is JobState.CANCELLING:
            return _error(409, f"job {job.id} is {job.state.value}")
        await self.scheduler.cancel(job)
        if job.terminal:
            self._finished(job)
        self.scheduler.kick()
        return _json(self._job_json(job, progress=False), status=202)

    async def job_log(self, request: web.Request) -> web.StreamResponse:
        job = self._job(request)
        try:
            offset = max(0, int(request.query.get("offset", "0")))
        except ValueError:
            offset = -1
        if not 0 <= offset <= MAX_OFFSET:  # checked before the answer starts
            raise SpecError("offset: want a byte offset")
        follow = request.query.get("follow", "0") in ("1", "true", "yes")
        resp = web.StreamResponse(
            headers={"Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store"}
        )
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        path = self.store.log_path(job)
        while True:
            done = job.terminal or (job.state is JobState.QUEUED and not follow)
            data = b""
            with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
                if offset < os.fstat(f.fileno()).st_size:  # past the end: nothing yet
                    f.seek(offset)
                    data = f.read(256 << 10)
            if data:
                offset += len(data)
                await resp.write(data)
                continue
            if done or not follow:
                break
            await asyncio.sleep(LOG_POLL)  # tailing a file: poll its growth
        await resp.write_eof()
        return resp

    async def job_files(self, request: web.Request) -> web.Response:
        job = self._job(request)
        out = self.store.out(job)
        files = []
        if out.is_dir():
            root = out.resolve()
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for name in sorted(filenames):
                    p = Path(dirpath) / name
                    if p.is_symlink() or not p.is_file():
                        continue
                    files.append({"path": str(p.relative_to(root)), "bytes": p.stat().st_size})
                    if len(files) >= 10_000:
                        break
        return _json({"files": files})

    def _serve_file(self, job: Job, rel: str, *, attachment: bool = True) -> web.StreamResponse:
        out = self.store.out(job)
        if not out.is_dir():
            raise web.HTTPNotFound(
                text='{"error": "no files yet"}', content_type="application/json"
            )
        root = out.resolve()
        try:
            real = confine(root, rel, "path")
        except PathRejected as exc:
            if "does not exist" in str(exc):
                raise web.HTTPNotFound(
                    text=orjson.dumps({"error": str(exc)}).decode(),
                    content_type="application/json",
                ) from None
            raise
        if not real.is_file():
            raise PathRejected(f"path: {rel} is not a file")
        headers = dict(FILE_HEADERS)
        if attachment:
            headers["Content-Disposition"] = f'attachment; filename="{real.name}"'
        return web.FileResponse(real, headers=headers)

    async def job_file(self, request: web.Request) -> web.StreamResponse:
        return self._serve_file(self._job(request), request.match_info["path"])

    async def job_bundle(self, request: web.Request) -> web.StreamResponse:
        return self._serve_file(self._job(request), "bundle.tar.gz")

    async def job_report(self, request: web.Request) -> web.StreamResponse:
        job = self._job(request)
        out = self.store.out(job)
        report = out / "report.html"
        if not report.is_file():
            if not job.terminal:
                return _error(404, "no report yet: it is written when the job ends")
            if not await asyncio.to_thread(hooks.write_report, out, report):
                return _error(404, "the report could not be rendered for this job")
        resp = self._serve_file(job, "report.html", attachment=False)
        resp.headers["Content-Security-Policy"] = "sandbox allow-scripts"
        return resp
