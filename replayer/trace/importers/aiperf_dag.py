"""AIPerf conversation DAGs (ai-dynamo/aiperf ``--custom-dataset-type
dag_jsonl``): JSONL, one conversation per line, ``{"session_id", "turns":
[...]}``; a turn has ``messages`` (an OpenAI message list), optional
``model``, ``max_tokens``, ``tools``, ``extra`` (fields merged into the body)
and ``delay`` (ms before it is sent), and two branch keys that name other
conversations of the file:

* ``spawns``: children that start with a fresh context once the turn ended.
  A bare id joins on the parent's next turn; ``{"children": [...],
  "join_at": K}`` joins on the parent's turn ``K`` instead (the turns between
  run beside the children). A spawn on the last turn without ``join_at`` is
  never joined.
* ``forks``: children that continue the parent's context once the turn
  ended. A bare id ends the parent (so it must be on its last turn);
  ``{"child": id, "background": true}`` lets the parent carry on, unjoined.

A conversation's ``pre_session_spawns`` start beside its first turn, never
joined; an ``orchestrator`` conversation sends no request of its own.

Mapping, and why:

* **Joins** (the trace's ``after``), as AIPerf schedules them: a spawned or
  forked child's first turn joins on the parent turn that launched it
  (fan-out); the parent's join turn joins on the last turn of every child it
  waits for (fan-in). Pre-session spawns and background forks have no join.
* **Sessions**: a conversation reached from one place is session
  ``<session_id>``; a spawn child reached from several (AIPerf runs it once per
  parent) is one session per launch, ``<session_id>#1``, ``#2`` … in the
  order the roots (conversations nobody launches, in file order) reach them.
  Several files are separate DAGs: their session ids get ``<stem>/``.
  Request ids are ``<session>:<turn>``.
* **Bodies**: ``{"model"? (the turn's, else --model), "messages", "tools"?,
  "max_tokens"?, **extra}``. Only ``context_mode:
  message_array_with_responses`` conversations are imported: each turn is
  sent as authored. Every other mode (AIPerf's default for DAGs is
  ``deltas_without_responses``) builds bodies at run time from the history
  and, by default, the live replies, which a trace cannot hold: refused, as
  ``replayer import aiperf`` refuses ``message_mode: delta``.
* **Orchestrators** (request-less spines that re-fire their spawns every
  iteration, with think times between rounds) are refused: their rounds pace
  requests they do not send, and a trace holds requests.
* **Timing** is synthetic (the file records none): roots start
  ``--session-gap`` apart; a turn starts ``delay`` ms after what it waits for
  ended (its previous turn, its joins; a first turn: its session's start or
  its launching turn's end) and lasts ``--api-base + --api-per-token *
  max_tokens``, so every join lands on a request that ends before its
  dependant starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayer.errors import ImportFormatError
from replayer.trace.importers.common import (
    US,
    SyntheticTiming,
    add_timing_arguments,
    is_int64,
    iter_jsonl,
    message_problem,
    seconds_to_us,
    unique_stems,
)
from replayer.trace.model import RequestRecord
from replayer.trace.schema import Kind

NAME = "aiperf-dag"
WHAT = "an AIPerf dag_jsonl file"
ISOLATED = "message_array_with_responses"
DEFAULT_MODE = "deltas_without_responses"

_CONV_KEYS = frozenset(
    {
        "session_id",
        "turns",
        "orchestrator",
        "spawns",
        "rounds",
        "think_time_ms",
        "think_time_sigma",
        "think_time_min_ms",
        "think_time_max_ms",
        "context_mode",
        "pre_session_spawns",
    }
)
_TURN_KEYS = frozenset(
    {"messages", "model", "max_tokens", "tools", "extra", "forks", "spawns", "delay"}
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model of turns that name none (default: none)")
    # no --think: each turn's own ``delay`` is its think time
    add_timing_arguments(p, think=False)


def _timing(opts: argparse.Namespace) -> SyntheticTiming:
    return SyntheticTiming(opts.session_gap, 0.0, opts.api_base, opts.api_per_token)


def details(sources: list[Path], opts: argparse.Namespace) -> dict[str, object]:
    t = _timing(opts)
    return {
        "timing": "synthetic",
        "session_gap": t.session_gap,
        "api_base": t.api_base,
        "api_per_token": t.api_per_token,
    }


@dataclass
class _Spawn:
    children: list[str]
    join_at: int | None  # None: the next turn, or never after the last turn


@dataclass
class _Turn:
    body: dict[str, Any]
    messages: list[Any]
    max_tokens: int
    delay_us: int
    spawns: list[_Spawn] = field(default_factory=list)
    forks: list[tuple[str, bool]] = field(default_factory=list)  # (child, background)


@dataclass
class _Conv:
    sid: str
    line: int
    turns: list[_Turn]
    pre: list[str]


@dataclass
class _Node:
    """One request of one launched instance, while the schedule is computed."""

    rid: str
    session: str
    turn: int
    t: _Turn
    after: list[str] = field(default_factory=list)
    base_of: str | None = None  # starts from this node's base, not an end (pre-session)
    first_base: int | None = None  # a root's first turn: its session start
    base_hint: str | None = None
    meta: dict[str, Any] | None = None
    base: int = 0
    start: int = 0
    end: int = 0


def records(sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]:
    timing = _timing(opts)
    several = len(sources) > 1
    index = 0  # root sessions across all files, for their start
    for src, stem in zip(sources, unique_stems(sources), strict=True):
        convs = _parse(src, opts)
        nodes, roots = _launch(src, convs, f"{stem}/" if several else "")
        for rid in roots:
            nodes[rid].first_base = round(timing.session_start(index) * US)
            index += 1
        yield from _schedule(src, nodes, timing)


def _parse(src: Path, opts: argparse.Namespace) -> dict[str, _Conv]:
    convs: dict[str, _Conv] = {}
    for line, row in iter_jsonl(src, WHAT):
        where = f"{src}:{line}"

        def bad(why: str, where: str = where) -> ImportFormatError:
            return ImportFormatError(f"{where}: not {WHAT} ({why})")

        if not isinstance(row, dict):
            raise bad("a line is not a JSON object")
        unknown = sorted(set(row) - _CONV_KEYS)
        if unknown:
            raise bad(f"unknown conversation key {unknown[0]!r}")
        sid = row.get("session_id")
        if not isinstance(sid, str) or not sid:
            raise bad("session_id must be a non-empty string")
        if sid in convs:
            raise bad(f"session_id {sid!r} repeats")
        if row.get("orchestrator") or row.get("rounds") is not None:
            raise ImportFormatError(
                f"{where}: session {sid!r} is an AIPerf orchestrator (a request-less spine "
                "that re-fires its spawns every round), which a trace of requests cannot "
                "hold; not imported"
            )
        mode = row.get("context_mode")
        name = mode.lower() if isinstance(mode, str) else mode
        if name != ISOLATED:
            said = f"context_mode {mode!r}" if mode is not None else f"the default {DEFAULT_MODE!r}"
            raise ImportFormatError(
                f"{where}: session {sid!r} uses {said}: AIPerf builds those bodies at run "
                "time from the history and live replies, which a trace cannot hold; only "
                f'"context_mode": "{ISOLATED}" (each turn sent as authored) is imported'
            )
        if any(k.startswith("think_time") for k in row) or row.get("spawns"):
            raise bad("think_time_* and conversation-level spawns are orchestrator-only")
        turns = row.get("turns")
        if not isinstance(turns, list) or not turns:
            raise bad(f"session {sid!r}: turns must be a non-empty list")
        pre = row.get("pre_session_spawns") or []
        if not _ids(pre) or len(set(pre)) != len(pre):
            raise bad(f"session {sid!r}: pre_session_spawns must be distinct session ids")
        parsed = [_turn(t, k, sid, bad, opts) for k, t in enumerate(turns)]
        convs[sid] = _Conv(sid, line, parsed, list(pre))
    if not convs:
        raise ImportFormatError(f"{src}: not {WHAT} (no conversations)")
    return convs


def _ids(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(c, str) and c for c in v)


def _turn(t: Any, k: int, sid: str, bad: Any, opts: argparse.Namespace) -> _Turn:
    at = f"session {sid!r} turn {k}"
    if not isinstance(t, dict):
        raise bad(f"{at} is not an object")
    unknown = sorted(set(t) - _TURN_KEYS)
    if unknown:
        raise bad(f"{at}: unknown turn key {unknown[0]!r}")
    msgs = t.get("messages")
    problem = message_problem(msgs)
    if problem is not None or not msgs:
        raise bad(f"{at}: {problem or 'messages is empty'}")
    body: dict[str, Any] = {}
    model = t.get("model", None) or opts.model
    if model is not None:
        if not isinstance(model, str):
            raise bad(f"{at}: model must be a string")
        body["model"] = model
    body["messages"] = None
    if t.get("tools") is not None:
        if not isinstance(t["tools"], list):
            raise bad(f"{at}: tools must be a list")
        body["tools"] = t["tools"]
    out = t.get("max_tokens")
    if out is not None:
        if not is_int64(out) or out < 1:
            raise bad(f"{at}: max_tokens must be a positive integer")
        body["max_tokens"] = out
    extra = t.get("extra")
    if extra is not None:
        if not isinstance(extra, dict):
            raise bad(f"{at}: extra must be an object")
        if "messages" in extra:
            raise bad(f"{at}: extra must not hold 'messages', the turn's input")
        body.update(extra)
    delay = t.get("delay", 0)
    if not isinstance(delay, int | float) or isinstance(delay, bool) or not 0 <= delay < 1e15:
        raise bad(f"{at}: delay must be a non-negative number of ms")
    turn = _Turn(body, msgs, out or 0, seconds_to_us(delay, 1000))
    spawns = t.get("spawns") or []
    forks = t.get("forks") or []
    if not isinstance(spawns, list) or not isinstance(forks, list):
        raise bad(f"{at}: spawns and forks must be lists")
    bare: list[str] = []
    for s in spawns:  # consecutive bare ids form one group, as AIPerf groups them
        if isinstance(s, str) and s:
            bare.append(s)
            continue
        if bare:
            turn.spawns.append(_Spawn(bare, None))
            bare = []
        if not isinstance(s, dict) or set(s) - {"children", "join_at"}:
            raise bad(f"{at}: a spawn is an id or {{children, join_at}}")
        ja = s.get("join_at")
        if not _ids(s.get("children")) or not s["children"]:
            raise bad(f"{at}: spawn children must be a non-empty list of session ids")
        if ja is not None and not is_int64(ja):
            raise bad(f"{at}: join_at must be a turn index")
        turn.spawns.append(_Spawn(list(s["children"]), ja))
    if bare:
        turn.spawns.append(_Spawn(bare, None))
    for f in forks:
        if isinstance(f, str) and f:
            turn.forks.append((f, False))
            continue
        if (
            not isinstance(f, dict)
            or set(f) - {"child", "background"}
            or not isinstance(f.get("child"), str)
            or not f["child"]
            or not isinstance(f.get("background", False), bool)
        ):
            raise bad(f"{at}: a fork is an id or {{child, background}}")
        turn.forks.append((f["child"], f.get("background", False)))
    named = [c for g in turn.spawns for c in g.children]
    if len(set(named)) != len(named) or len({c for c, _ in turn.forks}) != len(turn.forks):
        raise bad(f"{at}: a child is named twice")
    return turn


def _launch(src: Path, convs: dict[str, _Conv], prefix: str) -> tuple[dict[str, _Node], list[str]]:
    """Every launched instance's requests (joins and launch links set), and the
    first request of each root, in file order."""

    def bad(c: _Conv, why: str) -> ImportFormatError:
        return ImportFormatError(f"{src}:{c.line}: not {WHAT} (session {c.sid!r}: {why})")

    children: dict[str, list[str]] = {}
    fork_parent: dict[str, str] = {}
    for c in convs.values():
        n = len(c.turns)
        kids = list(c.pre)
        for k, t in enumerate(c.turns):
            for g in t.spawns:
                if g.join_at is not None and not k < g.join_at < n:
                    raise bad(c, f"turn {k}: join_at {g.join_at} is not a later turn (of {n})")
                kids += g.children
            for child, background in t.forks:
                if not background and k != n - 1:
                    raise bad(c, f"turn {k}: a fork that ends its parent must be on the last turn")
                if child in fork_parent:
                    raise bad(c, f"turn {k}: {child!r} is forked by {fork_parent[child]!r} too")
                fork_parent[child] = c.sid
                kids.append(child)
        for kid in kids:
            if kid not in convs:
                raise bad(c, f"branch target {kid!r} is not a conversation of the file")
        children[c.sid] = kids
    for c in convs.values():
        for kid in c.pre:
            if kid in fork_parent:
                raise bad(c, f"pre-session spawn {kid!r} is forked too")
    _no_cycle(children, convs, bad)

    # instances: breadth-first from the roots, so names follow the file order
    named = {k for ks in children.values() for k in ks}
    # (conversation, launching instance, launching turn, how)
    order: list[tuple[str, int | None, int, str]] = [
        (s, None, 0, "root") for s in convs if s not in named
    ]
    head = 0
    while head < len(order):  # bounded: the launch graph is acyclic
        c = convs[order[head][0]]
        order += [(kid, head, 0, "pre_session_spawn") for kid in c.pre]
        for k, t in enumerate(c.turns):
            order += [(kid, head, k, "spawn") for g in t.spawns for kid in g.children]
            order += [(kid, head, k, "background_fork" if bg else "fork") for kid, bg in t.forks]
        head += 1
    count: dict[str, int] = {}
    for sid, *_ in order:
        count[sid] = count.get(sid, 0) + 1
    seen: dict[str, int] = {}
    session: list[str] = []
    for sid, *_ in order:
        seen[sid] = seen.get(sid, 0) + 1
        session.append(prefix + (sid if count[sid] == 1 else f"{sid}#{seen[sid]}"))
    if len(set(session)) != len(session):
        dup = next(s for s in session if session.count(s) > 1)
        raise ImportFormatError(f"{src}: not {WHAT} (session {dup!r} names two launches)")

    nodes: dict[str, _Node] = {}
    for i, (sid, p, k, how) in enumerate(order):
        for j, t in enumerate(convs[sid].turns):
            rid = f"{session[i]}:{j}"
            nodes[rid] = _Node(rid, session[i], j, t)
        if p is None:
            continue
        first = nodes[f"{session[i]}:0"]
        parent = f"{session[p]}:{k}"
        first.meta = {"dag": how, "parent": parent}
        if how == "pre_session_spawn":
            first.base_of = parent
        else:
            first.after.append(parent)
        if how.endswith("fork"):
            first.base_hint = parent  # it continues the parent's context
    # fan-in: each parent instance's join turns wait for its children's last turns
    last = {i: f"{session[i]}:{len(convs[order[i][0]].turns) - 1}" for i in range(len(order))}
    kids_of: dict[int, list[int]] = {}
    for i, (_, p, _, _) in enumerate(order):
        if p is not None:
            kids_of.setdefault(p, []).append(i)
    for p, mine in kids_of.items():
        c = convs[order[p][0]]
        spawned = iter(i for i in mine if order[i][3] == "spawn")
        for k, t in enumerate(c.turns):
            for g in t.spawns:
                at = g.join_at if g.join_at is not None else k + 1
                for _ in g.children:
                    i = next(spawned)
                    if at < len(c.turns):
                        nodes[f"{session[p]}:{at}"].after.append(last[i])
    return nodes, [f"{session[i]}:0" for i, (_, _, _, how) in enumerate(order) if how == "root"]


def _no_cycle(children: dict[str, list[str]], convs: dict[str, _Conv], bad: Any) -> None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for top in children:
        if top in state:
            continue
        path = [top]
        stack = [iter(children[top])]
        state[top] = 1
        while stack:  # bounded: each conversation enters the path once
            kid = next(stack[-1], None)
            if kid is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(kid) == 1:
                cycle = " -> ".join([*path[path.index(kid) :], kid])
                raise bad(convs[kid], f"the launches form a cycle: {cycle}")
            elif kid not in state:
                state[kid] = 1
                path.append(kid)
                stack.append(iter(children[kid]))


def _schedule(
    src: Path, nodes: dict[str, _Node], timing: SyntheticTiming
) -> Iterator[RequestRecord]:
    """Synthetic times in dependency order, then records by start time (ties in
    dependency order, so a join never lands on a later row)."""
    deps: dict[str, list[str]] = {}
    for n in nodes.values():
        d = list(n.after)
        if n.turn:
            d.append(f"{n.session}:{n.turn - 1}")
        if n.base_of is not None:
            d.append(n.base_of)
        deps[n.rid] = d
    waiting = {rid: len(d) for rid, d in deps.items()}
    users: dict[str, list[str]] = {}
    for rid, d in deps.items():
        for x in d:
            users.setdefault(x, []).append(rid)
    ready = [rid for rid, w in waiting.items() if w == 0]
    done: list[_Node] = []
    while ready:  # bounded: each node is made ready once
        n = nodes[ready.pop()]
        if n.base_of is not None:
            n.base = nodes[n.base_of].base
        elif n.first_base is not None and not n.after:
            n.base = n.first_base
        else:
            n.base = max(nodes[x].end for x in deps[n.rid] if x != n.base_of)
        n.start = n.base + n.t.delay_us
        n.end = n.start + max(1, round(timing.service(n.t.max_tokens) * US))
        if not is_int64(n.end):
            raise ImportFormatError(f"{src}: not {WHAT} ({n.rid}: delays out of range)")
        done.append(n)
        for u in users.get(n.rid, ()):
            waiting[u] -= 1
            if not waiting[u]:
                ready.append(u)
    seq = {n.rid: i for i, n in enumerate(done)}
    for n in sorted(done, key=lambda n: (n.start, seq[n.rid])):
        yield RequestRecord(
            request_id=n.rid,
            session_id=n.session,
            turn=n.turn,
            start_us=n.start,
            end_us=n.end,
            kind=Kind.CHAT,
            params=dict(n.t.body),
            content=n.t.messages,
            base_hint=n.base_hint,
            after=list(n.after) or None,
            meta=n.meta,
        )
