"""What the emulator tests share: the served model, the dead engine's
bytes, and small request/SSE helpers (a client, a chat body, an SSE body's
events, a stream read in the background, an order check)."""

from __future__ import annotations

import httpx

from replayer.testing.emulator import EmulatorProcess

MODEL = "moonshotai/Kimi-K3"
DEAD = (
    b'{"error":{"message":"The server had an error while processing your request.",'
    b'"type":"InternalServerError","param":null,"code":500}}'
)
DEAD_EVENT = b"data: " + DEAD + b"\n\n"
DONE = b"data: [DONE]\n\n"


def client(emu: EmulatorProcess, **kw) -> httpx.Client:
    return httpx.Client(base_url=emu.url, timeout=20, **kw)


def chat(content: str = "hello", **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}


def sse_events(raw: bytes) -> list[bytes]:
    """The ``data:`` payloads of an SSE body, in order (framing checked)."""
    assert raw.endswith(b"\n\n"), raw[-80:]
    out = []
    for event in raw[:-2].split(b"\n\n"):
        assert event.startswith(b"data: "), event
        out.append(event[6:])
    return out


class Stream:
    """A streaming response read in the background: status, raw body so far,
    and the transport error that ended it, if any."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.content_type: str | None = None
        self.buf = bytearray()
        self.error: Exception | None = None
        self.done = False

    async def run(self, c: httpx.AsyncClient, path: str, body: dict, headers=None) -> None:
        try:
            async with c.stream("POST", path, json=body, headers=headers or {}) as r:
                self.status = r.status_code
                self.content_type = r.headers.get("content-type")
                async for chunk in r.aiter_raw():
                    self.buf += chunk
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            self.error = exc
        finally:
            self.done = True

    @property
    def body(self) -> bytes:
        return bytes(self.buf)

    def has_content(self) -> bool:
        return b'"content":" ' in self.buf or b'"text":" ' in self.buf


def in_order(text: str, *needles: str) -> None:
    """Assert every needle occurs in ``text`` and in this order."""
    at = -1
    for n in needles:
        i = text.find(n, at + 1)
        assert i > at, f"{n!r} missing or out of order"
        at = i


BOUND = 60.0
"""Upper bound, in seconds, on any async test body that waits on streams."""
