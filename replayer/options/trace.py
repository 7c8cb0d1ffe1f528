"""How ``synth`` shapes agent sessions (:class:`SynthOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from replayer._declare import Declared, option
from replayer.errors import OptionError


class Payload(StrEnum):
    CHAT = "chat"
    """Messages with filler text."""
    BLOCKS = "blocks"
    """The same structure as content-block ids (token-id completions)."""


class SynthApi(StrEnum):
    """The wire format of chat payloads."""

    CHAT = "chat"
    MESSAGES = "messages"
    RESPONSES = "responses"


@dataclass(frozen=True)
class SynthOptions(Declared):
    """N agent sessions of T turns, each growing to a target context
    (:mod:`replayer.trace.synth`); everything is a pure function of ``seed``."""

    __group__ = "sessions"
    __verbs__ = frozenset({"synth"})

    sessions: int = option(8, "number of sessions", ge=1)
    turns: int = option(12, "requests per session", ge=1)
    context: int = option(32_000, "context tokens of each session's last request", ge=1)
    system_tokens: int = option(2_000, "tokens of the system prompt shared by all sessions", ge=0)
    tools: int = option(12, "tool schemas shared by all sessions", ge=0)
    reply_tokens: int = option(120, "mean tokens of an assistant reply", ge=1)
    max_tokens: int = option(1_024, "max_tokens of every body", ge=1)
    payload: Payload = option(Payload.CHAT, "chat: filler text; blocks: token-id completions")
    api: SynthApi = option(
        SynthApi.CHAT,
        "wire format of chat payloads: OpenAI chat completions (default), Anthropic Messages "
        "(Claude Code's shape) or OpenAI Responses (Codex's shape)",
    )
    """chat payloads as ``chat`` (completions), ``messages`` or ``responses``."""
    block_size: int = option(64, "tokens per block", ge=1)
    rate: float = option(0.5, "session arrivals per second (Poisson; 0 = all at once)", ge=0)
    think: float = option(5.0, "mean think time in seconds", ge=0)
    seed: int = option(0, "the seed everything is drawn from")
    model: str = option("replayer-synth", "model name written into the bodies")
    pool_chars: int = option(1 << 22, "characters of the filler word pool", cli=False, ge=1024)

    def validate(self) -> None:
        if self.api is not SynthApi.CHAT and self.payload is not Payload.CHAT:
            raise OptionError("api", f"{self.api} needs chat payloads (blocks are completions)")

    def roomy(self) -> bool:
        """Whether ``context`` leaves the turns room to grow (else every turn
        is clamped to it: fine for tests, surprising from the CLI)."""
        return self.context > self.system_tokens + (self.reply_tokens + 80) * self.turns + 300
