"""Helpers every importer shares: opening (maybe gzipped) sources, reading
JSON and JSONL with errors that name the file and line, and the documented
synthetic timing used when a source records none."""

from __future__ import annotations

import gzip
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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
        return gzip.GzipFile(fileobj=f)  # type: ignore[return-value]
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


def add_timing_arguments(parser: Any, defaults: SyntheticTiming | None = None) -> None:
    d = defaults or SyntheticTiming()
    g = parser.add_argument_group("synthetic timing (the source records none)")
    g.add_argument(
        "--session-gap",
        type=float,
        default=d.session_gap,
        metavar="S",
        help=f"seconds between session starts (default {d.session_gap})",
    )
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
