"""What the shrink stage changes inside requests, as data: an :class:`Edit`
(a cap on output tokens, trailing cuts of prompts, conversation turns dropped,
item texts trimmed) applied to every request of a candidate, and the small
trace a trial of an edited candidate replays (:func:`materialize`).

Apart from the stage (:mod:`replayer.bisect.shrink`) so that the bisect's
state can rebuild a candidate's trace without importing the stage that
searches for the edit.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from replayer.trace.model import RequestRecord
from replayer.trace.reader import Trace
from replayer.trace.schema import Kind
from replayer.trace.subset import write_subset

UNIT = {Kind.BLOCKS: "block", Kind.TEXT: "character"}
TRIM_ITEMS = 8
"""Conversation items whose text is cut when dropping turns is not enough:
the crashing request's own first, then what it shares; longest first. Each
first loses all its text (one trial): only one that then goes quiet is
searched, so an item that does not matter costs one trial."""
CAP_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass(frozen=True)
class Edit:
    """What the shrink stage changed, applied to every request of a candidate."""

    max_tokens: int | None = None
    """A cap on every request's output tokens."""
    cuts: tuple[tuple[str, int], ...] = ()
    """(request id, kept length): block ids of a token-id prompt, characters of a text one."""
    drop: tuple[str, ...] = ()
    """Digests of conversation turns dropped from every request holding them."""
    trims: tuple[tuple[str, int], ...] = ()
    """(item digest, kept characters): the longest text of a conversation item,
    cut in every request holding that item."""

    def text(self) -> str:
        """Canonical JSON (``""`` for no edit): the candidate's ``edit``."""
        d: dict[str, Any] = {}
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        if self.cuts:
            d["cuts"] = sorted(self.cuts)
        if self.drop:
            d["drop"] = sorted(self.drop)
        if self.trims:
            d["trims"] = sorted(self.trims)
        return orjson.dumps(d, option=orjson.OPT_SORT_KEYS).decode() if d else ""

    @classmethod
    def parse(cls, text: str) -> Edit:
        if not text:
            return cls()
        d = orjson.loads(text)
        return cls(
            d.get("max_tokens"),
            tuple((str(r), int(n)) for r, n in d.get("cuts", ())),
            tuple(d.get("drop", ())),
            tuple((str(k), int(n)) for k, n in d.get("trims", ())),
        )

    def cut(self, request_id: str, length: int) -> Edit:
        others = tuple(c for c in self.cuts if c[0] != request_id)
        return replace(self, cuts=(*others, (request_id, length)))

    def trim(self, item: str, length: int) -> Edit:
        others = tuple(c for c in self.trims if c[0] != item)
        return replace(self, trims=(*others, (item, length)))

    def apply(self, rec: RequestRecord) -> RequestRecord:
        """``rec`` with this edit; untouched records come back as they were."""
        kind = Kind(rec.kind)
        content, params, tokens = rec.content, rec.params, rec.input_tokens
        cuts = dict(self.cuts)
        if rec.request_id in cuts and kind in (Kind.BLOCKS, Kind.TEXT):
            n = cuts[rec.request_id]
            content = content[:n]
            if kind is Kind.BLOCKS and rec.block_size and tokens is not None:
                tokens = min(tokens, n * rec.block_size)
            elif kind is Kind.TEXT:
                tokens = None  # the writer estimates it again
        if self.drop and kind.itemized and content:
            gone = set(self.drop)
            items = list(content)
            spans = turns(kind, items)
            keep = [True] * len(items)
            for s, e in spans:
                if digest(items[s:e]) in gone:
                    keep[s:e] = [False] * (e - s)
            if not all(keep):
                content = [m for m, k in zip(items, keep, strict=True) if k]
                tokens = None
        if self.trims and kind.itemized and content:
            cut_to = dict(self.trims)
            items = list(content)
            for i, m in enumerate(items):
                kept = cut_to.get(digest([m]))
                if kept is not None:
                    items[i] = trimmed(m, kept)
            if items != list(content):
                content, tokens = items, None
        if self.max_tokens is not None and kind is not Kind.RAW:
            params = capped(params, kind, self.max_tokens)
        if content is rec.content and params is rec.params:
            return rec
        return replace(
            rec,
            content=content,
            params=params,
            input_tokens=tokens,
            body_sha256=None,  # not the recorded body any more
            usage_prompt_tokens=None,
            usage_cached_tokens=None,
        )


def capped(params: dict[str, Any], kind: Kind, cap: int) -> dict[str, Any]:
    """``params`` with every output cap at most ``cap`` (one is added where none is)."""
    out = dict(params)
    present = [k for k in CAP_KEYS if isinstance(out.get(k), int)]
    if not present:
        present = ["max_output_tokens" if kind is Kind.RESPONSES else "max_tokens"]
        out[present[0]] = cap
    for k in present:
        out[k] = min(int(out[k]), cap)
    if isinstance(out.get("min_tokens"), int):
        out["min_tokens"] = min(out["min_tokens"], cap)
    return out


def recorded_cap(params: dict[str, Any]) -> int | None:
    caps = [v for k in CAP_KEYS if isinstance(v := params.get(k), int) and v > 0]
    return max(caps) if caps else None


def item_of(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        got = orjson.loads(text)
    except (orjson.JSONDecodeError, TypeError):
        return {}
    return got if isinstance(got, dict) else {}


OUTPUT_ITEMS = frozenset({"function_call", "reasoning", "custom_tool_call", "mcp_call"})
"""Responses input items that are the model's own output (besides assistant messages)."""


def _is_output(kind: Kind, item: dict[str, Any]) -> bool:
    """What the model said (an assistant message, a tool call, reasoning), as
    opposed to what it was told (system, user, tool results)."""
    if kind is Kind.RESPONSES and item.get("type", "message") != "message":
        return item.get("type") in OUTPUT_ITEMS
    return item.get("role") == "assistant"


def turns(kind: Kind, items: Sequence[Any]) -> list[tuple[int, int]]:
    """The droppable turns of a conversation, oldest first, as [start, end)
    spans. A turn is what the model said and what answered it (tool results,
    the user's next message), so dropping one keeps tool calls paired and
    roles alternating. The head (system prompt, the first user message) and
    the last turn are never listed."""
    out = [_is_output(kind, item_of(m)) for m in items]
    starts = [i for i, o in enumerate(out) if o and (i == 0 or not out[i - 1])]
    return list(itertools.pairwise(starts))


TEXT_KEYS = ("content", "text", "output")
"""Where a conversation item's prose lives (never tool-call arguments: they are JSON)."""


def _texts(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[int, tuple[Any, ...]]]:
    """(length, path) of every prose string in an item."""
    out: list[tuple[int, tuple[Any, ...]]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, str) and k in TEXT_KEYS:
                out.append((len(v), (*path, k)))
            elif isinstance(v, dict | list):
                out += _texts(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _texts(v, (*path, i))
    return out


def longest_text(item: Any) -> int:
    """Characters of an item's longest prose string (0: none)."""
    found = _texts(item_of(item))
    return max(n for n, _ in found) if found else 0


def trimmed(item: Any, n: int) -> Any:
    """``item`` with its longest prose string cut to ``n`` characters."""
    d = item_of(item)
    found = _texts(d)
    if not found:
        return item
    _, path = max(found, key=lambda f: f[0])
    d = orjson.loads(orjson.dumps(d))  # a copy to cut
    node: Any = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = node[path[-1]][:n]
    return orjson.dumps(d).decode() if isinstance(item, str) else d


def digest(items: Sequence[Any]) -> str:
    h = hashlib.sha256()
    for m in items:
        h.update(m.encode() if isinstance(m, str) else orjson.dumps(m, option=orjson.OPT_SORT_KEYS))
        h.update(b"\0")
    return h.hexdigest()[:16]


def materialize(trace: Trace, rows: Sequence[int], edit: Edit, path: Path) -> Trace:
    """``rows`` of ``trace`` with ``edit`` applied, as a trace of their own
    (written once per candidate: a resumed bisect reuses it)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        write_subset(
            trace, rows, tmp, details={"shrink": orjson.loads(edit.text() or "{}")}, edit=edit.apply
        )
        tmp.replace(path)
    return Trace.open(path)
