"""Recording segments: a restart never overwrites, and ``merge`` joins the pieces.

``replayer record -o rec.arrow`` writes ``rec.arrow`` if it does not exist,
else the next free segment ``rec.1.arrow``, ``rec.2.arrow`` … (one higher
than the highest present). The file is claimed with ``O_EXCL``, so two
recorders started at once never share one.

:func:`merge` joins segments (or any traces) into one trace:

* **time**: each recorder segment stores the wall clock of its time zero
  (``provenance.t0_unix_us``); rows are placed on the earliest segment's
  clock and sorted into trace order. Traces without that anchor are placed
  one after another, in the order given.
* **request ids**: the first occurrence (in trace order) keeps its id; a
  later duplicate becomes ``<id>~s<segment>`` (``.2``, ``.3`` … if still
  taken), the original kept in ``meta.original_request_id``. Deterministic
  for the same inputs.
* **sessions**: sessions named by a header (or by a non-recorder trace) keep
  their names, so a session that spans a restart joins up. Inferred sessions
  are re-inferred over the merged traffic with the live rules
  (:mod:`replayer.record.sessions`), replaying each exchange's completion at
  the recorded moment its reply was known (``meta.timing_us.reply``, else
  its end): a conversation continued after a restart links back to the
  turns recorded before it. Within one segment the result is the recorder's
  own.

Bodies are rebuilt from each segment and delta-encoded afresh; the output is
an IPC *file* (random access), like ``import`` and ``synth`` write.
"""

from __future__ import annotations

import heapq
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from replayer.errors import TraceError, UsageError
from replayer.record.sessions import SessionTracker
from replayer.trace.model import TraceMeta
from replayer.trace.reader import Trace
from replayer.trace.schema import Kind
from replayer.trace.writer import TraceWriter

_INFERRED = frozenset({"new", "next", "fork"})


def segment_path(out: Path, k: int) -> Path:
    """``rec.arrow`` for k = 0, ``rec.<k>.arrow`` after."""
    if k == 0:
        return out
    return out.with_name(f"{out.stem}.{k}{out.suffix}")


def existing_segments(out: Path) -> list[tuple[int, Path]]:
    """The segments of ``out`` on disk, by number."""
    found: list[tuple[int, Path]] = []
    if out.exists():
        found.append((0, out))
    pat = re.compile(re.escape(out.stem) + r"\.(\d+)" + re.escape(out.suffix) + "$")
    if out.parent.is_dir():
        for p in out.parent.iterdir():
            m = pat.match(p.name)
            if m and int(m.group(1)) > 0:
                found.append((int(m.group(1)), p))
    return sorted(found)


def claim(out: Path) -> tuple[Path, int]:
    """Create (exclusively) the file to record into: ``out`` or its next segment."""
    if out.is_dir():
        raise UsageError(f"{out} is a directory; -o wants a trace file")
    out.parent.mkdir(parents=True, exist_ok=True)
    have = existing_segments(out)
    k = have[-1][0] + 1 if have else 0
    for _ in range(10_000):
        path = segment_path(out, k)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            k += 1
            continue
        except OSError as exc:
            raise UsageError(f"cannot create {path}: {exc.strerror}") from None
        os.close(fd)
        return path, k
    raise UsageError(f"no free segment name for {out}")


@dataclass(frozen=True, slots=True)
class _Row:
    at: int  # absolute start, µs on the merged clock
    seg: int
    order: int
    row: int
    content: Any


@dataclass
class MergeResult:
    rows: int
    segments: int
    renamed: int
    """Request ids changed to resolve collisions."""
    relinked: int
    """Rows whose session changed (re-linked across segments)."""
    sessions: int


def merge(paths: Sequence[Path], out: Path) -> MergeResult:
    """Join ``paths`` into the trace ``out`` (written in place; callers use atomic_output)."""
    if not paths:
        raise UsageError("nothing to merge")
    traces = [Trace.open(p) for p in paths]
    anchors = _anchors(traces)
    if len(set(anchors)) == len(anchors) and anchors != sorted(anchors):
        # recorder segments: number them in the order they were recorded
        pairs = sorted(zip(anchors, range(len(traces)), strict=True))
        traces = [traces[i] for _, i in pairs]
        anchors = [a for a, _ in pairs]
    base = min(anchors)
    tokens = traces[0].tokens
    for t in traces[1:]:
        if t.tokens != tokens:
            raise TraceError(f"{t.path}: its token space differs from {traces[0].path}'s")

    def rows_of(seg: int) -> Iterator[_Row]:
        t = traces[seg]
        start = t.column("start_us")
        for i, (row, content) in enumerate(t.iter_content(t.order)):
            yield _Row(anchors[seg] - base + start[row], seg, i, row, content)

    streams = [rows_of(k) for k in range(len(traces))]
    merged = heapq.merge(*streams, key=lambda r: (r.at, r.seg, r.order))
    details = {
        "segments": [_segment_facts(t, anchors[k]) for k, t in enumerate(traces)],
        "t0_unix_us": base,
        "redaction": {"applied": any(_redacted(t) for t in traces)},
    }
    tracker = SessionTracker()
    pending: list[tuple[int, int, str, Any, bool]] = []
    used: set[str] = set()
    ids: dict[tuple[int, str], str] = {}
    """(segment, recorded id) -> merged id: a join names its own segment's ids."""
    renamed = relinked = n = 0
    sessions: set[str] = set()
    with TraceWriter(
        out, TraceMeta(source="merge", details=details, tokens=tokens), form="file"
    ) as w:
        for r in merged:
            t = traces[r.seg]
            c = t.column
            kind = Kind(c("kind")[r.row])
            old_id = c("request_id")[r.row]
            rid = ids[(r.seg, old_id)] = _unique(old_id, r.seg, used)
            renamed += rid != old_id
            while pending and pending[0][0] <= r.at:
                _, _, done_id, reply, ok = heapq.heappop(pending)
                tracker.complete(done_id, reply, ok=ok)
            meta = t.meta(r.row) or {}
            outcome = t.outcome(r.row)
            body = _tracker_body(kind, r.content)
            source = meta.get("session")
            old_sid = c("session_id")[r.row]
            # an inferred session is inferred again (raw bodies: each one alone)
            raw_alone = None if body is not None else f"s-{rid}"
            header = raw_alone if source in _INFERRED else old_sid
            a = tracker.assign(rid, body, header)
            end = c("end_us")[r.row]
            end_at = r.at if end is None else anchors[r.seg] - base + end
            # the live recorder learned a streamed reply at [DONE], maybe before the end
            learned = meta.get("timing_us", {}).get("reply")
            known_at = r.at + learned if isinstance(learned, int) else end_at
            heapq.heappush(pending, (known_at, n, rid, _reply(kind, outcome), _ok(outcome, meta)))
            if a.session_id != old_sid:
                relinked += 1
                meta["recorded_session"] = old_sid
            if source in _INFERRED:
                meta["session"] = a.source
                if a.parent is not None:
                    meta["parent"] = a.parent
                else:
                    meta.pop("parent", None)
            if rid != old_id:
                meta["original_request_id"] = old_id
            meta["segment"] = r.seg
            sessions.add(a.session_id)
            rec = t.record(r.row, content=r.content)
            w.add(
                replace(
                    rec,
                    request_id=rid,
                    after=None
                    if rec.after is None
                    else [ids.get((r.seg, x), x) for x in rec.after],
                    session_id=a.session_id,
                    turn=a.turn,
                    start_us=r.at,
                    end_us=None if end is None else end_at,
                    base_hint=a.parent,
                    meta=meta,
                )
            )
            n += 1
    return MergeResult(
        rows=n, segments=len(traces), renamed=renamed, relinked=relinked, sessions=len(sessions)
    )


def _anchors(traces: Sequence[Trace]) -> list[int]:
    """Each trace's time zero on a shared clock (µs)."""
    t0 = [t.provenance.get("t0_unix_us") for t in traces]
    if all(isinstance(x, int) for x in t0):
        return [int(x) for x in t0]  # type: ignore[arg-type]
    out: list[int] = []
    at = 0
    for t in traces:  # no wall clock: one after another
        out.append(at)
        starts = t.column("start_us")
        ends = [e for e in t.column("end_us") if e is not None]
        at += max([*starts, *ends], default=0) + 1
    return out


def _segment_facts(t: Trace, anchor: int) -> dict[str, Any]:
    p = t.provenance
    facts: dict[str, Any] = {"path": str(t.path), "rows": len(t), "source": p.get("source")}
    for key in ("upstream", "segment", "t0_unix_us"):
        if key in p:
            facts[key] = p[key]
    if t.torn_tail:
        facts["torn_tail"] = True
    return facts


def _redacted(t: Trace) -> bool:
    red = t.provenance.get("redaction")
    return bool(isinstance(red, dict) and red.get("applied"))


def _unique(rid: str, seg: int, used: set[str]) -> str:
    new = rid if rid not in used else f"{rid}~s{seg}"
    k = 2
    while new in used:
        new = f"{rid}~s{seg}.{k}"
        k += 1
    used.add(new)
    return new


def _tracker_body(kind: Kind, content: Any) -> dict[str, Any] | None:
    if kind is Kind.CHAT:
        return {"messages": [orjson.loads(m) for m in content]}
    if kind is Kind.TEXT:
        return {"prompt": content}
    return None


def _reply(kind: Kind, outcome: dict[str, Any]) -> Any:
    text, calls = outcome["output_text"], outcome["output_tool_calls"]
    if kind is Kind.TEXT:
        return text
    if text is None and not calls:
        return None
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _ok(outcome: dict[str, Any], meta: dict[str, Any]) -> bool:
    return outcome["status"] == 200 and outcome["error"] is None and not meta.get("abandoned")
