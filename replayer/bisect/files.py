"""A bisect directory's own files, each through one declaration: the journal
(``journal.jsonl``: one event a line, trials fsynced before the search moves
on) and the ``--vary`` report (``variants.json``).

The journal opens with a ``format`` event naming its version; a journal
from a newer replayer is refused before any trial is resumed from it (its
events might mean something else), one from before versions (no ``format``
line) is version 0, the same events.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from replayer._files import append_records
from replayer._runfile import JsonFile, RunFileError
from replayer._version import __version__

JOURNAL_NAME = "journal.jsonl"
JOURNAL_VERSION = 1
"""Version 1: the ``format`` event first; the events themselves as version 0."""

VARIANTS = JsonFile("variants.json", 1, "a vary report")
"""Version 1 is the first stamped (earlier reports, the same shape, are 0)."""


def journal_header() -> dict[str, Any]:
    """The first event of a new journal."""
    return {"event": "format", "format_version": JOURNAL_VERSION, "replayer": __version__}


def append_journal(path: Path, events: Iterable[Mapping[str, Any]], *, sync: bool = True) -> None:
    """Append ``events`` to the journal at ``path`` all or nothing (the
    ``format`` event first in a new one); ``sync`` makes them durable before
    the search acts on them. A full disk leaves the journal as it was and
    raises :class:`~replayer.errors.DiskFullError`: a resume then repeats no
    journaled trial."""
    out = list(events)
    if not path.exists() or path.stat().st_size == 0:
        out.insert(0, journal_header())
    append_records(path, [orjson.dumps(e) + b"\n" for e in out], sync=sync)


def check_event(e: Mapping[str, Any], where: Path) -> None:
    """Refuse a journal a newer replayer wrote (at its ``format`` event)."""
    if e.get("event") != "format":
        return
    v = e.get("format_version")
    if not isinstance(v, int) or v > JOURNAL_VERSION:
        raise RunFileError(
            f"{where}: written by a newer replayer (journal version {v}; this one reads up "
            f"to {JOURNAL_VERSION}): upgrade replayer to resume or read it"
        )


def journal_events(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(byte offset after the event, event) for every whole event of a journal;
    stops at a torn last line (a killed bisect's), which callers may cut."""
    at = 0
    for line in path.read_bytes().splitlines(keepends=True):
        try:
            e = orjson.loads(line) if line.strip() else {}
        except orjson.JSONDecodeError:
            return
        at += len(line)
        if isinstance(e, dict):
            check_event(e, path)
            yield at, e


def journal_trials(path: Path) -> list[dict[str, Any]]:
    """Every trial record of a journal, as the report and the service list them."""
    out = []
    for _, e in journal_events(path):
        if e.get("event") == "trial":
            out.append({**e["record"], "timing": e.get("timing"), "speed": e.get("speed")})
    return out


def read_variants(path: Path) -> dict[str, Any]:
    """A ``variants.json`` report at the current version."""
    if not VARIANTS.exists(path):
        raise RunFileError(f"{path}: holds no {VARIANTS.name}")
    return VARIANTS.load(path)
