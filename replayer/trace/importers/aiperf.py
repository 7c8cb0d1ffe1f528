"""AIPerf ``mooncake_trace`` rows (ai-dynamo/aiperf, ``--custom-dataset-type
mooncake_trace``): JSONL, one request per line, with exactly one input mode:

* ``input_length`` (+ optional ``hash_ids``): a synthetic prompt of that many
  tokens, built from ``--block-size``-token blocks (AIPerf's
  ``--isl-block-size``, default 512) named by the hash ids;
* ``text_input``: a literal prompt;
* ``messages`` (+ optional ``tools``): an OpenAI message list;
* ``payload``: a complete request body, sent verbatim;

and optional ``session_id``, ``timestamp`` (ms from the trace start) or
``delay`` (ms), ``output_length`` and ``extra`` (fields shallow-merged into
the body). Mooncake's own traces are valid rows, and ``replayer export
--format aiperf`` writes them; this importer reads both back.

Mapping, and why:

* **Payload kinds**: ``input_length`` → ``blocks`` (``hash_ids`` as block ids,
  ``input_tokens = input_length``; tokens past the named blocks are unique
  tail tokens, as AIPerf also generates fresh text for them); ``text_input``
  → ``text`` (``prompt``); ``messages`` → ``chat`` (``tools`` kept);
  ``payload`` → the body as is (shape decides the kind).
* **Body**: ``{"model"? (--model), content, "tools"?, "max_tokens":
  output_length?, **extra}``: ``extra`` is merged last and wins, as in
  AIPerf. Hash ids are kept as they are (AIPerf's are global to the file).
* **Several files** are independent runs, as AIPerf loads one at a time:
  each file's hash ids get their own namespace (its stem, as ``mooncake``
  does) and its session ids are prefixed ``<stem>/``. A single file keeps
  global ids and its session ids as they are.
* **Sessions**: rows sharing a ``session_id`` form one session, turns in
  file order; a row without one is its own session ``<file stem>-<line, 6
  digits>`` (AIPerf gives each such row a fresh conversation).
  ``message_mode: "delta"`` rows are refused: AIPerf threads *live* replies
  into them, which a trace cannot hold.
* **Timing**: ``timestamp`` ms, exact to the µs from its decimal text.
  ``delay`` is the wait after the previous turn of the session; AIPerf
  counts it from that turn's *completion*, which these rows do not record,
  so here a turn starts at the previous turn's *start* + ``delay`` (a lower
  bound on the real gap). A row with neither starts with its session's
  previous turn (0 for a first turn).
* **Ids**: a row's ``request_id`` when present (a replayer extension AIPerf
  ignores), else ``<session>:<turn>``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from replayer.errors import ImportFormatError
from replayer.trace.importers.common import (
    is_int64,
    iter_jsonl,
    message_problem,
    positive_int,
    seconds_to_us,
    unique_stems,
)
from replayer.trace.model import RequestRecord
from replayer.trace.schema import Kind

NAME = "aiperf"
WHAT = "an AIPerf mooncake_trace"
MODES = ("input_length", "text_input", "messages", "payload")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--block-size",
        type=positive_int,
        default=512,
        help="tokens per hash block, AIPerf's --isl-block-size (default 512)",
    )
    p.add_argument("--model", default=None, help="model name for the bodies (default: none)")


def details(sources: list[Path], opts: argparse.Namespace) -> dict[str, object]:
    return {"block_size": opts.block_size}


_int = is_int64


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v >= 0


def records(sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]:
    turns: dict[str, int] = {}
    last_start: dict[str, int] = {}
    seen: set[str] = set()
    several = len(sources) > 1
    for src, stem in zip(sources, unique_stems(sources), strict=True):
        ns = stem if several else None  # files are independent runs: see module doc
        for line, row in iter_jsonl(src, WHAT):
            where = f"{src}:{line}"

            def bad(why: str, where: str = where) -> ImportFormatError:
                return ImportFormatError(f"{where}: not {WHAT} ({why})")

            if not isinstance(row, dict):
                raise bad("a row is not a JSON object")
            modes = [k for k in MODES if row.get(k) is not None]
            if len(modes) != 1:
                raise bad(
                    f"has {' and '.join(modes)}; exactly one of {', '.join(MODES)} is allowed"
                    if modes
                    else f"no input: needs one of {', '.join(MODES)}"
                )
            if row.get("message_mode", "history") != "history":
                raise bad("message_mode 'delta' needs live replies, which a trace cannot hold")
            sid_v = row.get("session_id")
            sid = str(sid_v) if sid_v is not None else f"{stem}-{line:06d}"
            if several and sid_v is not None:
                sid = f"{stem}/{sid}"
            turn = turns.get(sid, 0)
            turns[sid] = turn + 1
            if row.get("timestamp") is not None:
                if not _number(row["timestamp"]):
                    raise bad("timestamp must be a non-negative number of ms")
                start = seconds_to_us(row["timestamp"], 1000)
            elif row.get("delay") is not None:
                if not _number(row["delay"]):
                    raise bad("delay must be a non-negative number of ms")
                start = last_start.get(sid, 0) + seconds_to_us(row["delay"], 1000)
            else:
                start = last_start.get(sid, 0)
            if not _int(start):
                raise bad("timestamp or delay out of range")
            last_start[sid] = start
            rid_v = row.get("request_id")
            rid = str(rid_v) if rid_v is not None else f"{sid}:{turn}"
            if rid in seen:
                raise bad(f"request id {rid!r} repeats")
            seen.add(rid)

            out = row.get("output_length")
            if out is not None and not _int(out):
                raise bad("output_length must be an integer")
            extra = row.get("extra")
            if extra is not None and not isinstance(extra, dict):
                raise bad("extra must be an object")
            mode = modes[0]
            if mode == "payload":
                if not isinstance(row["payload"], dict) or not row["payload"]:
                    raise bad("payload must be a non-empty object")
                rec = RequestRecord.from_body(
                    row["payload"], request_id=rid, session_id=sid, turn=turn, start_us=start
                )
                prompt = row["payload"].get("prompt")
                if rec.kind is Kind.CHAT and message_problem(rec.content) is not None:
                    rec.kind, rec.content = Kind.RAW, None  # not a chat shape: keep it whole
                elif rec.kind is Kind.RAW and isinstance(prompt, list) and all(map(_int, prompt)):
                    rec.input_tokens = len(prompt)  # a token-id prompt: exact
                yield rec
                continue

            params: dict[str, Any] = {}
            if opts.model:
                params["model"] = opts.model
            kw: dict[str, Any] = {}
            content: Any
            if mode == "input_length":
                n = row["input_length"]
                ids = row.get("hash_ids")
                if ids is None:
                    ids = []
                if not _int(n) or n < 0:
                    raise bad("input_length must be a non-negative integer")
                if not isinstance(ids, list) or not all(_int(h) for h in ids):
                    raise bad("hash_ids must be a list of integers")
                kind, content = Kind.BLOCKS, ids
                params["prompt"] = None
                bs = row.get("block_size", opts.block_size)  # replayer extension
                if not _int(bs) or bs < 1:
                    raise bad("block_size must be a positive integer")
                kw = {"block_size": bs, "input_tokens": n, "block_ns": ns}
            elif mode == "text_input":
                if not isinstance(row["text_input"], str):
                    raise bad("text_input must be a string")
                kind, content = Kind.TEXT, row["text_input"]
                params["prompt"] = None
            else:
                msgs = row["messages"]
                problem = message_problem(msgs)
                if problem is not None:
                    raise bad(problem)
                kind, content = Kind.CHAT, msgs
                params["messages"] = None
                if row.get("tools") is not None:
                    if not isinstance(row["tools"], list):
                        raise bad("tools must be a list")
                    params["tools"] = row["tools"]
            if row.get("hash_ids") is not None and mode != "input_length":
                raise bad("hash_ids is only allowed with input_length")
            if row.get("tools") is not None and mode != "messages":
                raise bad("tools is only allowed with messages")
            if out is not None:
                params["max_tokens"] = out
            if extra:
                if kind.content_key in extra:
                    raise bad(f"extra must not hold {kind.content_key!r}, the row's input")
                params.update(extra)
            yield RequestRecord(
                request_id=rid,
                session_id=sid,
                turn=turn,
                start_us=start,
                kind=kind,
                params=params,
                content=content,
                **kw,
            )
