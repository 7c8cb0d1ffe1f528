"""What each request's body says on one target, and the bodies built ahead.

Most bodies are the trace's own, known before the replay starts: they are
built off the loop, ahead of their due time (:class:`~.bodies.Bodies`, or
worker processes with ``--workers``: :class:`~.workers.ProcBodies`). Two
kinds depend on what the target answered earlier, so they differ per target
and are built only when asked for: a chained Responses request (sent with
``previous_response_id`` set to the target's live response to its parent)
and, in live mode, a chat turn (the recorded assistant replies replaced by
the target's own). The rules for both, and the per-target state they
need, live here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import orjson

from replayer._clock import REAL
from replayer.replay.bodies import Bodies, body_patch
from replayer.replay.plan import Plan
from replayer.replay.policy import Mode, ReplayPolicy, ResponsesState, Timing
from replayer.replay.results import Result, Status
from replayer.replay.schedule import WARM_S, Schedule
from replayer.replay.workers import ProcBodies, auto_workers, spec_of, usable_cpus
from replayer.trace.reader import BodyBuilder, Trace
from replayer.trace.schema import Kind
from replayer.wire import Api, Reply, api_for_path

log = logging.getLogger("replayer.replay")


class Content:
    """The replay-wide rules: the patch every body gets (``--model``,
    streaming forced), which rows chain to a live parent, which bodies are
    known before the replay."""

    def __init__(self, trace: Trace, plan: Plan, policy: ReplayPolicy) -> None:
        self.trace, self.plan, self.policy = trace, plan, policy
        c = trace.column
        self.request_ids, self._path, self._kind = c("request_id"), c("path"), c("kind")
        self._patch: dict[str, Any] = {}
        if policy.model:
            self._patch["model"] = policy.model
        self.chain = self._chained() if policy.responses_state is ResponsesState.CHAIN else {}
        """Chain mode: row -> (the parent's request id, context items it prepended)."""
        self.lock = threading.Lock()
        """Held around every build: the targets' builders share the trace's caches."""
        self.auto_workers: str | None = None
        """Why ``--workers auto`` chose what it did (None: a count was given)."""

    def _chained(self) -> dict[int, tuple[str, int]]:
        """Rows the recorder expanded from a ``previous_response_id``."""
        out: dict[int, tuple[str, int]] = {}
        for row in self.plan.rows:
            if api_for_path(self._path[row]) is not Api.RESPONSES:
                continue
            exp = (self.trace.meta(row) or {}).get("expanded")
            if isinstance(exp, dict) and isinstance(exp.get("items"), int):
                out[row] = (str(exp.get("parent")), exp["items"])
        return out

    def live_chat(self, row: int) -> bool:
        """A chat turn whose context carries the target's own replies."""
        return self.policy.mode is Mode.LIVE and self._kind[row] == Kind.CHAT

    def static(self, row: int) -> bool:
        """Whether a row's body is known before the replay (else it waits for
        live replies: the live parent of a chain, live-mode assistant turns)."""
        return row not in self.chain and not self.live_chat(row)

    def patch(self, row: int) -> dict[str, Any] | None:
        return body_patch(self.trace, row, self._patch, self.policy.force_stream)

    def for_target(self, name: str, builder: BodyBuilder) -> TargetContent:
        return TargetContent(self, name, builder)

    def _workers(self, static: Sequence[bool]) -> int:
        """``policy.workers``, with ``auto`` decided (and why, for the summary)."""
        if self.policy.workers != "auto":
            return self.policy.workers
        size = self.trace.column("body_bytes")
        total = sum(int(size[r] or 0) for r, s in zip(self.plan.rows, static, strict=True) if s)
        span = None
        if self.policy.timing is not Timing.ASAP and self.plan.start:
            span = (max(self.plan.start) - min(self.plan.start)) or None
        n, self.auto_workers = auto_workers(total, span, usable_cpus())
        return n

    def ahead(
        self, targets: Sequence[TargetContent], schedule: Schedule
    ) -> list[Bodies | ProcBodies]:
        """Each target's bodies, built ahead of ``schedule`` (in worker
        processes with ``--workers N``, on the real clock only)."""
        plan, policy = self.plan, self.policy
        static = [self.static(row) for row in plan.rows]
        real = schedule.clock is REAL
        due = schedule.recorded_starts()
        spec = None
        workers = self._workers(static)
        if workers > 1 and real:
            spec = spec_of(self.trace, policy)
            if spec is None:
                log.warning("--workers: the trace is not a file here; bodies are built in-process")
        if spec is not None:
            tokens = self.trace.column("input_tokens")
            weight = [int(tokens[r] or 0) for r in plan.rows]
            return [
                ProcBodies(
                    spec,
                    workers,
                    t.build,
                    static,
                    plan.rows,
                    plan.sessions,
                    weight,
                    ahead_bytes=policy.body_cache_mb << 20,
                    due=due,
                    horizon=WARM_S,
                    lock=self.lock,
                )
                for t in targets
            ]
        return [
            Bodies(
                t.build,
                static,
                ahead_bytes=policy.body_cache_mb << 20,
                threaded=real,
                due=due,
                horizon=WARM_S,
                lock=self.lock,
            )
            for t in targets
        ]


class TargetContent:
    """One target's bodies: the trace's, with its own live replies where
    the rules say so."""

    def __init__(self, rules: Content, name: str, builder: BodyBuilder) -> None:
        self.rules = rules
        self.name = name
        self.builder = builder
        self.live_subs: dict[str, list[tuple[int, str]]] = {}
        """Live mode, per session: (position in context, the live reply that
        replaces the recorded one there)."""
        self.context_len: dict[int, int] = {}
        self.response_ids: dict[str, str] = {}
        """Chain mode: request id -> the id of its live response."""
        self.unchained = 0
        """Chain mode: chained requests sent expanded (no live parent response)."""

    def build(self, i: int) -> bytes:
        """The body of plan position ``i`` (in the bodies worker thread on
        the real clock)."""
        rules = self.rules
        row = rules.plan.rows[i]
        patch = rules.patch(row)
        chained = rules.chain.get(row)
        if chained is not None:
            live = self.response_ids.get(chained[0])
            if live is not None:  # as the client sent it, chained to the live parent
                content = self.builder.content(row)[chained[1] :]
                patch = {**(patch or {}), "previous_response_id": live}
                return self.builder.json(row, patch, content=content)
            self.unchained += 1
            if self.unchained == 1:
                log.warning(
                    "%s: %s has no live parent response to chain to; sent expanded",
                    self.name,
                    rules.request_ids[row],
                )
        if rules.live_chat(row):
            content = self.builder.content(row)
            self.context_len[i] = len(content)
            subs = self.live_subs.get(rules.plan.sessions[i])
            if subs:
                content = substitute_live(content, subs)
            return self.builder.json(row, patch, content=content)
        return self.builder.json(row, patch)

    def learn(self, i: int, r: Result, stats: Reply) -> None:
        """What later bodies take from this request's answer: its reply (live
        mode), its response id (chain mode)."""
        ok = r.status is Status.OK
        if ok and self.rules.policy.mode is Mode.LIVE and i in self.context_len:
            # later turns get this reply where the recorded one was: at this
            # request's context length (see substitute_live)
            pos = self.context_len.pop(i)
            self.live_subs.setdefault(self.rules.plan.sessions[i], []).append(
                (pos, orjson.dumps(stats.assistant_message()).decode())
            )
        if ok and self.rules.chain and stats.response_id is not None:
            self.response_ids[r.request_id] = stats.response_id

    def close(self) -> None:
        with self.rules.lock:  # (a bodies thread may still be in a build)
            self.builder.close()


def substitute_live(content: list[str], subs: list[tuple[int, str]]) -> list[str]:
    """Replace recorded assistant replies by live ones (live mode).

    Turn j's reply sits at index ``len(context of turn j)`` of every later
    turn (teacher-forced traces append it there). A substitution applies only
    where that message is an assistant's; tool results that answer a recorded
    tool call are re-pointed at the live call's id, so the conversation stays
    coherent for the server."""
    out = list(content)
    ids: dict[str, str] = {}
    for pos, live in subs:
        if pos >= len(out):
            continue
        recorded = orjson.loads(out[pos])
        if not isinstance(recorded, dict) or recorded.get("role") != "assistant":
            continue
        live_msg = orjson.loads(live)
        rec_calls = recorded.get("tool_calls") or []
        live_calls = live_msg.get("tool_calls") or []
        for a, b in zip(rec_calls, live_calls, strict=False):
            if isinstance(a, dict) and isinstance(b, dict) and a.get("id") and b.get("id"):
                ids[a["id"]] = b["id"]
        out[pos] = live
    if ids:
        for k, text in enumerate(out):
            if '"tool_call_id"' not in text:
                continue
            msg = orjson.loads(text)
            if isinstance(msg, dict) and msg.get("tool_call_id") in ids:
                msg["tool_call_id"] = ids[msg["tool_call_id"]]
                out[k] = orjson.dumps(msg).decode()
    return out
