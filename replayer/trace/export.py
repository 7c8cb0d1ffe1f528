"""``replayer export``: a trace as JSONL, one fully expanded request per line
in trace order, for tools that do not read Arrow. A selection (replay's
``--limit``/``--sessions``/``--requests``) exports only those rows.

``jsonl`` lines are ``{"request_id", "session_id", "turn", "start_us",
"end_us", "path", "body"}``, plus ``abort`` on a request the recorded client
left before its answer ended (:func:`abort_mark`) and ``after`` on a request
that joins on others (the ids whose end it waits for; a join on a request
the selection leaves out is left out, as subsets drop it); ``replayer import
openai-jsonl`` reads them back, the mark as ``meta.abort``. ``aiperf``
lines are AIPerf ``mooncake_trace`` rows: ``session_id``, ``timestamp``
(ms), and ``messages`` (+``tools``), ``text_input``, or ``input_length`` +
``hash_ids`` by payload kind, with ``output_length`` from ``max_tokens`` and
the remaining body parameters under ``extra``. AIPerf sets ``model`` and
streaming itself, so those are left out. Rows also carry ``request_id`` and,
for blocks, ``block_size``: AIPerf ignores unknown keys, and ``replayer
import aiperf`` reads them back. Block ids scoped by a namespace
(kv-cache-tester) become globally unique integers, numbered in order of
first appearance, so traces that reuse local ids never share prompts inside
AIPerf; the sharing structure survives, the token values (a function of the
original ids) do not.

``aiperf-inputs`` writes one AIPerf ``inputs.json`` document: ``{"data":
[{"session_id", "payloads": [body, ...]}, ...]}``, sessions in order of
their first request, each session's bodies in turn order, verbatim (any
kind, ``raw`` included). AIPerf replays it with ``--custom-dataset-type
inputs_json``; ``replayer import aiperf-payloads`` reads it back. Bodies
carry no path: give AIPerf the endpoint.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from replayer.trace.digests import corrupt
from replayer.trace.reader import Trace
from replayer.trace.schema import Kind

FORMATS = ("jsonl", "aiperf", "aiperf-inputs")
# Body keys AIPerf sets itself from its own options.
_AIPERF_OWN = {
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "stream",
    "stream_options",
    "tools",
}


_NOT_AIPERF = frozenset({Kind.RAW, Kind.MESSAGES, Kind.RESPONSES})
"""Kinds a mooncake_trace row cannot carry (it knows chat messages only)."""


def _ms(us: int) -> int | float:
    return us // 1000 if us % 1000 == 0 else round(us / 1000, 3)


def checked_bodies(trace: Trace, rows: Sequence[int] | None = None) -> Iterator[tuple[int, bytes]]:
    """``(row, body)`` of ``rows`` (default: all) in the given order; a body
    whose length is not its recorded ``body_bytes`` is a damaged row, never
    an output."""
    c = trace.column
    sizes = c("body_bytes")
    check = trace.tokens == trace.recorded_tokens
    for row, body in trace.iter_json(rows):
        if check and len(body) != sizes[row]:
            raise corrupt(
                trace.path,
                f"row {row} ({c('request_id')[row]})",
                f"body is {len(body):,} bytes, body_bytes says {sizes[row]:,}",
            )
        yield row, body


def abort_mark(meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Where the recorded client left (a line's ``abort``): ``meta.abort`` as
    recorded, or an older recording's ``meta.abandoned = "client"`` mark in
    that shape (its event count and exchange end). The one reader of the
    mark: the replay (``replayer.replay.aborts.abort_point``) and a bundle's
    ``repro.py`` check its values. None: the client did not leave."""
    if not meta:
        return None
    raw = meta.get("abort")
    if isinstance(raw, Mapping):
        return dict(raw)
    if meta.get("abandoned") != "client":
        return None
    timing = meta.get("timing_us")
    mark = {
        "after_chunks": meta.get("events"),
        "after_us": timing.get("done") if isinstance(timing, Mapping) else None,
    }
    return {k: v for k, v in mark.items() if v is not None}


def jsonl_lines(
    trace: Trace, rows: Sequence[int] | None = None, *, tokens: bool = False
) -> Iterator[bytes]:
    """One JSON line per request, full body; ``tokens`` adds each request's
    ``input_tokens`` (a bundle's ``repro.py`` skips over-context requests by it).
    A row without a recorded finish reason may be one its client left: its
    ``meta`` is read for the mark (an answer read to its end has a reason)."""
    c = trace.column
    finish, after = c("finish_reason"), c("after")
    kept = None if rows is None else {c("request_id")[r] for r in rows}
    for row, body in checked_bodies(trace, rows):
        line: dict[str, Any] = {
            "request_id": c("request_id")[row],
            "session_id": c("session_id")[row],
            "turn": c("turn")[row],
            "start_us": c("start_us")[row],
            "end_us": c("end_us")[row],
            "path": c("path")[row],
        }
        mark = abort_mark(trace.meta(row)) if finish[row] is None else None
        if mark:
            line["abort"] = mark
        joins = [a for a in after[row] or () if kept is None or a in kept]
        if joins:
            line["after"] = joins
        if tokens:
            line["input_tokens"] = c("input_tokens")[row]
        line["body"] = orjson.Fragment(body)
        yield orjson.dumps(line)


def aiperf_lines(
    trace: Trace, skipped: list[str], rows: Sequence[int] | None = None
) -> Iterator[bytes]:
    c = trace.column
    unique: dict[tuple[str, int], int] = {}
    for row in trace.order if rows is None else rows:
        kind = Kind(c("kind")[row])
        if kind in _NOT_AIPERF:
            skipped.append(c("request_id")[row])
            continue
        out: dict[str, Any] = {
            "session_id": c("session_id")[row],
            "timestamp": _ms(c("start_us")[row]),
            "request_id": c("request_id")[row],
        }
        params = orjson.loads(trace.params_text(row))
        if kind is Kind.BLOCKS:
            out["input_length"] = c("input_tokens")[row]
            ids = trace.content(row)
            ns = c("block_ns")[row]
            if ns is not None:
                ids = [unique.setdefault((ns, b), len(unique)) for b in ids]
            out["hash_ids"] = ids
            out["block_size"] = c("block_size")[row]
        elif kind is Kind.CHAT:
            out["messages"] = [orjson.Fragment(m) for m in trace.content(row)]
            if params.get("tools"):
                out["tools"] = params["tools"]
        else:
            out["text_input"] = trace.content(row)
        mt = c("max_tokens")[row]
        if mt is not None:
            out["output_length"] = mt
        extra = {k: v for k, v in params.items() if k not in _AIPERF_OWN}
        if extra:
            out["extra"] = extra
        yield orjson.dumps(out)


def inputs_json(trace: Trace, out: IO[bytes], rows: Sequence[int] | None = None) -> int:
    """``rows`` as an AIPerf ``inputs.json``, session by session (streamed:
    each body is written as it is built); the bodies written."""
    sess, turn = trace.column("session_id"), trace.column("turn")
    order = trace.order if rows is None else list(rows)
    first: dict[str, int] = {}
    for i, r in enumerate(order):
        first.setdefault(sess[r], i)
    grouped = sorted(order, key=lambda r: (first[sess[r]], turn[r], r))
    out.write(b'{"data":[')
    current: str | None = None
    n = 0
    for row, body in checked_bodies(trace, grouped):
        if sess[row] != current:
            if current is not None:
                out.write(b"]},")
            current = sess[row]
            out.write(b'{"session_id":' + orjson.dumps(current) + b',"payloads":[')
        else:
            out.write(b",")
        out.write(body)
        n += 1
    out.write(b"]}]}\n" if current is not None else b"]}\n")
    return n


def write(
    trace: Trace, out: IO[bytes], fmt: str, rows: Sequence[int] | None = None
) -> tuple[int, list[str]]:
    """Write ``rows`` (default: every request, in trace order); returns
    (lines written, request ids skipped)."""
    skipped: list[str] = []
    if fmt == "aiperf-inputs":
        return inputs_json(trace, out, rows), skipped
    lines = jsonl_lines(trace, rows) if fmt == "jsonl" else aiperf_lines(trace, skipped, rows)
    n = 0
    for line in lines:
        out.write(line)
        out.write(b"\n")
        n += 1
    return n, skipped


def export_path(
    trace: Trace, path: Path, fmt: str, rows: Sequence[int] | None = None
) -> tuple[int, list[str]]:
    with path.open("wb") as f:
        return write(trace, f, fmt, rows)
