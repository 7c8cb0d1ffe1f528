"""τ²-bench simulation results (sierra-research/tau2-bench
``data/simulations/*.json``): one JSON document ``{timestamp, info, tasks,
simulations[]}``; each simulation is one agent session whose ``messages``
carry ISO ``timestamp``s and, on LLM-generated turns, the real ``usage``
(``prompt_tokens``, ``completion_tokens``) and ``raw_data`` (the provider
response). Tool calls are tau2-style ``{id, name, arguments (dict),
requestor}``; tool results carry the call's ``id`` and ``requestor``.

Mapping, and why:

* **Whose conversation**: the agent's. Its context is the system prompt plus
  every message the orchestrator routes to it: assistant turns, user turns
  *without* tool calls, and tool results with ``requestor: "assistant"``.
  The user simulator's own tool calls (telecom users operate their phone)
  and their results go to the environment, never to the agent: the recorded
  ``usage.prompt_tokens`` grows by exactly the user's final text, not by
  those messages. So those are left out.
* **System message**: tau2's ``LLMAgent`` prompt, ``<instructions>`` with
  its agent instruction around ``<policy>`` = ``info.environment_info.policy``
  (``--system tau2``, default), or the bare policy (``--system policy``).
  ``tool_defs`` is null in these files, so no ``tools`` are sent.
* **OpenAI form**: tool calls become ``{"id", "type": "function",
  "function": {"name", "arguments": json.dumps(arguments)}}`` (tau2's own
  serialization); tool results become ``{"role": "tool", "tool_call_id":
  id, "content"}``; assistant ``tool_calls`` is omitted when empty.
* **One request per LLM-generated agent turn** (an assistant message with
  ``usage``), teacher-forced: the context before it, with the recorded
  turns. The canned greeting ("Hi! How can I help you today?", no usage)
  is context only: no model call produced it.
* **Body**: ``{"model": info.agent_info.llm (or --model), "messages",
  **info.agent_info.llm_args (e.g. temperature), "max_tokens":
  completion_tokens}``. ``input_tokens`` and ``usage_prompt_tokens`` are the
  real ``prompt_tokens``, ``usage_completion_tokens`` the real completion.
* **Outcome**: status 200, the recorded content and (converted) tool calls,
  ``finish_reason`` from ``raw_data`` (else ``tool_calls``/``stop``).
* **Timing** (real): ``start`` = timestamp of the message that triggered the
  call (the last one of its context), ``end`` = the assistant message's own
  timestamp, both minus the earliest message timestamp of the file (each
  file has its own clock starting at 0).
* **Ids**: session = simulation ``id``; request = ``<session>:<turn>``; turn
  0 carries ``{task_id, trial, termination_reason, reward}`` in ``meta``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from replayer.errors import ImportFormatError
from replayer.trace.importers.common import is_int64, load_json, require
from replayer.trace.model import RequestRecord
from replayer.trace.schema import Kind

NAME = "tau2-bench"
WHAT = "τ²-bench simulation results"

AGENT_INSTRUCTION = """
You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only.
""".strip()
"""tau2's ``tau2.agent.llm_agent.AGENT_INSTRUCTION``."""

SYSTEM_PROMPT = """
<instructions>
{agent_instruction}
</instructions>
<policy>
{domain_policy}
</policy>
""".strip()
"""tau2's ``tau2.agent.llm_agent.SYSTEM_PROMPT``."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--system",
        choices=("tau2", "policy"),
        default="tau2",
        help="system message: tau2's agent prompt around the policy (default) or the bare policy",
    )
    p.add_argument(
        "--model", default=None, help="model name for the bodies (default: the agent's llm)"
    )


def details(sources: list[Path], opts: argparse.Namespace) -> dict[str, object]:
    return {"timing": "recorded", "system": opts.system}


def system_prompt(policy: str, style: str) -> str:
    if style == "policy":
        return policy
    return SYSTEM_PROMPT.format(agent_instruction=AGENT_INSTRUCTION, domain_policy=policy)


def openai_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """tau2 tool calls in OpenAI form (arguments serialized as tau2 does)."""
    return [
        {
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
        }
        for c in calls
    ]


def agent_message(m: dict[str, Any]) -> dict[str, Any] | None:
    """A tau2 message as the agent's model saw it, or None if not sent to it."""
    role = m["role"]
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": m.get("content")}
        if m.get("tool_calls"):
            out["tool_calls"] = openai_tool_calls(m["tool_calls"])
        return out
    if role == "user":
        if m.get("tool_calls"):
            return None  # the user simulator acting on its own environment
        return {"role": "user", "content": m.get("content")}
    if role == "tool":
        if m.get("requestor", "assistant") != "assistant":
            return None
        return {"role": "tool", "tool_call_id": m["id"], "content": m.get("content")}
    return None


def _ts_us(text: Any, where: str) -> int:
    try:
        t = dt.datetime.fromisoformat(str(text))
    except ValueError:
        raise ImportFormatError(f"{where}: not {WHAT} (bad timestamp {str(text)[:40]!r})") from None
    if t.tzinfo is not None:
        t = t.astimezone(dt.UTC).replace(tzinfo=None)
    return (t - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)


def _check(src: Path, doc: Any) -> None:
    require(isinstance(doc, dict), src, WHAT, "top level is not an object")
    require(isinstance(doc.get("simulations"), list), src, WHAT, "no simulations list")
    require(isinstance(doc.get("info"), dict), src, WHAT, "no info object")
    env = doc["info"].get("environment_info")
    require(
        isinstance(env, dict) and isinstance(env.get("policy"), str),
        src,
        WHAT,
        "no info.environment_info.policy",
    )
    for k, sim in enumerate(doc["simulations"]):
        require(
            isinstance(sim, dict) and isinstance(sim.get("messages"), list) and "id" in sim,
            src,
            WHAT,
            f"simulation {k} has no id or messages",
        )
        for j, m in enumerate(sim["messages"]):
            ok = isinstance(m, dict) and m.get("role") in ("assistant", "user", "tool")
            require(ok, src, WHAT, f"simulation {k}: message {j} has no known role")
            require("timestamp" in m, src, WHAT, f"simulation {k}: message {j} has no timestamp")
            if m["role"] == "tool":
                require("id" in m, src, WHAT, f"simulation {k}: tool message {j} has no id")
            tool_calls = m.get("tool_calls")
            require(
                tool_calls is None or isinstance(tool_calls, list),
                src,
                WHAT,
                f"simulation {k}: message {j}: tool_calls is not a list",
            )
            for c in tool_calls or []:
                ok = isinstance(c, dict) and all(f in c for f in ("id", "name", "arguments"))
                require(ok, src, WHAT, f"simulation {k}: message {j} has a malformed tool call")
            usage = m.get("usage")
            if m["role"] == "assistant" and usage is not None:
                ok = isinstance(usage, dict) and all(
                    is_int64(usage.get(f)) for f in ("prompt_tokens", "completion_tokens")
                )
                require(ok, src, WHAT, f"simulation {k}: message {j} has malformed usage")


def records(sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]:
    for src in sources:
        doc = load_json(src, WHAT)
        _check(src, doc)
        info = doc["info"]
        system = {
            "role": "system",
            "content": system_prompt(info["environment_info"]["policy"], opts.system),
        }
        agent = info["agent_info"] if isinstance(info.get("agent_info"), dict) else {}
        llm = agent.get("llm")
        model = opts.model or (llm if isinstance(llm, str) else None)
        llm_args: dict[str, Any] = (
            agent["llm_args"] if isinstance(agent.get("llm_args"), dict) else {}
        )
        stamps = [
            _ts_us(m["timestamp"], str(src)) for s in doc["simulations"] for m in s["messages"]
        ]
        origin = min(stamps, default=0)
        for sim in doc["simulations"]:
            yield from _session(src, sim, system, model, llm_args, origin)


def _session(
    src: Path,
    sim: dict[str, Any],
    system: dict[str, Any],
    model: str | None,
    llm_args: dict[str, Any],
    origin: int,
) -> Iterator[RequestRecord]:
    sid = str(sim["id"])
    context: list[dict[str, Any]] = [system]
    last_ts: int | None = None
    turn = 0
    for m in sim["messages"]:
        ts = _ts_us(m["timestamp"], str(src)) - origin
        usage = m.get("usage")
        if m["role"] == "assistant" and usage is not None:
            params: dict[str, Any] = {}
            if model:
                params["model"] = model
            params["messages"] = None
            params.update(llm_args)
            params["max_tokens"] = usage["completion_tokens"]
            raw = m.get("raw_data") if isinstance(m.get("raw_data"), dict) else {}
            calls = openai_tool_calls(m["tool_calls"]) if m.get("tool_calls") else None
            finish = raw.get("finish_reason")
            if not (isinstance(finish, str) and finish):
                finish = "tool_calls" if calls else "stop"
            meta: dict[str, Any] | None = None
            if turn == 0:
                meta = {k: sim[k] for k in ("task_id", "trial", "termination_reason") if k in sim}
                info = sim.get("reward_info")
                reward = info.get("reward") if isinstance(info, dict) else None
                if reward is not None:
                    meta["reward"] = reward
            yield RequestRecord(
                request_id=f"{sid}:{turn}",
                session_id=sid,
                turn=turn,
                start_us=last_ts if last_ts is not None else ts,
                end_us=ts,
                kind=Kind.CHAT,
                params=params,
                content=list(context),
                input_tokens=usage["prompt_tokens"],
                status=200,
                output_text=m.get("content") if isinstance(m.get("content"), str) else None,
                output_tool_calls=calls,
                finish_reason=finish,
                usage_prompt_tokens=usage["prompt_tokens"],
                usage_completion_tokens=usage["completion_tokens"],
                meta=meta or None,
            )
            turn += 1
        msg = agent_message(m)
        if msg is not None:
            context.append(msg)
            last_ts = ts
