"""Azure LLM inference trace 2023 (Splitwise, ISCA'24; Azure/AzurePublicDataset):
CSV files with the header ``TIMESTAMP,ContextTokens,GeneratedTokens``, one row
per request, ``TIMESTAMP`` naive ``YYYY-MM-DD HH:MM:SS.fffffff`` (7 fractional
digits, ascending). The trace records lengths and arrival times only: no
sessions, no prefix reuse, no text.

Mapping, and why:

* **One request per row, each its own session** (``session_id`` = request id,
  turn 0). The trace has no conversations, and inventing some would invent
  cache reuse that was never recorded.
* **Payload: ``blocks`` with no block ids** and ``input_tokens =
  ContextTokens``, so every prompt token is a *tail* token drawn from the
  request id (see :mod:`replayer.trace.tokens`): prompts are unique per
  request and share nothing, exactly what the data says. ``--block-size``
  (default 16, vLLM's KV block) only labels the rows; with no ids it changes
  no token.
* **Body**: ``{"model"?, "prompt", "max_tokens": GeneratedTokens,
  "ignore_eos": true}`` so the server decodes the recorded length.
  ``usage_prompt_tokens`` / ``usage_completion_tokens`` keep the recorded
  counts.
* **Timing**: ``start_us = TIMESTAMP - earliest TIMESTAMP`` over all sources
  (files given together share one clock), computed in integer nanoseconds
  from the text and rounded to the nearest microsecond (half up), so there
  is no float drift. No end times (none recorded).
* **Ids**: ``<file stem>-<row index, 6 digits>`` (0-based data row), stable
  across re-imports; rows are yielded in file order (trace order for these
  ascending files).

The CSV is streamed (two passes: the first finds the earliest timestamp and
validates every row, so a malformed row fails before anything is written).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gzip
import io
import re
from collections.abc import Iterator
from pathlib import Path

from replayer.errors import ImportFormatError
from replayer.trace.importers.common import open_text, positive_int, unique_stems
from replayer.trace.model import RequestRecord
from replayer.trace.schema import Kind

NAME = "azure"
WHAT = "an Azure LLM inference trace CSV"
HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
_TS = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?")
_EPOCH = dt.datetime(1970, 1, 1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--block-size",
        type=positive_int,
        default=16,
        help="block size recorded on the rows (default 16; rows carry no block ids)",
    )
    p.add_argument("--model", default=None, help="model name for the bodies (default: none)")


def details(sources: list[Path], opts: argparse.Namespace) -> dict[str, object]:
    return {"block_size": opts.block_size}


def parse_timestamp_ns(text: str) -> int | None:
    """``YYYY-MM-DD HH:MM:SS[.f{1,9}]`` as integer nanoseconds since the epoch
    (naive, read as UTC), or None when the text is not that."""
    m = _TS.fullmatch(text)
    if m is None:
        return None
    try:
        whole = dt.datetime.fromisoformat(m.group(1))
    except ValueError:
        return None
    secs = (whole - _EPOCH) // dt.timedelta(seconds=1)
    frac = (m.group(2) or "").ljust(9, "0")
    return secs * 1_000_000_000 + int(frac)


def _rows(path: Path) -> Iterator[tuple[int, int, int, int]]:
    """Yield ``(line, timestamp_ns, context_tokens, generated_tokens)``."""
    try:
        with (
            open_text(path) as raw,
            io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text,
        ):
            reader = csv.reader(text)
            header = next(reader, None)
            if header is None:
                raise ImportFormatError(f"{path}: not {WHAT} (empty file)")
            if [h.strip() for h in header] != HEADER:
                raise ImportFormatError(f"{path}:1: not {WHAT} (header is not {','.join(HEADER)})")
            for row in reader:
                line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != 3:
                    raise ImportFormatError(
                        f"{path}:{line}: not {WHAT} (has {len(row)} of the 3 fields)"
                    )
                ts = parse_timestamp_ns(row[0].strip())
                if ts is None:
                    raise ImportFormatError(
                        f"{path}:{line}: not {WHAT} (bad TIMESTAMP {row[0][:40]!r})"
                    )
                try:
                    ctx, gen = int(row[1]), int(row[2])
                except ValueError:
                    raise ImportFormatError(
                        f"{path}:{line}: not {WHAT} (token counts must be integers)"
                    ) from None
                if not (0 <= ctx < 1 << 48 and 0 <= gen < 1 << 48):
                    raise ImportFormatError(f"{path}:{line}: not {WHAT} (token count out of range)")
                yield line, ts, ctx, gen
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError, csv.Error) as exc:
        raise ImportFormatError(f"{path}: not readable as {WHAT}: {exc}") from None


def records(sources: list[Path], opts: argparse.Namespace) -> Iterator[RequestRecord]:
    origin: int | None = None
    for src in sources:
        for _, ts, _, _ in _rows(src):
            origin = ts if origin is None else min(origin, ts)
    if origin is None:
        return
    for src, stem in zip(sources, unique_stems(sources), strict=True):
        for i, (_, ts, ctx, gen) in enumerate(_rows(src)):
            params: dict[str, object] = {}
            if opts.model:
                params["model"] = opts.model
            params["prompt"] = None
            params["max_tokens"] = gen
            params["ignore_eos"] = True
            rid = f"{stem}-{i:06d}"
            yield RequestRecord(
                request_id=rid,
                session_id=rid,
                turn=0,
                start_us=(ts - origin + 500) // 1000,
                kind=Kind.BLOCKS,
                params=params,
                content=[],
                block_size=opts.block_size,
                input_tokens=ctx,
                usage_prompt_tokens=ctx,
                usage_completion_tokens=gen,
            )
