"""The record model: what callers hand the writer and the reader hands back.

A :class:`RequestRecord` is one request as an importer, the recorder or
synthesis knows it (a whole body plus what was recorded about it); a
:class:`TraceMeta` is the provenance and token space stored with a trace.
The writer and the reader both build on this module, so neither needs the
other for it; it knows the schema's vocabulary, not how rows are encoded
on disk (:mod:`replayer.trace.writer`) or read back
(:mod:`replayer.trace.reader`).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

import orjson

from replayer._version import __version__
from replayer.trace.schema import (
    FORMAT_NAME,
    META_FORMAT,
    META_PROVENANCE,
    META_TOKENS,
    META_VERSION,
    TRACE_SCHEMA_VERSION,
    Kind,
)
from replayer.trace.tokens import TokenSpace


def kind_of(body: dict[str, Any], path: str | None = None) -> Kind:
    """The payload kind a body is stored as: by its API (the path's ending;
    chat when unknown) when the content has that API's shape, else raw."""
    api = (path or "").partition("?")[0].rstrip("/")
    messages, prompt, items = body.get("messages"), body.get("prompt"), body.get("input")
    if api.endswith(("/messages", "/messages/count_tokens")):
        return Kind.MESSAGES if _items(messages) else Kind.RAW
    if api.endswith("/responses"):
        return Kind.RESPONSES if _items(items) else Kind.RAW
    if isinstance(messages, list):
        return Kind.CHAT
    if isinstance(prompt, str) and "messages" not in body:
        return Kind.TEXT
    return Kind.RAW


def _items(value: Any) -> bool:
    """A list of JSON objects (a string input stays raw: it has no items)."""
    return isinstance(value, list) and all(isinstance(i, dict) for i in value)


@dataclass(slots=True)
class RequestRecord:
    """One request as a caller knows it: the full body plus what was recorded.

    **Usage**::

        RequestRecord.from_body({"model": "m", "messages": [...], "max_tokens": 64},
                                request_id="s1-t0", session_id="s1", turn=0, start_us=0)
    """

    request_id: str
    session_id: str
    turn: int
    start_us: int
    kind: Kind
    params: dict[str, Any]
    """The body without its content; may hold the content key (any value) to fix its position."""
    content: Any = None
    """chat, messages: messages; responses: input items (dicts or JSON texts);
    text: prompt; blocks: block ids; raw: unused."""
    path: str | None = None
    end_us: int | None = None
    block_size: int | None = None
    block_ns: str | None = None
    """blocks: the namespace of ``content``'s hash ids (None: ids are global)."""
    input_tokens: int | None = None
    """Required for blocks; for chat/text, the recorded prompt tokens if known."""
    base_hint: str | None = None
    """request_id of an earlier row to delta against (forks, sub-agents)."""
    after: list[str] | None = None
    """Joins: request_ids whose end this request waits for on replay (a
    parent's turn after the sub-agents whose results it carries)."""
    body_sha256: str | None = None
    status: int | None = None
    ttft_us: int | None = None
    finish_reason: str | None = None
    output_text: str | None = None
    output_tool_calls: list[Any] | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    usage_cached_tokens: int | None = None
    error: str | None = None
    meta: dict[str, Any] | None = None

    @classmethod
    def from_body(
        cls,
        body: dict[str, Any],
        *,
        request_id: str,
        session_id: str,
        turn: int,
        start_us: int,
        path: str | None = None,
        **kw: Any,
    ) -> RequestRecord:
        """Split a recorded body into params and content by its path and shape
        (an Anthropic body is told from a chat body only by its path)."""
        kind = kind_of(body, path)
        key = kind.content_key
        content: Any = body.get(key) if key is not None else None
        return cls(
            request_id=request_id,
            session_id=session_id,
            turn=turn,
            start_us=start_us,
            kind=kind,
            params=body,
            content=content,
            path=path,
            **kw,
        )


@dataclass
class TraceMeta:
    """Provenance stored in the schema metadata of every trace."""

    source: str
    """What produced the trace: ``import:<format>``, ``synth``, ``record``, ``subset`` …"""
    details: dict[str, Any] = field(default_factory=dict)
    """Source files, options, recorder/upstream facts."""
    tokens: TokenSpace = field(default_factory=TokenSpace)
    created_at: str = ""

    def to_metadata(self) -> dict[bytes, bytes]:
        created = self.created_at or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        prov = {
            "tool": "replayer",
            "tool_version": __version__,
            "source": self.source,
            "created_at": created,
            **self.details,
        }
        tok = {"lo": self.tokens.lo, "hi": self.tokens.hi, "salt": self.tokens.salt}
        return {
            META_FORMAT: FORMAT_NAME.encode(),
            META_VERSION: str(TRACE_SCHEMA_VERSION).encode(),
            META_PROVENANCE: orjson.dumps(prov),
            META_TOKENS: orjson.dumps(tok),
        }
