"""Which accumulator reads which API, and which API a request path is.

This is the one place a new response format is registered: write its
accumulator (a subclass of :class:`~replayer.wire.base.Accumulator`) and
add it to :data:`ACCUMULATORS` and its path to :data:`PATHS`.
"""

from __future__ import annotations

from replayer.wire.anthropic import MessagesAccumulator
from replayer.wire.base import Accumulator, Api
from replayer.wire.openai import ChatAccumulator, CompletionsAccumulator
from replayer.wire.reply import Reply
from replayer.wire.responses import ResponsesAccumulator

ACCUMULATORS: dict[Api, type[Accumulator]] = {
    Api.CHAT: ChatAccumulator,
    Api.COMPLETIONS: CompletionsAccumulator,
    Api.MESSAGES: MessagesAccumulator,
    Api.RESPONSES: ResponsesAccumulator,
}

PATHS: tuple[tuple[str, Api], ...] = (
    ("/chat/completions", Api.CHAT),
    ("/completions", Api.COMPLETIONS),
    ("/messages", Api.MESSAGES),
    ("/responses", Api.RESPONSES),
)
"""Path endings, most specific first (``/v1`` or a proxy's prefix may come before)."""


def api_for_path(path: str) -> Api | None:
    """The API a request path (or URL) is for; None if no known one."""
    p = path.partition("?")[0].rstrip("/")
    for end, api in PATHS:
        if p.endswith(end):
            return api
    return None


def accumulator(api: Api, reply: Reply | None = None) -> Accumulator:
    """A fresh accumulator for ``api`` filling ``reply`` (a new one if None)."""
    return ACCUMULATORS[api](reply)
