"""Mooncake FAST'25 traces (kvcache-ai/Mooncake): JSONL rows of
``{timestamp (ms), input_length, output_length, hash_ids}`` with 512-token
prefix-block hash ids and no session ids.

Sessions are inferred from hash-id prefix chains: a request continues the
latest earlier request whose full-block chain (its ids minus a partial last
block) is a prefix of its own, at least two blocks long (every conversation
request shares block 0, the system prompt). Mooncake ids are prefix-unique,
so "chain of R is a prefix of mine" is "my id at R's last full position is
R's last full id", one dict lookup per position.

When two requests continue the same one, ``--forks split`` (default) starts a
new session for the later one (delta-encoded against the shared parent, the
recorder's rule); ``--forks join`` keeps them in one session, which is how the
data README counts chains.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from replayer.trace.importers.common import iter_jsonl, require
from replayer.trace.model import RequestRecord
from replayer.trace.schema import Kind

NAME = "mooncake"
WHAT = "a Mooncake trace"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block-size", type=int, default=512, help="tokens per hash block (512)")
    p.add_argument(
        "--forks",
        choices=("split", "join"),
        default="split",
        help="a request continuing an already-continued one: new session or same",
    )
    p.add_argument(
        "--min-chain",
        type=int,
        default=2,
        help="shortest shared block chain that links two requests (2)",
    )
    p.add_argument("--model", default=None, help="model name for the bodies (default: none)")


def details(sources: list[Path], opts: argparse.Namespace) -> dict[str, object]:
    return {"block_size": opts.block_size, "forks": opts.forks, "min_chain": opts.min_chain}


def records(sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]:
    bs = opts.block_size
    for src in sources:
        stem = src.name.split(".")[0]
        # ids of different files must not collide: several files, one namespace each
        ns = stem if len(sources) > 1 else None
        last_full: dict[tuple[int, int], int] = {}  # (chain length, last id) -> request
        session_of: list[str] = []
        session_last: dict[str, int] = {}
        session_turns: dict[str, int] = {}
        for i, (line, row) in enumerate(iter_jsonl(src, WHAT)):
            require(isinstance(row, dict), f"{src}:{line}", WHAT, "a row is not an object")
            missing = [k for k in ("timestamp", "input_length", "hash_ids") if k not in row]
            require(not missing, f"{src}:{line}", WHAT, f"no {', '.join(missing)}")
            ids = row["hash_ids"]
            n_in = row["input_length"]
            require(
                isinstance(ids, list) and isinstance(n_in, int),
                f"{src}:{line}",
                WHAT,
                "hash_ids must be a list and input_length an integer",
            )
            parent = None
            for k in range(opts.min_chain, len(ids) + 1):
                j = last_full.get((k, ids[k - 1]))
                if j is not None and (parent is None or j > parent):
                    parent = j
            if parent is not None and (
                opts.forks == "join" or session_last[session_of[parent]] == parent
            ):
                sid = session_of[parent]
            else:
                sid = f"{stem}-s{i:06d}"
            turn = session_turns.get(sid, 0)
            session_turns[sid] = turn + 1
            session_of.append(sid)
            session_last[sid] = i
            full = n_in // bs
            if full >= 1 and full <= len(ids):
                last_full[(full, ids[full - 1])] = i
            params: dict[str, object] = {}
            if opts.model:
                params["model"] = opts.model
            params["prompt"] = None
            out = row.get("output_length")
            if isinstance(out, int):
                params["max_tokens"] = out
            params["ignore_eos"] = True
            yield RequestRecord(
                request_id=f"{stem}-{i:06d}",
                session_id=sid,
                turn=turn,
                start_us=round(float(row["timestamp"]) * 1000),
                kind=Kind.BLOCKS,
                params=params,
                content=ids,
                block_size=bs,
                block_ns=ns,
                input_tokens=n_in,
                base_hint=f"{stem}-{parent:06d}" if parent is not None else None,
                usage_prompt_tokens=n_in,
                usage_completion_tokens=out if isinstance(out, int) else None,
            )
