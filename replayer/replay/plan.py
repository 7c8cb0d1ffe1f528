"""Which requests a replay sends, and their dependencies: pure, no I/O.

A selection keeps trace order. ``--limit N`` keeps the first N requests;
``--sessions`` and ``--requests`` take comma-separated items, each an exact
id, a 0-based position, or an inclusive range of positions ``A..B`` (``A..``
to the end, ``..B`` from the start): sessions in order of first appearance,
requests in trace order. An item that is an id is an id, even if numeric. Dropping a
request makes the previous *selected* turn of its session its predecessor.

Joins (the trace's ``after`` column) become :attr:`Plan.after`: a request
waits for the end of each request it names, besides its previous turn. A
join on a request the selection leaves out is dropped, never waited for (a
bisect candidate without a sub-agent replays its parent's turns at once);
so is one on a request that starts later in trace order (strict order sends
in trace order: waiting for it could never end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from replayer.errors import OptionError, UsageError
from replayer.replay.policy import ReplayPolicy, Timing
from replayer.trace.reader import Trace


def parse_spec(spec: str, ids: Sequence[str], what: str) -> set[int]:
    """Positions named by a spec of ids and ``A..B`` ranges (see module doc)."""
    index = {v: i for i, v in enumerate(ids)}
    out: set[int] = set()
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        if item in index:
            out.add(index[item])
            continue
        if ".." in item:
            lo_s, hi_s = item.split("..", 1)
            try:
                lo = int(lo_s) if lo_s else 0
                hi = int(hi_s) if hi_s else len(ids) - 1
            except ValueError:
                raise UsageError(f"bad {what} range {item!r} (want A..B)") from None
            if lo < 0 or hi < lo:
                raise UsageError(f"bad {what} range {item!r}")
            out.update(range(lo, min(hi, len(ids) - 1) + 1))
            continue
        if item.isdigit() and int(item) < len(ids):
            out.add(int(item))
            continue
        raise UsageError(f"no {what} {item!r} in the trace")
    return out


def select(
    trace: Trace,
    *,
    limit: int | None = None,
    sessions: str | None = None,
    requests: str | None = None,
) -> list[int]:
    """Rows to replay, in trace order."""
    order = trace.order
    rows = list(order)
    if requests:
        ids = trace.column("request_id")
        keep = parse_spec(requests, [ids[r] for r in order], "request")
        rows = [r for i, r in enumerate(order) if i in keep]
    if sessions:
        sess = trace.column("session_id")
        first: dict[str, int] = {}
        for r in order:
            first.setdefault(sess[r], len(first))
        names = list(first)
        keep_s = {names[i] for i in parse_spec(sessions, names, "session")}
        rows = [r for r in rows if sess[r] in keep_s]
    if limit is not None:
        if limit < 0:
            raise OptionError("limit", "must not be negative")
        rows = rows[:limit]
    return rows


@dataclass
class Plan:
    """The selection with what the scheduler needs, in trace order (index i)."""

    rows: list[int]
    """Trace rows, in trace order."""
    prev: list[int | None]
    """Index of the previous selected turn of the same session."""
    start: list[float]
    """Recorded start relative to the first selected request, seconds / speed."""
    gap: list[float]
    """Think gap after the previous turn's recorded end, seconds / speed."""
    sessions: list[str]
    last_of_session: list[bool]
    after: list[tuple[int, ...]] | None = None
    """Per index, the earlier indexes whose end it also waits for (joins);
    None when the selection has none."""

    def __len__(self) -> int:
        return len(self.rows)

    def waits(self, i: int) -> tuple[int, ...]:
        """Every index request i waits for: its previous turn, then its joins."""
        p = self.prev[i]
        joins = self.after[i] if self.after is not None else ()
        return joins if p is None else (p, *joins)

    def eligible(self, i: int, timing: Timing, prev_done: float | None) -> float:
        """When request i may go (seconds after T0), given when the last of
        what it waits for (:meth:`waits`) ended (None when it waits for nothing)."""
        if timing is Timing.RECORDED:
            t = self.start[i]
            return t if prev_done is None else max(t, prev_done + self.gap[i])
        if timing is Timing.GAPS:
            return self.start[i] if prev_done is None else prev_done + self.gap[i]
        return 0.0 if prev_done is None else prev_done


def joins(trace: Trace, rows: Sequence[int]) -> list[tuple[int, ...]] | None:
    """Per index of ``rows`` (trace order), the earlier indexes it joins on
    (see the module doc for what is dropped); None when there are none."""
    after = trace.column("after")
    if all(after[r] is None for r in rows):
        return None
    rid = trace.column("request_id")
    pos = {rid[r]: i for i, r in enumerate(rows)}
    out: list[tuple[int, ...]] = []
    for i, r in enumerate(rows):
        names = after[r] or ()
        out.append(tuple(sorted({pos[a] for a in names if pos.get(a, i) < i})))
    return out if any(out) else None


def build_plan(trace: Trace, rows: list[int], policy: ReplayPolicy) -> Plan:
    c = trace.column
    sess, starts, ends = c("session_id"), c("start_us"), c("end_us")
    t0 = starts[rows[0]] if rows else 0
    speed = policy.speed
    after = joins(trace, rows)
    last: dict[str, int] = {}
    prev: list[int | None] = []
    start: list[float] = []
    gap: list[float] = []
    for i, r in enumerate(rows):
        s = sess[r]
        p = last.get(s)
        prev.append(p)
        start.append((starts[r] - t0) / 1e6 / speed)
        # the think gap runs from the last recorded end of what it waits for
        waited: tuple[int, ...] = (p,) if p is not None else ()
        waited += after[i] if after is not None else ()
        known = [e for e in (ends[rows[w]] for w in waited) if e is not None]
        gap.append(max(0, starts[r] - max(known)) / 1e6 / speed if known else 0.0)
        last[s] = i
    last_idx = set(last.values())
    return Plan(
        rows=rows,
        prev=prev,
        start=start,
        gap=gap,
        sessions=[sess[r] for r in rows],
        last_of_session=[i in last_idx for i in range(len(rows))],
        after=after,
    )
