"""kv-cache-tester Claude Code sessions (callanjfox/kv-cache-tester): one JSON
document per session with 64-token hash ids, per-request ``t`` (seconds from
session start), ``api_time``, ``think_time`` and sub-agents.

Hash ids are local to a trace (``hash_id_scope: local``), so each is
scoped by their trace id (``block_ns``): blocks of different traces never
share tokens by accident, and the ids stay the source's own. Sub-agents share
their parent's namespace (their system prompts hit each other's blocks) and
become their own sessions, ``<trace>/<agent_id>``. Only full blocks are
hashed; the ``in % 64`` remaining tokens are unique per request. Sessions
(files) start together by default; ``--session-gap`` or ``--session-rate``
spread them.

Sub-agents and joins, as measured over the corpus's 63 sub-agents
(docs/importers.md has the figures): a sub-agent's ``t`` is when its result
came back, not when it started. One with a ``duration_ms`` (59, all
``completed``) ran from ``t - duration_ms``, which is 0.1-1.1 s after the end
of the parent request before it in the document (57 of 59; the other two
follow a 40-hour pause); placed there, no parent request falls inside any
sub-agent's run (placed at ``t``, 153 did, in 50 sub-agents). So: its first
request joins on that parent request (fan-out), and the parent's next
request in the document joins on its last request (fan-in): the parent's
think time before that request spans the whole sub-agent, within 0.85 s, in
all 57 that have one. A sub-agent without ``duration_ms`` (4,
``async_launched``) starts at ``t`` (0.3 s after its launching request) and
runs in the background: fan-out only.
"""

from __future__ import annotations

import argparse
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from replayer.errors import ImportFormatError
from replayer.trace.importers.common import US, load_json, require, session_starts
from replayer.trace.model import RequestRecord
from replayer.trace.schema import Kind

NAME = "kv-cache-tester"
WHAT = "a kv-cache-tester trace"
# api_time is end_us - start_us and type is the body's stream flag; the rest
# has no column of its own.
_META_KEYS = ("input_types", "output_types", "stop", "think_time")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--session-gap",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds between session starts (default 0: all start together)",
    )
    p.add_argument(
        "--session-rate",
        type=float,
        default=None,
        metavar="R",
        help="instead of a fixed gap, Poisson session arrivals at R per second",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the arrival process")


def details(sources: list[Path], opts: argparse.Namespace) -> dict[str, object]:
    return {
        "session_gap": opts.session_gap,
        "session_rate": opts.session_rate,
        "seed": opts.seed,
        "files": len(expand(sources)),
    }


def expand(sources: list[Path]) -> list[Path]:
    files: list[Path] = []
    for s in sources:
        if s.is_dir():
            found = sorted(p for p in s.iterdir() if p.name.endswith((".json", ".json.gz")))
            if not found:
                raise ImportFormatError(f"{s}: directory holds no .json or .json.gz traces")
            files.extend(found)
        else:
            files.append(s)
    return files


def records(sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]:
    files = expand(sources)
    starts = session_starts(len(files), opts.session_gap, opts.session_rate, opts.seed)
    for path, t0 in zip(files, starts, strict=True):
        doc = load_json(path, WHAT)
        require(isinstance(doc, dict), path, WHAT, "top level is not an object")
        missing = [k for k in ("id", "block_size", "requests") if k not in doc]
        require(not missing, path, WHAT, f"no {', '.join(missing)}")
        tid = str(doc["id"])
        bs = int(doc["block_size"])
        yield from _session(path, tid, doc["requests"], t0, tid, bs, sub=None)


def subagent_start(entry: dict[str, Any]) -> tuple[float, bool]:
    """(start in the parent's clock, joined): a sub-agent with a duration
    ended at its ``t`` and its parent waited for it; one without (launched
    in the background) started at ``t``. See the module doc."""
    t = float(entry["t"])
    d = entry.get("duration_ms")
    if isinstance(d, int | float) and not isinstance(d, bool) and d >= 0:
        return max(0.0, t - d / 1000), True
    return t, False


def _session(
    path: Path,
    sid: str,
    reqs: list[Any],
    t0: float,
    ns: str,
    bs: int,
    sub: dict[str, Any] | None,
    launch: str | None = None,
) -> Generator[RequestRecord, None, str | None]:
    """The session's requests, its sub-agents' spliced in; returns the id of
    its last request. ``launch``: the request its first one joins on."""
    require(isinstance(reqs, list), path, WHAT, f"{sid}: requests is not a list")
    turn = 0
    last: str | None = None
    pending: list[str] = []  # sub-agents' last requests the next turn joins on
    for r in reqs:
        require(isinstance(r, dict) and "t" in r, path, WHAT, f"{sid}: a request has no t")
        if r.get("type") == "subagent":
            agent = f"{sid}/{r.get('agent_id') or 'agent@' + str(r['t'])}"
            info = {k: r[k] for k in ("subagent_type", "duration_ms", "status") if k in r}
            start, joined = subagent_start(r)
            end = yield from _session(
                path,
                agent,
                r.get("requests") or [],
                t0 + start,
                ns,
                bs,
                sub={"parent_session": sid, **info},
                launch=last,
            )
            if joined and end is not None:
                pending.append(end)
            continue
        missing = [k for k in ("in", "out", "hash_ids") if k not in r]
        require(not missing, path, WHAT, f"{sid}: a request has no {', '.join(missing)}")
        ids = r["hash_ids"]
        require(isinstance(ids, list), path, WHAT, f"{sid}: hash_ids is not a list")
        start = t0 + float(r["t"])
        api = r.get("api_time")
        meta = {k: r[k] for k in _META_KEYS if k in r}
        if sub is not None and turn == 0:
            meta.update(sub)
        if not r["out"]:
            # recorded with no output (27 of the corpus's 49,334); vLLM rejects
            # max_tokens 0, and the prefill is what a crash hunt replays
            meta["recorded_out"] = r["out"]
        params: dict[str, Any] = {
            "model": r.get("model"),
            "prompt": None,
            "max_tokens": max(1, r["out"]),
            "ignore_eos": True,
            "stream": r.get("type") == "s",
        }
        if params["model"] is None:
            del params["model"]
        ttft = r.get("ttft")
        # ``in``/``out`` are the recorded usage; they live in input_tokens and
        # max_tokens (exact for blocks), so the usage columns stay empty.
        after = pending if turn else ([launch] if launch is not None else []) + pending
        last = f"{sid}:{turn}"
        yield RequestRecord(
            request_id=last,
            session_id=sid,
            turn=turn,
            start_us=round(start * US),
            end_us=round((start + float(api)) * US) if api is not None else None,
            kind=Kind.BLOCKS,
            params=params,
            content=ids,
            block_size=bs,
            block_ns=ns,
            input_tokens=int(r["in"]),
            status=200,
            ttft_us=round(float(ttft) * US) if ttft is not None else None,
            meta=meta,
            after=after or None,
        )
        pending = []
        turn += 1
    return last
