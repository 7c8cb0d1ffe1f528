"""The shrink stage: the same crash with less inside the requests.

The subset stages answer "which requests"; a kernel engineer's next
questions are "at what context length does it start?" and "how much decode
does it need?". After them, this stage rewrites the bodies of the remaining
requests while the chased crash still reproduces, one monotone question at a
time, each a one-run-per-probe search over lengths
(:meth:`~replayer.bisect.oracle.Oracle.flaky_prefix`, flaky-aware):

1. **max_tokens**: every request's cap on a doubling grid (1, 2, 4 ... the
   recorded cap): the least that still crashes, within a factor of two.
2. **context** of the crashing request (the last one kept): token-id prompts
   lose trailing blocks, text prompts trailing characters (in at most
   ``BisectOptions.shrink_steps`` steps, 256), and chat, Messages
   and Responses conversations their oldest turns. A turn is what the model
   said (a reply, tool calls) with what answered it (tool results, the next
   user message), so what is left stays valid: the system prompt, tools, the
   first user message and the last turn are never touched.
3. **prefix providers** (token-id and text prompts): each earlier request
   cut to the least that still crashes, so a crash that needs a prefix-cache
   hit reports how much of a hit.

Shared prefixes survive by construction: a dropped turn is dropped, by its
content, from *every* request that holds it, so an earlier turn of the same
session stays a prefix of the crashing one; trailing cuts keep prefixes.

The result is the threshold ("crashes at >= 327,680 prompt tokens, not at
327,168"), written to the manifest and the bundle README, and a bundle whose
requests are the shrunk ones. Candidates carry their edit as canonical JSON
(:attr:`Candidate.edit`), so trials are journaled, cached and resumed like
any other; a trial of an edited candidate replays a small trace written for
it (:func:`materialize`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from replayer.bisect.edit import (
    TRIM_ITEMS,
    UNIT,
    Edit,
    digest,
    item_of,
    longest_text,
    recorded_cap,
    turns,
)
from replayer.bisect.edit import materialize as materialize
from replayer.bisect.oracle import Candidate, Outcome
from replayer.bisect.reliability import keeps_rate
from replayer.trace.schema import Kind

if TYPE_CHECKING:
    from replayer.bisect.state import Search

# -- the stage ---------------------------------------------------------------------------


@dataclass
class _Search:
    """One length search's answer: the least crashing length and, when a run
    showed it quiet, the one below."""

    crashes: int
    quiet: int | None


async def _least(
    b: Search, n: int, make: Callable[[int], Candidate], what: str, *, low_first: bool = False
) -> _Search:
    """The least j in 1..n whose candidate crashes (``make(n)`` is the
    current best: j = n when nothing shorter does). ``low_first``
    tries j = 1 first (one trial when the answer is the least there is).
    One re-check of the longest quiet length (not the prefix stage's
    ``prefix_recheck``): each search here pays it again."""
    clock = b.oracle.mark("shrink")
    steady = b.oracle.repeats(upto=clock) == 1
    j = None
    if low_first:
        lowest = make(1)
        done = [
            r
            for r in b.oracle.records.get(lowest.key(), [])
            if r.trial > clock and r.outcome is not Outcome.INFRA
        ]
        rec = done[0] if done else await b.oracle.run_once(lowest, "shrink")
        if rec.outcome is Outcome.MATCH:
            j = 1
    if j is None:
        j = await b.oracle.flaky_prefix(
            n,
            make,
            stage="shrink",
            binary_first=steady,
            recheck=min(1, b.opts.prefix_recheck),
        )
    b.say(f"== shrink: {what}: crashes at {j:,} of {n:,}")
    below = None
    if j > 1:
        recs = b.oracle.records.get(make(j - 1).key(), [])
        if recs and not any(r.outcome is Outcome.MATCH for r in recs):
            below = j - 1
    return _Search(j, below)


async def _keep(b: Search, before: Candidate, after: Candidate, what: str) -> bool:
    """Take ``after`` (a cut that crashed) as the best unless it crashes
    significantly less often than ``before`` (:func:`keeps_rate`): a smaller
    repro that crashes 30 % of the time is worth less than a larger one that
    always does."""
    if after == before:
        return True
    ok, text = await keeps_rate(b, before, after)
    if not ok:
        b.say(f"== shrink: {what}: cut refused, the crash got rarer: {text}")
        b.shrink_refused.append({"what": what, "text": text})
        return False
    b.improve(after, "shrink")
    return True


async def shrink(b: Search) -> None:
    """The stage (see the module doc); ``b.shrunk`` holds what it found."""
    if not b.best.positions:
        return
    base = Edit.parse(b.best.edit)
    report: dict[str, Any] = {}
    trace, rows = b.derived(b.best)
    last = rows[-1]
    rid = trace.column("request_id")[last]
    kind = Kind(trace.column("kind")[last])
    report["request"] = rid
    if kind is Kind.RAW:
        b.say("== shrink: the crashing request is a raw body; nothing to shrink inside it")
        return

    # 1. max_tokens, on a doubling grid
    caps = [c for r in rows if (c := recorded_cap(orjson.loads(trace.params_text(r))))]
    top = max(caps) if caps else None
    if top is not None and top > 1 and base.max_tokens is None:
        grid = [2**i for i in range(math.ceil(math.log2(top)))] + [top]
        cur = b.best

        def with_cap(j: int) -> Candidate:
            if j == len(grid):
                return cur
            return replace(cur, edit=replace(base, max_tokens=grid[j - 1]).text())

        got = await _least(b, len(grid), with_cap, "max_tokens", low_first=True)
        if got.crashes < len(grid) or got.quiet:
            cap = replace(base, max_tokens=grid[got.crashes - 1])
            if got.crashes == len(grid) or await _keep(
                b, cur, replace(cur, edit=cap.text()), "max_tokens"
            ):
                base = cap if got.crashes < len(grid) else base
                report["max_tokens"] = {
                    "crashes_at": grid[got.crashes - 1],
                    "quiet_at": grid[got.quiet - 1] if got.quiet else None,
                    "recorded": top,
                }

    # 2. the crashing request's context
    content = trace.content(last)
    ctx = await _context(b, base, kind, rid, content)
    if ctx is not None:
        base, report["context"] = ctx

    # 3. prefix providers: earlier token-id and text prompts, newest first
    providers: list[dict[str, Any]] = []
    if kind in (Kind.BLOCKS, Kind.TEXT):
        trace, rows = b.derived(b.best)
        for r in reversed(rows[:-1]):
            if Kind(trace.column("kind")[r]) is not kind:
                continue
            other = trace.column("request_id")[r]
            got_p = await _cut_search(b, base, kind, other, trace.content(r), "prefix provider")
            if got_p is not None:
                base, found = got_p
                providers.append(found)
    if providers:
        report["providers"] = providers
    if b.shrink_refused:
        report["refused"] = list(b.shrink_refused)
    if len(report) > 1:
        b.shrunk = report
        b.say(f"== shrink: {threshold_line(report)}")


async def _context(
    b: Search, base: Edit, kind: Kind, rid: str, content: Any
) -> tuple[Edit, dict[str, Any]] | None:
    """The crashing request's context: trailing units of a prompt; the
    oldest turns of a conversation, then the text of its longest items."""
    if kind in (Kind.BLOCKS, Kind.TEXT):
        return await _cut_search(b, base, kind, rid, content, "context")
    items = list(content)
    spans = turns(kind, items)
    edit = base
    found: dict[str, Any] | None = None
    if spans:
        cur = b.best
        digests = [digest(items[s:e]) for s, e in spans]
        k = len(spans)

        def keeping(j: int) -> Candidate:
            """Keep the newest j - 1 turns of history (j = k + 1: all of them)."""
            if j == k + 1:
                return cur
            return replace(cur, edit=replace(base, drop=(*base.drop, *digests[: k + 1 - j])).text())

        got = await _least(b, k + 1, keeping, "context (turns of history)")
        dropped = replace(base, drop=(*base.drop, *digests[: k + 1 - got.crashes]))
        if (got.crashes <= k or got.quiet) and await _keep(
            b, cur, replace(cur, edit=dropped.text()), "context (turns of history)"
        ):
            edit = dropped
            found = _anchored(
                {
                    "unit": "turn",
                    "crashes_at": _measure(b, b.best, rid, got.crashes - 1, True),
                    "quiet_at": _measure(b, keeping(got.quiet), rid, got.quiet - 1, False)
                    if got.quiet
                    else None,
                    "recorded": {"units": k},
                }
            )
    # finer than a turn: cut the prose of the longest items left
    trace, rows = b.derived(b.best)
    ids = trace.column("request_id")
    row = next(r for r in rows if ids[r] == rid)
    left = list(trace.content(row))
    # the crashing request's own text first: what it shares with earlier
    # requests is their prefix-cache hit, which the crash may need
    shared = {digest([m]) for r in rows if r != row for m in (trace.content(r) or ())}
    order = sorted(
        (i for i in range(len(left)) if longest_text(left[i]) >= 2),
        key=lambda i: (digest([left[i]]) in shared, -longest_text(left[i])),
    )
    for i in order[:TRIM_ITEMS]:
        got_t = await _trim_search(b, edit, rid, left[i])
        if got_t is None:
            continue  # no run said where inside this text
        edit, found = got_t
        if found["quiet_at"] is not None or found["crashes_at"]["units"] > found["step"]:
            break  # the threshold lies inside this text
    return (edit, found) if found is not None else None


async def _trim_search(
    b: Search, base: Edit, rid: str, item: Any
) -> tuple[Edit, dict[str, Any]] | None:
    """The longest prose string of one conversation item, cut from its end."""
    length = longest_text(item)
    if length < 2:
        return None
    step = max(1, math.ceil(length / b.opts.shrink_steps))
    n = math.ceil(length / step)
    key = digest([item])
    cur = b.best

    def cut_to(j: int) -> Candidate:
        if j == n:
            return cur
        return replace(cur, edit=base.trim(key, min(length, j * step)).text())

    role = item_of(item).get("role") or item_of(item).get("type") or "item"
    got = await _least(
        b, n, cut_to, f"context (text of a {role} item, {step}-character steps)", low_first=True
    )
    if got.crashes == n and not got.quiet:
        return None  # no run said where: nothing to report
    edit = base.trim(key, min(length, got.crashes * step)) if got.crashes < n else base
    if not await _keep(b, cur, replace(cur, edit=edit.text()), f"context (text of a {role} item)"):
        return None
    return edit, _anchored(
        {
            "unit": f"{step}-character step" if step > 1 else "character",
            "step": step,
            "item": role,
            "crashes_at": _measure(b, b.best, rid, min(length, got.crashes * step), True),
            "quiet_at": _measure(b, cut_to(got.quiet), rid, got.quiet * step, False)
            if got.quiet
            else None,
            "recorded": {"units": length},
        }
    )


async def _cut_search(
    b: Search, base: Edit, kind: Kind, rid: str, content: Any, what: str
) -> tuple[Edit, dict[str, Any]] | None:
    """Trailing blocks or characters of request ``rid``."""
    length = len(content)
    if length < 2:
        return None
    step = 1 if kind is Kind.BLOCKS else max(1, math.ceil(length / b.opts.shrink_steps))
    n = math.ceil(length / step)
    cur = b.best

    def cut_to(j: int) -> Candidate:
        if j == n:
            return cur
        return replace(cur, edit=base.cut(rid, min(length, j * step)).text())

    got = await _least(b, n, cut_to, f"{what} of {rid} ({UNIT[kind]}s)")
    if got.crashes == n and not got.quiet:
        return None
    edit = base.cut(rid, min(length, got.crashes * step)) if got.crashes < n else base
    if not await _keep(b, cur, replace(cur, edit=edit.text()), f"{what} of {rid}"):
        return None
    found = _anchored(
        {
            "request": rid,
            "unit": UNIT[kind] if step == 1 else f"{step}-character step",
            "crashes_at": _measure(b, b.best, rid, min(length, got.crashes * step), True),
            "quiet_at": _measure(b, cut_to(got.quiet), rid, got.quiet * step, False)
            if got.quiet
            else None,
            "recorded": {"units": length},
            "step": step,
        }
    )
    return edit, found


def _measure(b: Search, cand: Candidate, rid: str, units: int, crashed: bool) -> dict[str, Any]:
    """``units`` and the request's prompt tokens: the trace's own count for
    token-id prompts (exact), else what the server reported when it answered
    (a quiet run), else the trace's estimate (kept as ``estimate`` too, to
    place a crashing length next to a measured quiet one)."""
    trace, rows = b.derived(cand)
    row = next(r for r in rows if trace.column("request_id")[r] == rid)
    tokens = trace.column("input_tokens")[row]
    exact = Kind(trace.column("kind")[row]) is Kind.BLOCKS
    measured = None if exact or crashed else b.served_prompt_tokens(cand, rid)
    return {
        "units": units,
        "prompt_tokens": measured if measured is not None else tokens,
        "tokens_from": "trace" if exact else ("server" if measured is not None else "estimate"),
        "estimate": tokens,
    }


def _anchored(found: dict[str, Any]) -> dict[str, Any]:
    """A crashing side known only by the trace's estimate, put next to a
    quiet side the server counted: the server's count plus the estimated
    difference (the estimator's own scale is not the model's tokenizer)."""
    c, q = found["crashes_at"], found.get("quiet_at")
    if q and c["tokens_from"] == "estimate" and q["tokens_from"] == "server":
        c = {**c, "prompt_tokens": q["prompt_tokens"] + max(1, c["estimate"] - q["estimate"])}
        found = {**found, "crashes_at": c}
    return found


def threshold_line(report: dict[str, Any]) -> str:
    """One line for people: "crashes at >= 327,680 prompt tokens, not at 327,168"."""
    parts = []
    ctx = report.get("context")
    if ctx:
        parts.append(_line(ctx, "prompt tokens"))
    for p in report.get("providers", ()):
        parts.append(f"its prefix-cache source {p['request']} " + _line(p, "tokens"))
    mt = report.get("max_tokens")
    if mt:
        parts.append(
            f"max_tokens {mt['crashes_at']:,} crashes"
            + (f", {mt['quiet_at']:,} does not" if mt.get("quiet_at") else "")
            + f" (recorded {mt['recorded']:,})"
        )
    return "; ".join(parts) or "nothing inside the requests could go"


def _line(found: dict[str, Any], what: str) -> str:
    c, q = found["crashes_at"], found.get("quiet_at")
    unit = found["unit"]

    def size(m: dict[str, Any]) -> str:
        if m.get("prompt_tokens"):
            approx = "~" if m.get("tokens_from") == "estimate" else ""
            return f"{approx}{m['prompt_tokens']:,} {what}"
        return f"{m['units']:,} {unit}s"

    def turns(m: dict[str, Any]) -> str:
        return f" ({m['units']} turn(s) of history)" if unit == "turn" else ""

    if not q:
        return f"still crashes at {size(c)}{turns(c)}, the least it could be cut to"
    return f"crashes at >= {size(c)}{turns(c)}, not at {size(q)}{turns(q)}"
