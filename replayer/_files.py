"""Output files that never clobber or half-write: results are written to a
temporary sibling and renamed into place only when complete."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from replayer.errors import UsageError


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path; rename it to ``path`` if the block succeeds.

    An existing ``path`` is refused unless ``force``: replayer never
    overwrites a trace or a result by accident."""
    out = Path(path)
    if out.exists() and not force:
        raise UsageError(f"{out} already exists (use --force to overwrite)")
    if out.parent and not out.parent.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def parse_json_or_toml(path: Path, text: str) -> object:
    """``text`` as TOML for a ``.toml`` file, JSON for ``.json``, else JSON
    then TOML: the one rule for the files users hand over (fault rules,
    server variants). Raises ValueError naming what it expected."""
    import json
    import tomllib

    suffix = path.suffix.lower()
    kind = {".toml": "TOML", ".json": "JSON"}.get(suffix, "JSON or TOML")
    try:
        if suffix == ".toml":
            return tomllib.loads(text)
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            if suffix == ".json":
                raise
            return tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"not {kind} ({exc})") from None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of an append-only JSONL journal (control runs, variant
    runs); [] when it does not exist. A torn last line (a killed writer) is
    cut off the file, so the next append starts a line of its own."""
    import orjson

    if not path.exists():
        return []
    out: list[dict[str, Any]] = []
    at = 0
    data = path.read_bytes()
    for line in data.splitlines(keepends=True):
        if line.strip():
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                with path.open("r+b") as f:
                    f.truncate(at)
                break
        at += len(line)
    return out
