"""A TCP relay on loopback that breaks the network between a client and a
server on cue, so a test can tell what replayer makes of a *network* fault
while the server behind stays healthy.

It reads the HTTP/1.1 request heads going upstream (a ``Content-Length`` body
each, as replayer and the SDK clients send them) to count requests, and a
rule picks the request whose *response* is broken, however connections are
reused. Everything else is relayed byte for byte.

**Usage**::

    async with FaultProxy(emulator.url) as proxy:
        proxy.on(Fault.reset(after_bytes=200), path="/v1/chat/completions", nth=2)
        ...  # point the client at proxy.url; the server stays at emulator.url
        assert [e.fault for e in proxy.events] == [FaultKind.RESET]
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit

from replayer._async import spawn

_CHUNK = 65536


class FaultKind(StrEnum):
    PASS = "pass"
    RESET = "reset"
    """RST both sides (``SO_LINGER`` 0) after ``after_bytes`` of the response."""
    HALF_OPEN = "half_open"
    """Relay ``after_bytes`` of the response, then nothing more, closing nothing."""
    STALL = "stall"
    """Relay ``after_bytes``, hold the rest ``seconds``, then relay it."""
    REFUSE = "refuse"
    """Reset this connection unsent and refuse new ones ``seconds`` (the
    listener closes, so connects get ``ECONNREFUSED``)."""


@dataclass(frozen=True)
class Fault:
    """What happens to one request's response."""

    kind: FaultKind
    after_bytes: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.after_bytes < 0 or self.seconds < 0:
            raise ValueError("after_bytes and seconds may not be negative")

    @classmethod
    def passthrough(cls) -> Fault:
        return cls(FaultKind.PASS)

    @classmethod
    def reset(cls, after_bytes: int = 0) -> Fault:
        return cls(FaultKind.RESET, after_bytes)

    @classmethod
    def half_open(cls, after_bytes: int = 0) -> Fault:
        return cls(FaultKind.HALF_OPEN, after_bytes)

    @classmethod
    def stall(cls, seconds: float, after_bytes: int = 0) -> Fault:
        return cls(FaultKind.STALL, after_bytes, seconds)

    @classmethod
    def refuse(cls, seconds: float) -> Fault:
        return cls(FaultKind.REFUSE, 0, seconds)


@dataclass
class Rule:
    """``fault`` for the ``nth`` .. ``nth + times - 1`` requests that match
    (a path prefix; a method), counted across connections from 1."""

    fault: Fault
    path: str | None = None
    method: str | None = None
    nth: int = 1
    times: int = 1
    seen: int = 0

    def take(self, method: str, path: str) -> bool:
        if self.path is not None and not path.startswith(self.path):
            return False
        if self.method is not None and method != self.method:
            return False
        self.seen += 1
        return self.nth <= self.seen < self.nth + self.times


@dataclass(frozen=True)
class Event:
    """One request the proxy saw, and the fault it got."""

    connection: int
    request: int
    method: str
    path: str
    fault: FaultKind


@dataclass
class _Conn:
    number: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    fault: Fault | None = None
    budget: int = 0
    """Response bytes still relayed before ``fault`` strikes."""
    frozen: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the connection goes half-open: neither way relays again."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def _rst(writer: asyncio.StreamWriter | None) -> None:
    """Close with a TCP RST, not a FIN: what a middlebox dropping state sends."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """An asyncio TCP relay on ``127.0.0.1`` in front of ``upstream`` (a base
    URL), breaking the responses of the requests its rules pick (:meth:`on`).

    ``url`` is where clients go; what the proxy saw is in ``events``. Start
    and stop it with ``async with`` (or :meth:`start` / :meth:`close`)."""

    def __init__(self, upstream: str, *, port: int = 0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"{upstream!r}: want http://HOST:PORT")
        self.upstream = (parts.hostname, parts.port)
        self.port = port
        self.rules: list[Rule] = []
        self.events: list[Event] = []
        self.refused = 0
        """Times the listener closed for a :attr:`FaultKind.REFUSE`."""
        self._server: asyncio.Server | None = None
        self._conns: dict[int, _Conn] = {}
        self._accepted = 0
        self._requests = 0
        self._closing = False
        self._reopen: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def accepted(self) -> int:
        """Connections accepted so far."""
        return self._accepted

    def on(
        self,
        fault: Fault,
        *,
        path: str | None = None,
        method: str | None = None,
        nth: int = 1,
        times: int = 1,
    ) -> Rule:
        """Break the response of the ``nth`` matching request (and the
        ``times - 1`` after it). The first rule that picks a request wins."""
        if nth < 1 or times < 1:
            raise ValueError("nth and times count from 1")
        rule = Rule(fault, path, method, nth, times)
        self.rules.append(rule)
        return rule

    async def start(self) -> FaultProxy:
        await self._listen()
        return self

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and drop every connection (half-open ones too)."""
        self._closing = True
        if self._reopen is not None:
            self._reopen.cancel()
        if self._server is not None:
            self._server.close()
            self._server = None
        tasks = []
        for conn in list(self._conns.values()):
            _rst(conn.client)
            _rst(conn.upstream)
            tasks += conn.tasks
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._conns.clear()

    def _pick(self, method: str, path: str) -> Fault:
        for rule in self.rules:
            if rule.take(method, path):
                return rule.fault
        return Fault.passthrough()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._accepted += 1
        conn = _Conn(self._accepted, writer)
        try:
            up_reader, conn.upstream = await asyncio.open_connection(*self.upstream)
        except OSError:
            _rst(writer)  # the server is down: so is the way to it
            return
        self._conns[conn.number] = conn
        conn.tasks = [
            spawn(self._upward(conn, reader), name=f"faultproxy-up-{conn.number}"),
            spawn(self._downward(conn, up_reader), name=f"faultproxy-down-{conn.number}"),
        ]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        self._conns.pop(conn.number, None)
        for w in (conn.client, conn.upstream):
            if not w.is_closing():
                w.close()

    async def _upward(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        """Client to server: request heads counted and matched, bodies relayed."""
        up = conn.upstream
        assert up is not None
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        up.write(exc.partial)
                    break
                except asyncio.LimitOverrunError:
                    break
                if conn.frozen.is_set():
                    await _forever()
                method, path, length = _parse_head(head)
                self._requests += 1
                fault = self._pick(method, path)
                self.events.append(Event(conn.number, self._requests, method, path, fault.kind))
                if fault.kind is FaultKind.REFUSE:
                    self._refuse(fault.seconds)
                    _rst(conn.client)
                    _rst(up)
                    return
                if fault.kind is not FaultKind.PASS:
                    conn.fault, conn.budget = fault, fault.after_bytes
                up.write(head)
                if length:
                    up.write(await reader.readexactly(length))
                await up.drain()
            if up.can_write_eof():
                up.write_eof()
        except (OSError, asyncio.IncompleteReadError):
            _rst(up)

    async def _downward(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        """Server to client: relayed until a picked request's fault strikes."""
        client = conn.client
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                fault = conn.fault
                if fault is not None and len(data) >= conn.budget:
                    head, data = data[: conn.budget], data[conn.budget :]
                    if head:
                        client.write(head)
                        await client.drain()
                    conn.fault = None
                    if fault.kind is FaultKind.RESET:
                        _rst(client)
                        _rst(conn.upstream)
                        return
                    if fault.kind is FaultKind.HALF_OPEN:
                        conn.frozen.set()
                        await _forever()
                    await asyncio.sleep(fault.seconds)  # STALL
                elif fault is not None:
                    conn.budget -= len(data)
                if data:
                    client.write(data)
                    await client.drain()
            if client.can_write_eof():
                client.write_eof()
        except OSError:
            _rst(client)

    def _refuse(self, seconds: float) -> None:
        """Close the listener now and open it again on the same port after
        ``seconds`` (unless the proxy closes first)."""
        if self._server is None:
            return
        self._server.close()
        self._server = None
        self.refused += 1

        async def reopen() -> None:
            await asyncio.sleep(seconds)
            if not self._closing:
                await self._listen()

        self._reopen = spawn(reopen(), name="faultproxy-reopen")

    @property
    def listening(self) -> bool:
        return self._server is not None


async def _forever() -> None:
    """Relay nothing, close nothing: until :meth:`FaultProxy.close` cancels."""
    await asyncio.Event().wait()


def _parse_head(head: bytes) -> tuple[str, str, int]:
    """Method, path and ``Content-Length`` of a request head."""
    lines = head.split(b"\r\n")
    words = lines[0].decode("latin-1").split(" ")
    method, path = (words[0], words[1]) if len(words) >= 2 else ("", "")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            with contextlib.suppress(ValueError):
                length = int(value.strip())
    return method, path, length
