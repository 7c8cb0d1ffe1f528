"""kv-cache-tester Claude Code sessions (callanjfox/kv-cache-tester): one JSON
document per session with 64-token hash ids, per-request ``t`` (seconds from
session start), ``api_time``, ``think_time`` and sub-agents.

Hash ids are local to a trace (``hash_id_scope: local``), so each is
scoped by their trace id (``block_ns``): blocks of different traces never
share tokens by accident, and the ids stay the source's own. Sub-agents share
their parent's namespace (their system prompts hit each other's blocks) and
become their own sessions, ``<trace>/<agent_id>``, starting at the
sub-agent's ``t`` in the parent's clock. Only full blocks are hashed; the
``in % 64`` remaining tokens are unique per request. Sessions (files) start
together by default; ``--session-gap`` or ``--session-rate`` spread them.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
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


def _session(
    path: Path, sid: str, reqs: list[Any], t0: float, ns: str, bs: int, sub: dict[str, Any] | None
) -> Iterator[RequestRecord]:
    require(isinstance(reqs, list), path, WHAT, f"{sid}: requests is not a list")
    turn = 0
    for r in reqs:
        require(isinstance(r, dict) and "t" in r, path, WHAT, f"{sid}: a request has no t")
        if r.get("type") == "subagent":
            agent = f"{sid}/{r.get('agent_id') or 'agent@' + str(r['t'])}"
            info = {k: r[k] for k in ("subagent_type", "duration_ms", "status") if k in r}
            yield from _session(
                path,
                agent,
                r.get("requests") or [],
                t0 + float(r["t"]),
                ns,
                bs,
                sub={"parent_session": sid, **info},
            )
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
        yield RequestRecord(
            request_id=f"{sid}:{turn}",
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
        )
        turn += 1
