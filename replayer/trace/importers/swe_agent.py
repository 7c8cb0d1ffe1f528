"""SWE-agent trajectories (SWE-agent/SWE-agent ``*.traj``): one JSON document
``{environment, trajectory[], history[], info}`` per run, where ``history`` is
the chat history the model was sent (``role``, ``content``, plus SWE-agent's
own keys: ``agent``, ``message_type``, ``thought``, ``action``, ``is_demo``,
and ``tool_calls`` / ``tool_call_ids`` in function-calling runs). Also read:
mini-swe-agent trajectories (``*.traj.json``), either a plain JSON list of
OpenAI messages or an object with a ``messages`` list.

Mapping (teacher-forced replay), and why:

* **Request k** = the history before the k-th assistant message, sent as
  chat; the recorded assistant turns stay in later contexts, so every
  context is deterministic. Each request extends the previous one.
* **Messages are cleaned the way SWE-agent's model layer does before
  sending** (``_history_to_messages``): only the OpenAI keys ``role``,
  ``content``, ``name``, ``tool_calls``, ``tool_call_id`` are kept, in their
  recorded order (null ``tool_calls``/``name``/``tool_call_id`` dropped), and
  a tool message's ``tool_call_ids[0]`` becomes its ``tool_call_id``.
* **``max_tokens``** = the recorded reply's length estimate, ``ceil(chars/4)``
  of content plus tool-call names and arguments, at least 1 (the files hold
  per-run token totals only). **Outcome**: the recorded assistant message
  (text, tool calls, ``tool_calls``/``stop``); no status, since most
  demonstrations are replays, not live model calls.
* **Sessions**: one per file. Its id is the file's path relative to the
  directory given as a source (directories are searched recursively for
  ``*.traj`` and ``*.traj.json``, in sorted order), or the file name for a
  file given directly, minus the ``.traj``/``.traj.json`` suffix; a repeat
  gets ``~2`` …. Request ids are ``<session>:<turn>``; turn 0 carries the
  file's ``exit_status`` and ``model_stats`` (when present) in ``meta``.
* **Timing**: none recorded, so the documented synthetic schedule
  (:class:`~replayer.trace.importers.common.SyntheticTiming`), sessions in
  file order. ``--model`` names the model (default none).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from replayer.errors import ImportFormatError
from replayer.trace.importers.common import (
    OPENAI_MESSAGE_KEYS,
    SessionClock,
    add_timing_arguments,
    load_json,
    message_problem,
    reply_outcome,
    reply_tokens,
    require,
    timing_from,
)
from replayer.trace.model import RequestRecord
from replayer.trace.schema import Kind

NAME = "swe-agent"
WHAT = "a SWE-agent trajectory"
SUFFIXES = (".traj", ".traj.json")


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


def _strip_suffix(name: str) -> str:
    for suf in (".traj.json", ".traj", ".json"):
        if name.endswith(suf) and len(name) > len(suf):
            return name[: -len(suf)]
    return name


def sessions(sources: list[Path]) -> list[tuple[Path, str]]:
    """Every trajectory file with its session id, in import order."""
    out: list[tuple[Path, str]] = []
    seen: dict[str, int] = {}
    for s in sources:
        if s.is_dir():
            found = sorted(
                (p for p in s.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES)),
                key=lambda p: p.relative_to(s).as_posix(),
            )
            require(bool(found), s, WHAT, "directory holds no .traj or .traj.json files")
            named = [(p, _strip_suffix(p.relative_to(s).as_posix())) for p in found]
        else:
            named = [(s, _strip_suffix(s.name))]
        for p, sid in named:
            n = seen.get(sid, 0) + 1
            seen[sid] = n
            out.append((p, sid if n == 1 else f"{sid}~{n}"))
    return out


def clean_message(m: dict[str, Any]) -> dict[str, Any]:
    """A history item as the model was sent it (OpenAI keys only)."""
    out: dict[str, Any] = {}
    for k, v in m.items():
        if k in OPENAI_MESSAGE_KEYS:
            if v is None and k != "content":
                continue
            out[k] = v
        elif (
            k == "tool_call_ids"
            and m.get("role") == "tool"
            and "tool_call_id" not in m
            and isinstance(v, list)
            and v
        ):
            out["tool_call_id"] = v[0]
    return out


def history_of(path: Path, doc: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The message history of a trajectory document and its meta for turn 0."""
    meta: dict[str, Any] = {}
    if isinstance(doc, dict) and isinstance(doc.get("history"), list):
        history = doc["history"]
        info = doc.get("info")
        if isinstance(info, dict):
            meta = {k: info[k] for k in ("exit_status", "model_stats") if k in info}
    elif isinstance(doc, dict) and isinstance(doc.get("messages"), list):
        history = doc["messages"]  # mini-swe-agent's newer {info, messages} form
        info = doc.get("info")
        if isinstance(info, dict) and "exit_status" in info:
            meta = {"exit_status": info["exit_status"]}
    elif isinstance(doc, list):
        history = doc  # mini-swe-agent's plain message list
    else:
        raise ImportFormatError(f"{path}: not {WHAT} (no history list, nor a plain message list)")
    problem = message_problem(history)
    require(problem is None, path, WHAT, f"history: {problem}")
    for j, m in enumerate(history):
        require("content" in m, path, WHAT, f"history: message {j} has no content")
    return history, meta


def records(sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]:
    timing = timing_from(opts)
    for index, (path, sid) in enumerate(sessions(sources)):
        history, meta = history_of(path, load_json(path, WHAT))
        clock = SessionClock(timing, index)
        context: list[dict[str, Any]] = []
        turn = 0
        for m in history:
            if m["role"] == "assistant" and context:
                out = reply_tokens(m)
                start, end = clock.request(out)
                params: dict[str, Any] = {}
                if opts.model:
                    params["model"] = opts.model
                params["messages"] = None
                params["max_tokens"] = out
                yield RequestRecord(
                    request_id=f"{sid}:{turn}",
                    session_id=sid,
                    turn=turn,
                    start_us=start,
                    end_us=end,
                    kind=Kind.CHAT,
                    params=params,
                    content=list(context),
                    meta={"source": str(path), **meta} if turn == 0 else None,
                    **reply_outcome(m),
                )
                turn += 1
            context.append(clean_message(m))
