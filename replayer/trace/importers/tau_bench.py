"""τ-bench historical trajectories (sierra-research/tau-bench
``historical_trajectories/*.json``): one JSON list of
``{task_id, trial, reward, info, traj[]}``, where ``traj`` is the plain OpenAI
chat message list of one agent run (system policy, simulated user turns,
assistant turns with ``tool_calls``, ``tool`` results).

Mapping (teacher-forced replay), and why:

* **One request per assistant message** ``traj[i]``: ``messages = traj[:i]``
  verbatim, every key and key order kept (they are already OpenAI messages,
  and the *recorded* assistant turns stay in later contexts, so each context
  is deterministic whatever the live server answers). Kind ``chat``; each
  request extends the previous one, so rows delta-encode to what they add.
* **``max_tokens``** = the recorded reply's length estimate, ``ceil(chars/4)``
  of its content plus its tool calls' names and arguments, at least 1
  (:func:`~replayer.trace.importers.common.reply_tokens`); the file records
  no token counts. ``input_tokens`` is the writer's documented chars/4
  approximation.
* **Outcome**: the recorded assistant message: ``output_text`` (content),
  ``output_tool_calls``, ``finish_reason`` ``"tool_calls"`` or ``"stop"``,
  status 200 (a recorded reply means the call succeeded).
* **Sessions**: one per entry, ``<file stem>/task<task_id>-trial<trial>``
  (a repeat gets ``~2`` …); request ids ``<session>:<turn>``. Turn 0 carries
  ``{task_id, trial, reward}`` in ``meta``.
* **Timing**: none recorded, so the documented synthetic schedule
  (:class:`~replayer.trace.importers.common.SyntheticTiming`): sessions start
  ``--session-gap`` apart in file order, each request lasts ``api_base +
  api_per_token * max_tokens`` and the next turn starts ``--think`` later.
* No ``tools`` schemas: the file does not hold them (most chat templates
  render tool calls without them). ``--model`` names the model (the file
  does not; default none).

The file is one JSON document, so it is parsed whole (τ-bench files are a few
MB); rows are yielded session by session.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from replayer.trace.importers.common import (
    SessionClock,
    add_timing_arguments,
    load_json,
    message_problem,
    reply_outcome,
    reply_tokens,
    require,
    timing_from,
    unique_stems,
)
from replayer.trace.model import RequestRecord
from replayer.trace.schema import Kind

NAME = "tau-bench"
WHAT = "τ-bench trajectories"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model name for the bodies (default: none)")
    add_timing_arguments(p)


def details(sources: list[Path], opts: argparse.Namespace) -> dict[str, object]:
    t = timing_from(opts)
    return {
        "timing": "synthetic",
        "session_gap": t.session_gap,
        "think": t.think,
        "api_base": t.api_base,
        "api_per_token": t.api_per_token,
    }


def records(sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]:
    timing = timing_from(opts)
    index = 0
    for src, stem in zip(sources, unique_stems(sources), strict=True):
        doc = load_json(src, WHAT)
        require(isinstance(doc, list), src, WHAT, "top level is not a list of runs")
        seen: dict[str, int] = {}
        for k, entry in enumerate(doc):
            require(isinstance(entry, dict), src, WHAT, f"entry {k} is not an object")
            missing = [f for f in ("task_id", "traj") if f not in entry]
            require(not missing, src, WHAT, f"entry {k} has no {', '.join(missing)}")
            traj = entry["traj"]
            require(isinstance(traj, list), src, WHAT, f"entry {k}: traj is not a list")
            problem = message_problem(traj)
            require(problem is None, src, WHAT, f"entry {k}: traj: {problem}")
            sid = f"{stem}/task{entry['task_id']}-trial{entry.get('trial', 0)}"
            n = seen.get(sid, 0) + 1
            seen[sid] = n
            if n > 1:
                sid = f"{sid}~{n}"
            yield from _session(sid, entry, traj, SessionClock(timing, index), opts)
            index += 1


def _session(
    sid: str,
    entry: dict[str, Any],
    traj: list[dict[str, Any]],
    clock: SessionClock,
    opts: argparse.Namespace,
) -> Iterator[RequestRecord]:
    turn = 0
    for i, msg in enumerate(traj):
        if msg["role"] != "assistant" or i == 0:
            continue  # (an opening assistant message has no context to send)
        out = reply_tokens(msg)
        start, end = clock.request(out)
        params: dict[str, Any] = {}
        if opts.model:
            params["model"] = opts.model
        params["messages"] = None
        params["max_tokens"] = out
        meta: dict[str, Any] | None = None
        if turn == 0:
            meta = {k: entry[k] for k in ("task_id", "trial", "reward") if k in entry}
        yield RequestRecord(
            request_id=f"{sid}:{turn}",
            session_id=sid,
            turn=turn,
            start_us=start,
            end_us=end,
            kind=Kind.CHAT,
            params=params,
            content=traj[:i],
            status=200,
            meta=meta,
            **reply_outcome(msg),
        )
        turn += 1
