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
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from replayer.errors import OptionError
from replayer.trace.schema import Kind
from replayer.trace.tokens import approx_message_tokens
from replayer.trace.writer import RequestRecord, TraceMeta, TraceWriter

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


@dataclass(frozen=True)
class SynthOptions:
    sessions: int = 8
    turns: int = 12
    context: int = 32_000
    system_tokens: int = 2_000
    tools: int = 12
    reply_tokens: int = 120
    max_tokens: int = 1_024
    payload: str = "chat"
    block_size: int = 64
    rate: float = 0.5
    think: float = 5.0
    seed: int = 0
    model: str = "replayer-synth"
    pool_chars: int = 1 << 22

    def roomy(self) -> bool:
        """Whether ``context`` leaves the turns room to grow (else every turn
        is clamped to it: fine for tests, surprising from the CLI)."""
        return self.context > self.system_tokens + (self.reply_tokens + 80) * self.turns + 300

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise OptionError("sessions", "must be at least 1")
        if self.turns < 1:
            raise OptionError("turns", "must be at least 1")
        if self.block_size < 1:
            raise OptionError("block_size", "must be positive")


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
        system = {"role": "system", "content": self.text.tokens(o.system_tokens, rng)}
        self.system_json, self.system_tok = _dumps(system), approx_message_tokens(system)
        self.tools = _tool_schemas(o.tools, self.text, rng)
        self.blocks = list(range(1, self.system_tok // o.block_size + 1))


def _session(o: SynthOptions, sh: _Shared, s: int, t: float) -> Iterator[RequestRecord]:
    rng = random.Random(f"{o.seed}:{s}")
    text = sh.text
    sid = f"synth-{s:05d}"
    user = {"role": "user", "content": text.tokens(50 + rng.randrange(200), rng)}
    # Messages are serialized once, when appended; the writer takes JSON texts.
    messages: list[str] = [sh.system_json, _dumps(user)]
    ctx = sh.system_tok + approx_message_tokens(user)
    replies = [max(1, int(rng.expovariate(1 / o.reply_tokens))) for _ in range(o.turns)]
    budget = o.context - ctx - (o.turns - 1) * (o.reply_tokens + 12)
    shares = _shares(rng, o.turns - 1) if o.turns > 1 else []
    blocks = list(sh.blocks)
    # block ids: the shared prefix is 1..k; each session numbers its own from
    # a disjoint range so ids stay small integers (they compress well)
    next_block = (s + 1) * (o.context // o.block_size + 2)
    for k in range(o.turns):
        if k:
            if k == o.turns - 1:
                size = max(1, o.context - ctx - 4)  # lands the last request on target
            else:
                size = max(1, int(budget * shares[k - 1]))
            tool = {
                "role": "tool",
                "tool_call_id": f"call_{s}_{k - 1}",
                "content": text.tokens(size, rng),
            }
            messages.append(_dumps(tool))
            ctx += approx_message_tokens(tool)
        reply = replies[k]
        service = 0.2 + 0.02 * reply + 2e-6 * ctx
        last = k == o.turns - 1
        call = (
            None
            if last
            else {
                "id": f"call_{s}_{k}",
                "type": "function",
                "function": {
                    "name": f"tool_{rng.randrange(max(o.tools, 1))}",
                    "arguments": '{"path": "' + text.tokens(max(1, reply // 2), rng) + '"}',
                },
            }
        )
        reply_text = text.tokens(reply, rng) if last else None
        common: dict[str, Any] = dict(
            request_id=f"{sid}-t{k:03d}",
            session_id=sid,
            turn=k,
            start_us=round(t * US),
            end_us=round((t + service) * US),
            status=200,
            finish_reason="stop" if last else "tool_calls",
            output_text=reply_text,
            output_tool_calls=[call] if call else None,
            usage_prompt_tokens=ctx,
            usage_completion_tokens=reply,
            input_tokens=ctx,
        )
        if o.payload == "chat":
            params: dict[str, Any] = {
                "model": o.model,
                "messages": None,
                "max_tokens": o.max_tokens,
                "stream": True,
            }
            if sh.tools:
                params["tools"] = sh.tools
            yield RequestRecord(kind=Kind.CHAT, params=params, content=list(messages), **common)
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
        assistant: dict[str, Any] = {"role": "assistant", "content": reply_text}
        if call:
            assistant["tool_calls"] = [call]
        messages.append(_dumps(assistant))
        ctx += approx_message_tokens(assistant)
        t += service + (rng.expovariate(1 / o.think) if o.think > 0 else 0.0)


def _dumps(message: dict[str, Any]) -> str:
    return orjson.dumps(message).decode()


def write_trace(path: Path, o: SynthOptions) -> int:
    meta = TraceMeta(source="synth", details={"options": asdict(o)})
    with TraceWriter(path, meta, form="file") as w:
        for rec in sessions(o):
            w.add(rec)
        return w.rows
