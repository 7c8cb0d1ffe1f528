"""AIPerf's verbatim payloads: the exact bodies an AIPerf (or InferenceX) run
sent, so a run that crashed a server can be bisected request by request.

Two sources, told apart by their content:

* ``inputs.json``, which every AIPerf run writes beside its results:
  ``{"data": [{"session_id", "payloads": [body, ...]}, ...]}``, one entry
  per session, one payload per turn, formatted for the endpoint the run
  used; AIPerf replays it with ``--custom-dataset-type inputs_json``.
* ``raw_payload`` files (``--custom-dataset-type raw_payload``): a JSONL
  file, one body per line and each line its own session; or a directory of
  them, each ``.jsonl`` file one session (its stem the session id), each
  line a turn.

Mapping, and why:

* **Bodies** are kept as they are (equal as JSON; key order kept): the body
  decides its kind with the endpoint (``--endpoint``; by default the one the
  body's shape names: ``messages`` for chat completions, ``input`` for
  Responses, ``prompt`` for completions; AIPerf's ``--endpoint-type
  messages`` bodies look like chat ones, so say ``--endpoint /v1/messages``).
* **Sessions** are the source's, turns in file order; request ids are
  ``<session>:<turn>``.
* **Timing**: neither source records any (AIPerf paces them by its own
  options), so the documented synthetic schedule applies (``--session-gap``,
  ``--think``, ``--api-base``, ``--api-per-token``; a turn's service time
  counts its ``max_tokens`` family). Replay with ``--timing asap`` to send
  them back to back as AIPerf's concurrency mode does.

``replayer export --format aiperf-inputs`` writes a trace back as an
``inputs.json``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from replayer.errors import ImportFormatError
from replayer.trace.importers.common import (
    SessionClock,
    add_timing_arguments,
    iter_jsonl,
    load_json,
    timing_from,
)
from replayer.trace.model import RequestRecord

NAME = "aiperf-payloads"
WHAT = "AIPerf payloads (inputs.json or raw_payload JSONL)"
ENDPOINTS = {
    "messages": "/v1/chat/completions",
    "input": "/v1/responses",
    "prompt": "/v1/completions",
}
"""The path a body's content key names when ``--endpoint`` is not given."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--endpoint",
        default=None,
        metavar="PATH",
        help="the path every body was sent to, e.g. /v1/messages for AIPerf's "
        "--endpoint-type messages (default: by each body's shape)",
    )
    add_timing_arguments(p)


def details(sources: list[Path], opts: argparse.Namespace) -> dict[str, object]:
    t = timing_from(opts)
    return {"timing": "synthetic", "session_gap": t.session_gap, "think": t.think}


def sessions(sources: list[Path]) -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    """(session id, [(where, body), ...]) of every source, in order."""
    for src in sources:
        if src.is_dir():
            files = sorted(src.glob("*.jsonl"))
            if not files:
                raise ImportFormatError(f"{src}: not {WHAT} (a directory without .jsonl files)")
            for f in files:
                yield f.stem, [(f"{f}:{n}", body) for n, body in iter_jsonl(f, WHAT)]
        elif src.suffix == ".jsonl":
            for n, body in iter_jsonl(src, WHAT):
                yield f"{src.stem}-{n:06d}", [(f"{src}:{n}", body)]
        else:
            doc = load_json(src, WHAT)
            data = doc.get("data") if isinstance(doc, dict) else None
            if not isinstance(data, list):
                raise ImportFormatError(f"{src}: not {WHAT} (no top-level data list)")
            for i, entry in enumerate(data):
                where = f"{src}: data[{i}]"
                if not isinstance(entry, dict) or not isinstance(entry.get("payloads"), list):
                    raise ImportFormatError(f"{where}: not {WHAT} (no payloads list)")
                sid = entry.get("session_id")
                sid = str(sid) if sid is not None else f"{src.stem}-{i:06d}"
                yield sid, [(f"{where}.payloads[{k}]", b) for k, b in enumerate(entry["payloads"])]


def _path(body: dict[str, Any], endpoint: str | None) -> str:
    if endpoint:
        return endpoint
    for key, path in ENDPOINTS.items():
        if key in body:
            return path
    return ENDPOINTS["messages"]


def _max_tokens(body: dict[str, Any]) -> int:
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def records(sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]:
    timing = timing_from(opts)
    seen: set[str] = set()
    for index, (sid, turns) in enumerate(sessions(sources)):
        if sid in seen:
            raise ImportFormatError(f"{sid}: not {WHAT} (the session id repeats)")
        seen.add(sid)
        clock = SessionClock(timing, index)
        for turn, (where, body) in enumerate(turns):
            if not isinstance(body, dict) or not body:
                raise ImportFormatError(f"{where}: not {WHAT} (a payload is not a JSON object)")
            start, end = clock.request(_max_tokens(body))
            yield RequestRecord.from_body(
                body,
                request_id=f"{sid}:{turn}",
                session_id=sid,
                turn=turn,
                start_us=start,
                end_us=end,
                path=_path(body, opts.endpoint),
            )
