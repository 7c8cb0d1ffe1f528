"""OpenAI request bodies as JSONL: one request per line, either a bare body
(``{"model", "messages", ...}`` or ``{"prompt", ...}``) or a wrapper
``{"body": {...}, ...}`` with optional fields:

* ``request_id`` (or an OpenAI Batch ``custom_id``), ``session_id``, ``turn``;
* ``start_us`` / ``end_us`` (µs from trace start), or ``timestamp`` /
  ``end_timestamp`` (seconds, e.g. epoch, or ISO 8601 strings);
* ``path`` (or a Batch ``url``), e.g. ``/v1/completions``;
* ``response``: an OpenAI chat or text completion object, an
  ``{"error": ...}`` object, or a Batch-output style ``{"status_code",
  "body"}``; ``status``, ``error``, ``ttft_us`` and ``meta`` directly;
* ``after``: the request ids whose end this request waits for (joins: a
  parent's turn after its sub-agents, a sub-agent after its launch).

This is the shape ``replayer export --format jsonl`` writes, and it reads back
losslessly (ids, sessions, turns, start/end, path, joins, bodies). A wrapper's body
may be any JSON object (embeddings, rerank …); a bare line must hold
``messages``, ``prompt`` or ``input`` to be told from other JSONL.

Mapping decisions, and why:

* **Bodies are kept verbatim** and split by shape
  (:meth:`RequestRecord.from_body`): ``messages`` → chat, string ``prompt`` →
  text, anything else (e.g. a token-id ``prompt``, or ``messages`` that are
  not a list of message objects) → raw, stored whole.
* **Ids**: ``request_id`` (or ``custom_id``), else ``<file stem>-<line, 6
  digits>``, stable across re-imports. A repeated id is an error (with its
  line).
* **Sessions**: ``session_id``, else each line is its own session (JSONL
  bodies do not say which requests form a conversation; grouping them by
  guess would invent prefix reuse). ``turn`` defaults to the number of
  earlier lines of the same session (0 without a session id).
* **Timing**: ``start_us`` as is; else ``timestamp`` minus the earliest
  ``timestamp`` of all sources (found in a first streaming pass over the
  lines that have one), rounded from its decimal text to the µs; else the
  previous line's start (0 for the first), so untimed lines keep file order.
  ``end_us`` likewise from ``end_us`` / ``end_timestamp``.
* **Outcome** from ``response``: first choice's text / message content,
  tool calls and finish reason, ``usage`` (prompt, completion, cached
  tokens; the prompt count also becomes ``input_tokens``), status 200 unless
  told otherwise.
* Wrapper keys not listed above are kept in ``meta``. A line carrying
  Mooncake/AIPerf row fields (``input_length``, ``hash_ids``,
  ``text_input``, ``output_length``) is refused with a pointer to
  ``import aiperf``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from replayer.errors import ImportFormatError
from replayer.trace.importers.common import (
    is_int64,
    iter_jsonl,
    message_problem,
    open_text,
    seconds_to_us,
    unique_stems,
)
from replayer.trace.model import RequestRecord
from replayer.trace.schema import Kind

NAME = "openai-jsonl"
WHAT = "OpenAI request JSONL"
WRAPPER_KEYS = frozenset(
    {
        "body",
        "request_id",
        "custom_id",
        "session_id",
        "turn",
        "start_us",
        "end_us",
        "timestamp",
        "end_timestamp",
        "path",
        "url",
        "response",
        "status",
        "error",
        "ttft_us",
        "meta",
        "after",
    }
)
_BARE_KEYS = ("messages", "prompt", "input")
_AIPERF_KEYS = ("input_length", "hash_ids", "text_input", "output_length")
_EPOCH = dt.datetime(1970, 1, 1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def time_us(value: Any) -> int | None:
    """Seconds (a number) or an ISO 8601 string as µs since the epoch, or None
    if it is neither. Naive ISO times are read as UTC."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return seconds_to_us(value)
    if isinstance(value, str):
        try:
            t = dt.datetime.fromisoformat(value)
        except ValueError:
            return None
        if t.tzinfo is not None:
            t = t.astimezone(dt.UTC).replace(tzinfo=None)
        return (t - _EPOCH) // dt.timedelta(microseconds=1)
    return None


_int = is_int64


def _origin(sources: list[Path]) -> int | None:
    """The earliest ``timestamp`` / ``end_timestamp`` of all wrapper lines: a
    first streaming pass that parses only the lines that mention one."""
    best: int | None = None
    for src in sources:
        try:
            with open_text(src) as f:
                for n, raw in enumerate(f, 1):
                    if b"timestamp" not in raw:
                        continue
                    try:
                        row = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        continue  # reported with its line by the second pass
                    if not isinstance(row, dict) or not isinstance(row.get("body"), dict):
                        continue
                    for key in ("timestamp", "end_timestamp"):
                        if row.get(key) is None:
                            continue
                        t = time_us(row[key])
                        if t is None:
                            raise ImportFormatError(
                                f"{src}:{n}: not {WHAT} ({key} is neither seconds nor ISO 8601)"
                            )
                        best = t if best is None else min(best, t)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise ImportFormatError(f"{src}: not readable as {WHAT}: {exc}") from None
    return best


def outcome(response: Any, where: str) -> dict[str, Any]:
    """RequestRecord outcome fields from a recorded response object."""
    if not isinstance(response, dict):
        raise ImportFormatError(f"{where}: not {WHAT} (response is not an object)")
    out: dict[str, Any] = {}
    if "status_code" in response and "body" in response:  # Batch output style
        if _int(response["status_code"]) and 0 <= response["status_code"] < 1000:
            out["status"] = response["status_code"]
        response = response["body"]
        if not isinstance(response, dict):
            return out
    err = response.get("error")
    if err:
        out["error"] = str(err.get("message", err)) if isinstance(err, dict) else str(err)
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        c0 = choices[0]
        msg = c0.get("message")
        if isinstance(msg, dict):
            if isinstance(msg.get("content"), str):
                out["output_text"] = msg["content"]
            if isinstance(msg.get("tool_calls"), list) and msg["tool_calls"]:
                out["output_tool_calls"] = msg["tool_calls"]
        elif isinstance(c0.get("text"), str):
            out["output_text"] = c0["text"]
        if isinstance(c0.get("finish_reason"), str):
            out["finish_reason"] = c0["finish_reason"]
        out.setdefault("status", 200)
    usage = response.get("usage")
    if isinstance(usage, dict):
        if _int(usage.get("prompt_tokens")):
            out["usage_prompt_tokens"] = usage["prompt_tokens"]
        if _int(usage.get("completion_tokens")):
            out["usage_completion_tokens"] = usage["completion_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and _int(details.get("cached_tokens")):
            out["usage_cached_tokens"] = details["cached_tokens"]
    return out


def records(sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]:
    origin = _origin(sources)
    seen: set[str] = set()
    turns: dict[str, int] = {}
    prev_start = 0
    for src, stem in zip(sources, unique_stems(sources), strict=True):
        for line, row in iter_jsonl(src, WHAT):
            where = f"{src}:{line}"
            if not isinstance(row, dict):
                raise ImportFormatError(f"{where}: not {WHAT} (a line is not a JSON object)")
            wrapped = isinstance(row.get("body"), dict)
            body = row["body"] if wrapped else row
            w: dict[str, Any] = row if wrapped else {}
            if not wrapped and not any(k in body for k in _BARE_KEYS):
                hint = (
                    "; it looks like a Mooncake/AIPerf row: use `import aiperf`"
                    if any(k in row for k in _AIPERF_KEYS)
                    else ""
                )
                raise ImportFormatError(
                    f"{where}: not {WHAT} (neither a request body with messages, prompt or "
                    f"input nor a {{body: ...}} wrapper{hint})"
                )
            if not wrapped and any(k in row for k in _AIPERF_KEYS):
                raise ImportFormatError(
                    f"{where}: not {WHAT} (has {', '.join(k for k in _AIPERF_KEYS if k in row)}"
                    ": a Mooncake/AIPerf row; use `import aiperf`)"
                )
            rid = w.get("request_id", w.get("custom_id"))
            rid = str(rid) if rid is not None else f"{stem}-{line:06d}"
            if rid in seen:
                raise ImportFormatError(f"{where}: not {WHAT} (request id {rid!r} repeats)")
            seen.add(rid)
            sid_v = w.get("session_id")
            sid = str(sid_v) if sid_v is not None else rid
            turn_v = w.get("turn")
            if turn_v is not None and not (_int(turn_v) and 0 <= turn_v < 1 << 31):
                raise ImportFormatError(f"{where}: not {WHAT} (turn is not an integer)")
            turn = turn_v if turn_v is not None else turns.get(sid, 0)
            turns[sid] = max(turns.get(sid, 0), turn + 1)

            start = _time(w, "start_us", "timestamp", origin, where)
            if start is None:
                start = prev_start
            prev_start = start
            end = _time(w, "end_us", "end_timestamp", origin, where)

            path = w.get("path", w.get("url"))
            after = w.get("after")
            if after is not None and not (
                isinstance(after, list) and all(isinstance(a, str) for a in after)
            ):
                raise ImportFormatError(f"{where}: not {WHAT} (after is not a list of request ids)")
            if after is not None and rid in after:
                raise ImportFormatError(f"{where}: not {WHAT} (request {rid!r} joins on itself)")
            kw: dict[str, Any] = outcome(w["response"], where) if "response" in w else {}
            if _int(w.get("status")) and 0 <= w["status"] < 1000:
                kw["status"] = w["status"]
            if _int(w.get("ttft_us")):
                kw["ttft_us"] = w["ttft_us"]
            if isinstance(w.get("error"), str):
                kw["error"] = w["error"]
            meta = dict(w["meta"]) if isinstance(w.get("meta"), dict) else {}
            meta.update({k: v for k, v in w.items() if k not in WRAPPER_KEYS})
            prompt = body.get("prompt")
            if kw.get("usage_prompt_tokens") is not None:
                kw["input_tokens"] = kw["usage_prompt_tokens"]  # recorded: better than approx
            elif (
                "messages" not in body and isinstance(prompt, list) and all(_int(t) for t in prompt)
            ):
                kw["input_tokens"] = len(prompt)  # a token-id prompt: exact
            rec = RequestRecord.from_body(
                body,
                request_id=rid,
                session_id=sid,
                turn=turn,
                start_us=start,
                end_us=end,
                path=str(path) if path is not None else None,
                meta=meta or None,
                after=after or None,
                **kw,
            )
            if rec.kind is Kind.CHAT and message_problem(rec.content) is not None:
                rec.kind, rec.content = Kind.RAW, None  # not a chat shape: keep it whole
            yield rec


def _time(
    w: dict[str, Any], us_key: str, ts_key: str, origin: int | None, where: str
) -> int | None:
    v = w.get(us_key)
    if v is not None:
        if not _int(v):
            raise ImportFormatError(f"{where}: not {WHAT} ({us_key} is not an integer)")
        return int(v)
    if w.get(ts_key) is None:
        return None
    t = time_us(w[ts_key])
    if t is None:
        raise ImportFormatError(f"{where}: not {WHAT} ({ts_key} is neither seconds nor ISO 8601)")
    us = t - (origin if origin is not None else t)
    if not _int(us):
        raise ImportFormatError(f"{where}: not {WHAT} ({ts_key} is out of range)")
    return us
