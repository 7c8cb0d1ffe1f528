"""``replayer inspect``: the figures a user checks before replaying a trace.

Everything comes from the index columns, so inspecting a multi-GB trace reads
no content. Percentiles use the nearest-rank definition (the smallest value
with at least p% of the data at or below it), so every figure is a value that
really occurs in the trace.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from replayer.trace.reader import Trace


def synthetic_note(kinds: dict[str, int]) -> str | None:
    """One plain line when prompts are synthetic token ids (kind ``blocks``,
    random ids from hash ids): they never give the logits real text does, so a
    content-dependent crash may not reproduce. None when there are none."""
    blocks = kinds.get("blocks", 0)
    if not blocks:
        return None
    total = sum(kinds.values())
    return (
        f"note: {blocks:,} of {total:,} requests send synthetic token ids (kind blocks), "
        "not text: a crash that depends on content (the logits real text gives, e.g. in "
        "speculative decoding) may not reproduce; to keep it, record the real prompts "
        "(replayer record, or an importer whose source keeps the text)"
    )


def trace_notes(trace: Trace, rows: Sequence[int] | None = None) -> tuple[str, ...]:
    """Plain lines a replay of ``rows`` (default all) says beside its summary."""
    kinds = trace.column("kind")
    got = Counter(str(kinds[r]) for r in (rows if rows is not None else range(len(kinds))))
    note = synthetic_note(dict(got))
    return (note,) if note else ()


def percentile(sorted_values: Sequence[int | float], p: float) -> int | float | None:
    """Nearest-rank percentile of an ascending sequence (None when empty)."""
    if not sorted_values:
        return None
    k = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[k - 1]


def summarize(values: Sequence[int | float]) -> dict[str, Any]:
    s = sorted(values)
    return {
        "min": s[0] if s else None,
        "p50": percentile(s, 50),
        "p90": percentile(s, 90),
        "p99": percentile(s, 99),
        "max": s[-1] if s else None,
        "mean": (sum(s) / len(s)) if s else None,
    }


def inspect_trace(trace: Trace, rows: Sequence[int] | None = None) -> dict[str, Any]:
    """The trace's shape; of ``rows`` only (a selection) when given."""
    sel = list(trace.order) if rows is None else list(rows)

    def col(name: str) -> list[Any]:
        c = trace.column(name)
        return [c[r] for r in sel]

    sessions = col("session_id")
    starts = col("start_us")
    ends = col("end_us")
    tokens = col("input_tokens")
    body_bytes = col("body_bytes")
    turns_per_session = Counter(sessions)
    n = len(sel)
    first = min(starts) if n else 0
    last = max(max(starts), max((e for e in ends if e is not None), default=0)) if n else 0
    disk = trace.path.stat().st_size
    expanded = sum(body_bytes)
    out = {
        "path": str(trace.path),
        "form": trace.form,
        "schema_version": trace.schema_version,
        "torn_tail": trace.torn_tail,
        "provenance": trace.provenance,
        "requests": n,
        "sessions": len(turns_per_session),
        "turns_per_session": summarize(list(turns_per_session.values())),
        "input_tokens": summarize(tokens),
        "max_tokens": summarize([m for m in col("max_tokens") if m is not None]),
        "duration_s": (last - first) / 1e6,
        "kinds": dict(Counter(col("kind"))),
        "paths": dict(Counter(col("path"))),
        "models": dict(Counter(m for m in col("model") if m is not None)),
        "bytes_on_disk": disk,
        "bytes_expanded": expanded,
        "expansion_ratio": (expanded / disk) if disk else None,
        "keyframes": sum(1 for b in col("base") if b is None),
    }
    out["joins"] = fan_out(trace, sel)
    if rows is not None:
        out["selection_of"] = len(trace)
    return out


def fan_out(trace: Trace, rows: Sequence[int]) -> dict[str, Any]:
    """The joins among ``rows`` (a join on a row outside them is dropped, as
    a replay of them drops it). A *sub-session* is one whose first request
    joins on another session's request (a sub-agent launched by it); its
    *parent* is that request's session."""
    after, rid = trace.column("after"), trace.column("request_id")
    sess, turn = trace.column("session_id"), trace.column("turn")
    session_of = {rid[r]: sess[r] for r in rows}
    joins = waiting = 0
    first_turn: dict[str, int] = {}
    for r in rows:
        if sess[r] not in first_turn or turn[r] < turn[first_turn[sess[r]]]:
            first_turn[sess[r]] = r
    children: Counter[str] = Counter()
    for r in rows:
        names = [a for a in after[r] or () if a in session_of]
        if not names:
            continue
        joins += len(names)
        waiting += 1
        if first_turn[sess[r]] == r:
            parent = next((session_of[a] for a in names if session_of[a] != sess[r]), None)
            if parent is not None:
                children[parent] += 1
    return {
        "joins": joins,
        "requests_waiting": waiting,
        "sub_sessions": sum(children.values()),
        "sessions_with_sub_sessions": len(children),
        "sub_sessions_per_parent": summarize(list(children.values())),
    }


def prefix_cache_figures(
    trace: Trace, block_size: int, selection: Sequence[int] | None = None
) -> dict[str, Any]:
    """``inspect --prefix-cache B``: the ideal hit ratio of the blocks rows
    (of the selection, replayed alone, when given)."""
    kinds = trace.column("kind")
    rows = [r for r in (trace.order if selection is None else selection) if kinds[r] == "blocks"]
    if not rows:
        return {"block_size": block_size, "requests": 0, "hit_ratio": None}
    hits = ideal_prefix_hits(trace, rows, block_size)
    prompt = sum(trace.column("input_tokens")[r] for r in rows)
    return {
        "block_size": block_size,
        "requests": len(rows),
        "prompt_tokens": prompt,
        "hit_tokens": sum(hits),
        "hit_ratio": round(sum(hits) / prompt, 4) if prompt else None,
    }


def prefix_cache_hits(prompts: Iterable[Sequence[int]], block_size: int) -> list[int]:
    """Per prompt, in order, the tokens an ideal prefix cache would serve: a
    cache that never evicts, holds every full ``block_size``-token block it
    has computed, and (as vLLM does) never serves a prompt's last token, so
    the hit is the longest run of leading full blocks seen before, each block
    keyed by every token up to its end. This is what a blocks trace's hash
    ids promise a server with that block size, and what a replay is compared
    with."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    seen: set[int] = set()
    out: list[int] = []
    for tokens in prompts:
        usable = max(0, len(tokens) - 1) // block_size
        chain, hit, hitting, keys = 0, 0, True, []
        for i in range(len(tokens) // block_size):
            chain = hash((chain, tuple(tokens[i * block_size : (i + 1) * block_size])))
            keys.append(chain)
            if hitting and i < usable and chain in seen:
                hit += 1
            else:
                hitting = False
        seen.update(keys)
        out.append(hit * block_size)
    return out


def ideal_prefix_hits(trace: Trace, rows: Sequence[int], block_size: int) -> list[int]:
    """:func:`prefix_cache_hits` of the token-id prompts of blocks ``rows``
    (in the given order, which is the order a strict replay sends them)."""
    kinds = trace.column("kind")
    bad = [r for r in rows if kinds[r] != "blocks"]
    if bad:
        raise ValueError(f"row {bad[0]} is {kinds[bad[0]]}, not blocks")
    return prefix_cache_hits((trace.block_tokens(r) for r in rows), block_size)


def _fmt_int(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.1f}"
    return f"{int(v):,}"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


def render_text(info: dict[str, Any]) -> str:
    def dist(d: dict[str, Any]) -> str:
        return "  ".join(f"{k} {_fmt_int(d[k])}" for k in ("min", "p50", "p99", "max"))

    prov = info["provenance"]
    lines = [
        f"trace        {info['path']}  ({info['form']}, schema v{info['schema_version']}"
        + (", TORN TAIL DROPPED" if info["torn_tail"] else "")
        + ")",
        f"source       {prov.get('source', '?')}  created {prov.get('created_at', '?')}"
        f"  by replayer {prov.get('tool_version', '?')}",
        f"requests     {info['requests']:,}"
        + (f"  (selected of {info['selection_of']:,})" if "selection_of" in info else ""),
        f"sessions     {info['sessions']:,}",
        f"turns/sess   {dist(info['turns_per_session'])}",
        f"context tok  {dist(info['input_tokens'])}",
        f"duration     {info['duration_s']:,.1f} s",
        "kinds        " + ", ".join(f"{k} {v:,}" for k, v in sorted(info["kinds"].items())),
        "models       "
        + (", ".join(f"{k} {v:,}" for k, v in sorted(info["models"].items())) or "-"),
        f"on disk      {_fmt_bytes(info['bytes_on_disk'])}",
        f"expanded     {_fmt_bytes(info['bytes_expanded'])}"
        + (f"  ({info['expansion_ratio']:,.1f}x)" if info["expansion_ratio"] else ""),
    ]
    j = info.get("joins")
    if j and j["joins"]:
        per = j["sub_sessions_per_parent"]
        lines.append(
            f"joins        {j['joins']:,} (requests waiting for others' ends: "
            f"{j['requests_waiting']:,})"
        )
        if j["sub_sessions"]:
            lines.append(
                f"sub-agents   {j['sub_sessions']:,} in {j['sessions_with_sub_sessions']:,}"
                f" sessions; per parent {dist(per)}"
            )
    pc = info.get("prefix_cache")
    if pc:
        ratio = "-" if pc["hit_ratio"] is None else f"{pc['hit_ratio']:.1%}"
        lines.append(
            f"prefix cache {ratio} ideal hit ratio at {pc['block_size']}-token blocks"
            f" ({pc['requests']:,} blocks requests, never evicting)"
        )
    return "\n".join(lines)
