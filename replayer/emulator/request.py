"""A request inside the simulated engine, and its output channel.

The engine mutates a :class:`Request` as it schedules and computes it; the
HTTP handler awaits :meth:`Request.next` and gets an :class:`Output` with
everything new since it last looked - several tokens merged when it reads
slower than the engine produces, as vLLM's ``RequestOutputCollector`` merges
them. An error (engine death, per-request failure) replaces undelivered
tokens, as vLLM's ``propagate_error`` does.

No scheduling policy here; see :mod:`.engine`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from replayer.emulator.kvcache import Block

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"
DEAD, INTERNAL = "dead", "internal"


@dataclass(slots=True)
class Output:
    """What a request produced since the handler last looked."""

    start: int
    """Index of the first new output token."""
    tokens: int
    """New output tokens."""
    finish: str | None = None
    """Finish reason once finished (``stop``, ``length``)."""
    error: str | None = None
    """``dead`` (engine died) or ``internal`` (per-request error); replaces tokens."""
    cut: bool = False
    """The connection must be dropped mid-body."""


@dataclass(slots=True, eq=False)
class Request:
    """One request inside the engine."""

    n: int
    """Arrival number at the engine (1-based)."""
    engine_id: str
    """vLLM's internal id, ``chatcmpl-<id>-<8 hex>``."""
    prompt_len: int
    hashes: list[bytes]
    """Chained hashes of the prompt's full blocks."""
    max_tokens: int
    """Tokens it will generate."""
    length_reason: str
    """Finish reason when ``max_tokens`` is reached (``length`` or ``stop``)."""
    params_max_tokens: int
    """The client's ``max_tokens`` (or the effective one), for the histogram."""
    arrival: float
    """``time.monotonic()`` at arrival."""
    session_index: int = 0
    turn: int = 0
    text_seed: int = 0
    """Where its filler text starts in the word cycle."""
    phase: str = WAITING
    num_computed: int = 0
    """Tokens whose KV is computed (prompt, then outputs)."""
    num_output: int = 0
    num_cached: int = 0
    """Prefix-cache hit at arrival (reported as ``cached_tokens``)."""
    registered: int = 0
    """Prompt blocks already put in the prefix cache."""
    preemptions: int = 0
    blocks: list[Block] = field(default_factory=list)
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    delivered: int = 0
    """Output tokens the handler has taken."""
    finish: str | None = None
    error: str | None = None
    cut: bool = False
    spec_steps: list[int] | None = None
    """With speculative decoding: the draft tokens each of its verify steps
    accepted, in order (what ``metrics.speculative_decoding`` reports)."""
    event: asyncio.Event = field(default_factory=asyncio.Event)
    """Set whenever there is something new for the handler."""

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output

    def take(self) -> Output:
        """Everything new since the last call; an error replaces unsent tokens,
        as vLLM's ``propagate_error`` does."""
        self.event.clear()
        if self.error is not None:
            return Output(self.delivered, 0, error=self.error, cut=self.cut)
        out = Output(self.delivered, self.num_output - self.delivered, self.finish, cut=self.cut)
        self.delivered = self.num_output
        return out

    async def next(self) -> Output:
        while not self._ready():
            await self.event.wait()
        return self.take()

    def _ready(self) -> bool:
        return (
            self.error is not None
            or self.cut
            or self.finish is not None
            or self.num_output > self.delivered
        )
