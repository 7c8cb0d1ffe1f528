"""Helpers every importer shares: opening (maybe gzipped) sources, reading
JSON and JSONL with errors that name the file and line, the documented
synthetic timing used when a source records none (:class:`SyntheticTiming`,
:class:`SessionClock`), and the rules the chat-transcript importers share:
which message keys OpenAI accepts, how long a recorded reply is
(:func:`reply_tokens`) and what it says (:func:`reply_outcome`)."""

from __future__ import annotations

import argparse
import gzip
import random
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import IO, Any, cast

import orjson

from replayer.errors import ImportFormatError

US = 1_000_000


def open_text(path: Path) -> IO[bytes]:
    """Open a source for binary reading, transparently gunzipping ``.gz``."""
    try:
        f = path.open("rb")
    except OSError as exc:
        raise ImportFormatError(f"{path}: cannot open: {exc.strerror}") from None
    if f.peek(2)[:2] == b"\x1f\x8b":
        f.close()  # GzipFile(fileobj=...) would never close it
        return cast(IO[bytes], gzip.open(path, "rb"))
    return f


def load_json(path: Path, what: str) -> Any:
    """Parse a whole JSON document; the error says which format was expected."""
    try:
        with open_text(path) as f:
            data = f.read()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise ImportFormatError(f"{path}: not readable as {what}: {exc}") from None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ImportFormatError(f"{path}: not {what} (invalid JSON: {exc})") from None


def iter_jsonl(path: Path, what: str) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, value)`` for every non-blank line, streaming."""
    try:
        with open_text(path) as raw:
            for n, line in enumerate(raw, 1):
                if not line.strip():
                    continue
                try:
                    yield n, orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ImportFormatError(
                        f"{path}:{n}: not {what} (invalid JSON: {exc})"
                    ) from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise ImportFormatError(f"{path}: not readable as {what}: {exc}") from None


def require(cond: bool, path: Path | str, what: str, why: str) -> None:
    if not cond:
        raise ImportFormatError(f"{path}: not {what} ({why})")


@dataclass
class SyntheticTiming:
    """Timing for sources without any (tau-bench, SWE-agent).

    Sessions start ``session_gap`` seconds apart; a request's service time is
    ``api_base + api_per_token * output_tokens``; the next turn starts
    ``think`` seconds after it ends. All in seconds; deterministic."""

    session_gap: float = 1.0
    think: float = 2.0
    api_base: float = 0.5
    api_per_token: float = 0.02

    def session_start(self, index: int) -> float:
        return index * self.session_gap

    def service(self, output_tokens: int) -> float:
        return self.api_base + self.api_per_token * output_tokens


def add_timing_arguments(
    parser: Any, defaults: SyntheticTiming | None = None, *, think: bool = True
) -> None:
    """``--session-gap``, ``--think`` (unless the source has its own delays)
    and the service time of a request."""
    d = defaults or SyntheticTiming()
    g = parser.add_argument_group("synthetic timing (the source records none)")
    g.add_argument(
        "--session-gap",
        type=float,
        default=d.session_gap,
        metavar="S",
        help=f"seconds between session starts (default {d.session_gap})",
    )
    if think:
        g.add_argument(
            "--think",
            type=float,
            default=d.think,
            metavar="S",
            help=f"seconds between a reply and the next turn (default {d.think})",
        )
    g.add_argument(
        "--api-base",
        type=float,
        default=d.api_base,
        metavar="S",
        help=f"service time per request (default {d.api_base})",
    )
    g.add_argument(
        "--api-per-token",
        type=float,
        default=d.api_per_token,
        metavar="S",
        help=f"service time per output token (default {d.api_per_token})",
    )


def timing_from(opts: Any) -> SyntheticTiming:
    return SyntheticTiming(opts.session_gap, opts.think, opts.api_base, opts.api_per_token)


def session_starts(n: int, gap: float, rate: float | None, seed: int) -> Iterator[float]:
    """Session start offsets in seconds: every ``gap`` seconds, or a seeded
    Poisson process of ``rate`` sessions per second."""
    rng = random.Random(seed)
    t = 0.0
    for i in range(n):
        if rate:
            yield t
            t += rng.expovariate(rate)
        else:
            yield i * gap


# -- shared by the chat-transcript importers (tau-bench, tau2, SWE-agent) -----

OPENAI_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
"""The chat-message keys every OpenAI-compatible server accepts."""


def message_problem(messages: Any) -> str | None:
    """Why ``messages`` is not a chat message list a trace can hold, or None:
    it must be a list of objects, each with a string ``role`` and a
    ``tool_calls`` that is absent, null or a list."""
    if not isinstance(messages, list):
        return "messages is not a list"
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return f"message {j} is not an object with a role"
        if not isinstance(m.get("tool_calls") or [], list):
            return f"message {j}: tool_calls is not a list"
    return None


def text_chars(content: Any) -> int:
    """Characters of a message content: a string, or the ``text`` of its parts."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(p["text"])
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return 0


def reply_tokens(message: dict[str, Any]) -> int:
    """The documented length estimate of a recorded reply, used as ``max_tokens``
    when a source records no token counts: ``ceil(chars / 4)`` over the content
    text plus every tool call's function name and arguments, and at least 1."""
    chars = text_chars(message.get("content"))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            for key in ("name", "arguments"):
                v = fn.get(key)
                chars += len(v) if isinstance(v, str) else 0
    return max(1, -(-chars // 4))


def reply_outcome(message: dict[str, Any]) -> dict[str, Any]:
    """RequestRecord outcome fields of a recorded assistant message."""
    content = message.get("content")
    calls = message.get("tool_calls")
    calls = calls if isinstance(calls, list) and calls else None
    return {
        "output_text": content if isinstance(content, str) else None,
        "output_tool_calls": calls,
        "finish_reason": "tool_calls" if calls else "stop",
    }


class SessionClock:
    """Synthetic start/end times of one session's requests (see
    :class:`SyntheticTiming`): request k starts ``think`` after request k-1
    ends, and lasts ``service(max_tokens)``. Integer microseconds, each step
    rounded on its own, so the schedule is exact and reproducible."""

    def __init__(self, timing: SyntheticTiming, session_index: int) -> None:
        self.timing = timing
        self._next = round(timing.session_start(session_index) * US)

    def request(self, output_tokens: int) -> tuple[int, int]:
        """(start_us, end_us) of the next request of the session."""
        start = self._next
        end = start + round(self.timing.service(output_tokens) * US)
        self._next = end + round(self.timing.think * US)
        return start, end


def positive_int(text: str) -> int:
    """argparse type of options such as ``--block-size``."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


INT64 = (-(1 << 63), (1 << 63) - 1)


def is_int64(value: Any) -> bool:
    """An integer (not a bool) that fits a trace's int64 columns."""
    return isinstance(value, int) and not isinstance(value, bool) and INT64[0] <= value <= INT64[1]


def seconds_to_us(value: int | float, scale: int = US) -> int:
    """A number of seconds (or of ``US // scale`` units: ``scale=1000`` for
    milliseconds) as integer microseconds, rounded from its shortest decimal
    form, so ``1.000001`` is exactly 1,000,001 µs (no binary float drift)."""
    if isinstance(value, int):
        return value * scale
    return int((Decimal(repr(value)) * scale).to_integral_value(ROUND_HALF_EVEN))


def unique_stems(paths: list[Path]) -> list[str]:
    """A short, stable name per source for request ids: the file name up to its
    first dot; a repeated name gets ``~2``, ``~3`` … in source order."""
    seen: dict[str, int] = {}
    out: list[str] = []
    for p in paths:
        stem = p.name.split(".")[0] or p.name
        n = seen.get(stem, 0) + 1
        seen[stem] = n
        out.append(stem if n == 1 else f"{stem}~{n}")
    return out
