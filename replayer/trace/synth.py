"""``replayer synth``: agent sessions with the shape that breaks servers.

N sessions of T turns, each growing to a target context. Every session starts
with the same system prompt and tool schema (a warm shared prefix, as coding
agents have), then alternates assistant tool calls with tool outputs whose
sizes are log-normal (file reads and command output: mostly hundreds of
tokens, sometimes thousands) and rescaled so the last turn reaches the target
context. Sessions arrive as a Poisson process; turns are separated by
exponential think times. ``chat`` payloads carry filler text; ``blocks``
payloads carry the same structure as content-block ids (shared prefix blocks
are shared across sessions). Everything is a pure function of ``--seed``.

``api`` picks the wire format of ``chat`` payloads: OpenAI chat completions,
Anthropic Messages (top-level ``system``, ``tool_use``/``tool_result``
blocks: what Claude Code sends) or OpenAI Responses (``instructions``,
``function_call``/``function_call_output`` items: what Codex sends). The
session is the same in all three: same texts, sizes and turns (timing
differs by the microseconds each framing's token count moves it).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from replayer.options.trace import SynthOptions as SynthOptions
from replayer.trace.model import RequestRecord, TraceMeta
from replayer.trace.schema import Kind
from replayer.trace.tokens import approx_item_tokens, approx_message_tokens, approx_text_tokens
from replayer.trace.writer import TraceWriter

CHARS_PER_TOKEN = 4
US = 1_000_000

_WORDS = """
the of and to in is for on that with as by this be are from at or it an was which
function return value error file line test build config server request response cache
block token model kernel memory buffer stream session turn context prefix attention
layer batch queue schedule worker engine device stack trace index offset length size
import class def self none true false if else while yield async await raise except
path dir src lib include struct int float bool string list dict map set key hash
""".split()


class _Text:
    """Filler text as slices of one seeded word pool: cheap to cut, and with
    a pool larger than zstd's window it compresses like real prose."""

    def __init__(self, rng: random.Random, pool_chars: int) -> None:
        words: list[str] = []
        n = 0
        while n < pool_chars:
            w = rng.choice(_WORDS)
            words.append(w)
            n += len(w) + 1
        self.pool = " ".join(words)

    def tokens(self, n: int, rng: random.Random) -> str:
        chars = max(1, n * CHARS_PER_TOKEN)
        out = []
        while chars > 0:
            start = rng.randrange(len(self.pool))
            piece = self.pool[start : start + chars]
            out.append(piece)
            chars -= len(piece)
        return "".join(out)


def _tool_schemas(n: int, text: _Text, rng: random.Random) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": text.tokens(40, rng),
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "query": {"type": "string"}},
                    "required": ["path"],
                },
            },
        }
        for i in range(n)
    ]


def _shares(rng: random.Random, n: int) -> list[float]:
    """How the tool-output budget splits over turns: log-normal, so most tool
    outputs are modest and a few (whole-file reads) are large."""
    draws = [rng.lognormvariate(0.0, 1.0) for _ in range(n)]
    total = sum(draws)
    return [d / total for d in draws]


def sessions(o: SynthOptions) -> Iterator[RequestRecord]:
    """Every request of every session, in trace (start time) order.

    Sessions are independent generators (each with its own seeded RNG, so the
    output does not depend on interleaving) merged by start time: writing in
    trace order lets a replay stream the file front to back. Context is
    counted with the project's token approximation
    (:func:`~replayer.trace.tokens.approx_message_tokens`), the same count the
    writer stores and the emulator serves, and the last tool output of each
    session is sized so its final request has exactly ``context`` tokens."""
    rng = random.Random(o.seed)
    shared = _Shared(o)
    starts = []
    t = 0.0
    for s in range(o.sessions):
        if s and o.rate > 0:
            t += rng.expovariate(o.rate)
        starts.append(t)
    gens = [_session(o, shared, s, starts[s]) for s in range(o.sessions)]
    return heapq.merge(*gens, key=lambda r: (r.start_us, r.request_id))


class _Shared:
    """What every session shares: the word pool, system prompt and tools."""

    def __init__(self, o: SynthOptions) -> None:
        rng = random.Random(o.seed ^ 0x5EED)
        self.text = _Text(rng, o.pool_chars)
        self.system_text = self.text.tokens(o.system_tokens, rng)
        system = {"role": "system", "content": self.system_text}
        self.system_json, self.system_tok = _dumps(system), approx_message_tokens(system)
        self.tools = _tool_schemas(o.tools, self.text, rng)
        self.blocks = list(range(1, self.system_tok // o.block_size + 1))
        self.api = _API[o.api](self)


class _Chat:
    """How a session's events read in one API (this one: chat completions)."""

    kind = Kind.CHAT

    def __init__(self, sh: _Shared) -> None:
        self.sh = sh

    def head(self) -> list[str]:
        """The items every session starts with (chat: the system message)."""
        return [self.sh.system_json]

    def head_tokens(self) -> int:
        return self.sh.system_tok

    def count(self, item: dict[str, Any]) -> int:
        return approx_message_tokens(item)

    def user(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def call(self, call_id: str, name: str, arguments: str) -> dict[str, Any]:
        """The assistant's tool call as the response carries it."""
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def assistant(self, text: str | None, call: dict[str, Any] | None) -> list[dict[str, Any]]:
        """What the next request carries of the reply."""
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if call:
            msg["tool_calls"] = [call]
        return [msg]

    def result(self, call_id: str, text: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    def params(self, o: SynthOptions) -> dict[str, Any]:
        p: dict[str, Any] = {"model": o.model, "messages": None, "max_tokens": o.max_tokens}
        p["stream"] = True
        if self.sh.tools:
            p["tools"] = self.sh.tools
        return p

    finish = {"stop": "stop", "tool": "tool_calls"}


class _Messages(_Chat):
    """Anthropic Messages, shaped like Claude Code's requests."""

    kind = Kind.MESSAGES
    finish = {"stop": "end_turn", "tool": "tool_use"}

    def head(self) -> list[str]:
        return []

    def head_tokens(self) -> int:
        return approx_text_tokens(self.sh.system_text) + 4

    def count(self, item: dict[str, Any]) -> int:
        return approx_item_tokens(item)

    def user(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "text", "text": text}]}

    def call(self, call_id: str, name: str, arguments: str) -> dict[str, Any]:
        return {"type": "tool_use", "id": call_id, "name": name, "input": orjson.loads(arguments)}

    def assistant(self, text: str | None, call: dict[str, Any] | None) -> list[dict[str, Any]]:
        blocks = [call] if call else [{"type": "text", "text": text or ""}]
        return [{"role": "assistant", "content": blocks}]

    def result(self, call_id: str, text: str) -> dict[str, Any]:
        block = {"type": "tool_result", "tool_use_id": call_id, "content": text}
        return {"role": "user", "content": [block]}

    def params(self, o: SynthOptions) -> dict[str, Any]:
        p: dict[str, Any] = {"model": o.model, "messages": None}
        p["system"] = [{"type": "text", "text": self.sh.system_text}]
        if self.sh.tools:
            p["tools"] = _flat_tools(self.sh.tools, {}, "input_schema")
        p["max_tokens"] = o.max_tokens
        p["stream"] = True
        return p


class _Responses(_Messages):
    """OpenAI Responses, shaped like Codex's requests (full input every turn:
    no ``previous_response_id``, as vLLM keeps no store by default)."""

    kind = Kind.RESPONSES
    finish = {"stop": "completed", "tool": "completed"}

    def user(self, text: str) -> dict[str, Any]:
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }

    def call(self, call_id: str, name: str, arguments: str) -> dict[str, Any]:
        return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}

    def assistant(self, text: str | None, call: dict[str, Any] | None) -> list[dict[str, Any]]:
        if call:
            return [call]
        content = [{"type": "output_text", "text": text or ""}]
        return [{"type": "message", "role": "assistant", "content": content}]

    def result(self, call_id: str, text: str) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": call_id, "output": text}

    def params(self, o: SynthOptions) -> dict[str, Any]:
        p: dict[str, Any] = {"model": o.model, "instructions": self.sh.system_text}
        p["input"] = None
        if self.sh.tools:
            p["tools"] = _flat_tools(self.sh.tools, {"type": "function"}, "parameters")
        p["max_output_tokens"] = o.max_tokens
        p["stream"] = True
        return p


def _flat_tools(
    tools: list[dict[str, Any]], head: dict[str, Any], schema_key: str
) -> list[dict[str, Any]]:
    """Chat's tool schemas without the ``function`` wrapper (Messages and
    Responses both flatten it; they name the JSON schema differently)."""
    return [
        {
            **head,
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            schema_key: t["function"]["parameters"],
        }
        for t in tools
    ]


_API: dict[str, type[_Chat]] = {"chat": _Chat, "messages": _Messages, "responses": _Responses}
APIS: tuple[str, ...] = tuple(_API)


def _session(o: SynthOptions, sh: _Shared, s: int, t: float) -> Iterator[RequestRecord]:
    rng = random.Random(f"{o.seed}:{s}")
    text, api = sh.text, sh.api
    sid = f"synth-{s:05d}"
    user = api.user(text.tokens(50 + rng.randrange(200), rng))
    # Items are serialized once, when appended; the writer takes JSON texts.
    items: list[str] = [*api.head(), _dumps(user)]
    ctx = api.head_tokens() + api.count(user)
    replies = [max(1, int(rng.expovariate(1 / o.reply_tokens))) for _ in range(o.turns)]
    budget = o.context - ctx - (o.turns - 1) * (o.reply_tokens + 12)
    shares = _shares(rng, o.turns - 1) if o.turns > 1 else []
    blocks = list(sh.blocks)
    # block ids: the shared prefix is 1..k; each session numbers its own from
    # a disjoint range so ids stay small integers (they compress well)
    next_block = (s + 1) * (o.context // o.block_size + 2)
    params = api.params(o) if o.payload == "chat" else None
    for k in range(o.turns):
        if k:
            if k == o.turns - 1:
                size = max(1, o.context - ctx - 4)  # lands the last request on target
            else:
                size = max(1, int(budget * shares[k - 1]))
            tool = api.result(f"call_{s}_{k - 1}", text.tokens(size, rng))
            items.append(_dumps(tool))
            ctx += api.count(tool)
        reply = replies[k]
        service = 0.2 + 0.02 * reply + 2e-6 * ctx
        last = k == o.turns - 1
        call = (
            None
            if last
            else api.call(
                f"call_{s}_{k}",
                f"tool_{rng.randrange(max(o.tools, 1))}",
                '{"path": "' + text.tokens(max(1, reply // 2), rng) + '"}',
            )
        )
        reply_text = text.tokens(reply, rng) if last else None
        common: dict[str, Any] = dict(
            request_id=f"{sid}-t{k:03d}",
            session_id=sid,
            turn=k,
            start_us=round(t * US),
            end_us=round((t + service) * US),
            status=200,
            finish_reason=api.finish["stop" if last else "tool"],
            output_text=reply_text,
            output_tool_calls=[call] if call else None,
            usage_prompt_tokens=ctx,
            usage_completion_tokens=reply,
            input_tokens=ctx,
        )
        if params is not None:
            yield RequestRecord(kind=api.kind, params=params, content=list(items), **common)
        else:
            full = ctx // o.block_size
            while len(blocks) < full:
                blocks.append(next_block)
                next_block += 1
            yield RequestRecord(
                kind=Kind.BLOCKS,
                params={
                    "model": o.model,
                    "prompt": None,
                    "max_tokens": reply,
                    "ignore_eos": True,
                    "stream": True,
                },
                content=list(blocks[:full]),
                block_size=o.block_size,
                **common,
            )
        for item in api.assistant(reply_text, call):
            items.append(_dumps(item))
            ctx += api.count(item)
        t += service + (rng.expovariate(1 / o.think) if o.think > 0 else 0.0)


def _dumps(message: dict[str, Any]) -> str:
    return orjson.dumps(message).decode()


def write_trace(path: Path, o: SynthOptions) -> int:
    meta = TraceMeta(source="synth", details={"options": o.to_dict()})
    with TraceWriter(path, meta, form="file") as w:
        for rec in sessions(o):
            w.add(rec)
        return w.rows
