"""The wire layer: server-sent events and what a response amounted to.

Every part of replayer that reads a response goes through here: the replay
client (times, usage and a hash per request), the recording proxy (the
reply it stores) and, through the replay's :class:`Reply`, the hang
watchdog. One decoder (:mod:`.sse`, WHATWG rules), one reading of error
objects (:mod:`.envelope`), one summary (:mod:`.reply`) and an accumulator
per API (:mod:`.base`; OpenAI chat and completions in :mod:`.openai`,
Anthropic Messages in :mod:`.anthropic`, OpenAI Responses in
:mod:`.responses`, registered in :mod:`.apis`).

A leaf: it imports nothing from replayer, only the standard library and
orjson, so the recorder, the replay and the monitor can all depend on it
without depending on each other. It never raises on what a server sends:
malformed input is counted.
"""

from __future__ import annotations

from replayer.wire.anthropic import MessagesAccumulator
from replayer.wire.apis import ACCUMULATORS, accumulator, api_for_path
from replayer.wire.base import Accumulator, Api
from replayer.wire.envelope import ErrorInfo, error_info, error_message
from replayer.wire.openai import ChatAccumulator, CompletionsAccumulator, merge_delta
from replayer.wire.reply import Choice, Reply
from replayer.wire.responses import ResponsesAccumulator
from replayer.wire.sse import Event, SSEDecoder, is_event_stream

__all__ = [
    "ACCUMULATORS",
    "Accumulator",
    "Api",
    "ChatAccumulator",
    "Choice",
    "CompletionsAccumulator",
    "ErrorInfo",
    "Event",
    "MessagesAccumulator",
    "Reply",
    "ResponsesAccumulator",
    "SSEDecoder",
    "accumulator",
    "api_for_path",
    "error_info",
    "error_message",
    "is_event_stream",
    "merge_delta",
]
