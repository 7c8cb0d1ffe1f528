"""The replay's one seam to the wire: a request object, and a transport
that takes it.

The dispatchers decide *when* a request goes and in which order; a
:class:`Transport` puts it on the wire and fills in its
:class:`~replayer.replay.results.Result`. Everything a send needs travels in
one frozen :class:`Request`, so a transport is one method (the shape of
httpx's ``AsyncBaseTransport.handle_async_request``), and a fake that answers
on a virtual clock (:class:`replayer.testing.FakeServer`) drops in where the
real one (:class:`~replayer.replay.client.HTTPTransport`) goes: the scheduler
then runs unchanged, with exact times.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from replayer.replay.aborts import AbortAt
from replayer.replay.results import Result
from replayer.wire import Reply

Go = Callable[[], Awaitable[bool]]
"""Awaited once the connection is ready, just before the request's first
byte is written: the request's turn (strict order lets connections open
ahead and write one after another); False: the run stopped meanwhile, and
the request is abandoned unwritten."""


def release(*signals: asyncio.Future[None] | None) -> None:
    """Resolve the signals that are not yet: strict order's must fire
    whatever became of the request, or the next one waits forever."""
    for fut in signals:
        if fut is not None and not fut.done():
            fut.set_result(None)


@dataclass(frozen=True, slots=True)
class Request:
    """One request to send, and where what came of it goes.

    Times in ``result`` are microseconds after ``t0`` (the replay's anchor,
    on the clock the transport answers on)."""

    url: str
    body: bytes
    headers: dict[str, str]
    result: Result
    """Filled in place, whatever happens; untouched if ``go`` refuses."""
    t0: float
    timeout: float
    """Seconds for the whole exchange, connecting included."""
    stats: Reply = field(default_factory=Reply)
    """The response as it streams in (a monitor may read it meanwhile)."""
    keep_text: bool = False
    """Keep the output text (``result.output_text``)."""
    sent: asyncio.Future[None] | None = None
    """Resolved once the body is handed to the wire (strict order: the next
    request may go), or when the request ends, whatever happened."""
    answered: asyncio.Future[None] | None = None
    """Resolved once the response headers are in (admitted order), or when
    the request ends, whatever happened."""
    go: Go | None = None
    """The request's turn (see :data:`Go`); None: at once."""
    abort: AbortAt | None = None
    """Disconnect there, as the recorded client did (``result.status``
    ``aborted`` when reached); None: read the response to its end."""

    def release(self) -> None:
        """Resolve ``sent`` and ``answered`` if they are not yet."""
        release(self.sent, self.answered)


class Transport(ABC):
    """Puts requests on the wire. The replay sends through one per target
    (each its own :class:`~replayer.replay.client.HTTPTransport` by
    default) or through one given for all of them (a fake)."""

    @abstractmethod
    async def handle(self, request: Request) -> None:
        """Send ``request`` and fill in ``request.result`` and
        ``request.stats``. A failure of the exchange becomes a status and an
        error class, never an exception (cancellation aside); ``sent`` and
        ``answered`` are resolved before this returns."""

    async def preopen(self, url: str, n: int) -> int:
        """Open up to ``n`` connections to ``url``'s origin before the first
        request; how many opened (none, for a transport without
        connections)."""
        return 0

    @property
    def opened(self) -> int:
        """Connections opened so far."""
        return 0

    def close(self) -> None:
        """Let go of idle connections. The replay closes the transports it
        made; one passed in stays open (it may serve another replay)."""
        return None
