"""What the recorder tests share: vLLM's tool-call stream and body, and a
scriptable fake upstream (in-process aiohttp on loopback) for what the
emulator does not do (tool calls, echoing requests, gated and cut streams,
redirects, gzip)."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
from typing import Any

import orjson
from aiohttp import web

MODEL = "moonshotai/Kimi-K3"
TOOL_CALL = {
    "id": "chatcmpl-tool-7f3a",
    "type": "function",
    "function": {"name": "read_file", "arguments": '{"path": "src/main.py", "lines": [1, 40]}'},
}


def chunk(choices: list[Any], **extra: Any) -> bytes:
    obj = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": choices,
        **extra,
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def tool_stream() -> list[bytes]:
    """vLLM's shape: role chunk, name chunk, argument fragments, finish, usage, [DONE]."""
    args = TOOL_CALL["function"]["arguments"]
    head = {
        "index": 0,
        "id": TOOL_CALL["id"],
        "type": "function",
        "function": {"name": "read_file", "arguments": ""},
    }
    out = [
        chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]),
        chunk([{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}]),
    ]
    for i in range(0, len(args), 7):
        frag = {"index": 0, "function": {"arguments": args[i : i + 7]}}
        out.append(chunk([{"index": 0, "delta": {"tool_calls": [frag]}, "finish_reason": None}]))
    out.append(chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]))
    usage = {
        "prompt_tokens": 120,
        "total_tokens": 139,
        "completion_tokens": 19,
        "prompt_tokens_details": {"cached_tokens": 96},
    }
    out.append(chunk([], usage=usage))
    out.append(b"data: [DONE]\n\n")
    return out


def tool_body() -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 120,
            "total_tokens": 139,
            "completion_tokens": 19,
            "prompt_tokens_details": {"cached_tokens": 96},
        },
    }


class FakeUpstream:
    """What it saw (``requests``, ``disconnects``) and gates tests open (``gate``)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.disconnects = 0
        self.gate = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> FakeUpstream:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.chat)
        app.router.add_get("/gated", self.gated)
        app.router.add_get("/silent", self.silent)
        app.router.add_get("/gzip", self.gzipped)
        app.router.add_get("/redirect", self.redirect)
        app.router.add_route("*", "/{tail:.*}", self.echo)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site.port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def echo(self, request: web.Request) -> web.Response:
        h = hashlib.sha256()
        n = 0
        async for data in request.content.iter_any():
            h.update(data)
            n += len(data)
        seen = {
            "method": request.method,
            "path_qs": request.raw_path,
            "headers": [[k, v] for k, v in request.headers.items()],
            "body_bytes": n,
            "body_sha256": h.hexdigest(),
        }
        self.requests.append(seen)
        status = int(request.headers.get("X-Want-Status", "200"))
        resp = web.Response(status=status, body=orjson.dumps(seen), content_type="application/json")
        resp.headers.add("Set-Cookie", "a=1; Path=/")
        resp.headers.add("Set-Cookie", "b=2; Path=/")
        resp.headers["X-Upstream"] = "fake"
        resp.headers["Connection"] = "X-Hop-Resp"
        resp.headers["X-Hop-Resp"] = "must not pass"
        return resp

    async def gated(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: first\n\n")
        await self.gate.wait()
        await resp.write(b"data: second\n\n")
        await resp.write_eof()
        return resp

    async def silent(self, request: web.Request) -> web.StreamResponse:
        """Headers at once, the body only when the gate opens (a long prefill)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await self.gate.wait()
        await resp.write(b"data: late\n\n")
        await resp.write_eof()
        return resp

    async def gzipped(self, request: web.Request) -> web.Response:
        body = gzip.compress(b'{"hello": "world"}', mtime=0)
        return web.Response(
            body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    async def redirect(self, request: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": "/elsewhere"})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw)
        self.requests.append({"path": request.path, "body": body, "bytes": len(raw)})
        mode = request.headers.get("X-Test", "")
        if mode == "error":
            err = {"error": {"message": "bad thing", "type": "BadRequestError", "code": 400}}
            return web.Response(status=400, body=orjson.dumps(err), content_type="application/json")
        if not body.get("stream"):
            if request.path == "/v1/completions":
                out = {"choices": [{"index": 0, "text": " done", "finish_reason": "stop"}]}
                return web.Response(body=orjson.dumps(out), content_type="application/json")
            return web.Response(body=orjson.dumps(tool_body()), content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        if mode in ("hang", "cut"):
            text = [{"index": 0, "delta": {"content": "partial "}, "finish_reason": None}]
            await resp.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}]))
            await resp.write(chunk(text))
            if mode == "cut":
                assert request.transport is not None
                request.transport.abort()
                return resp
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.disconnects += 1
                raise
        for c in tool_stream():
            await resp.write(c)
        if mode == "linger":  # [DONE] sent, the end of the body held back
            await self.gate.wait()
        await resp.write_eof()
        return resp
