"""Run files (``run.json``, ``summary.json``, ``manifest.json``,
``variants.json``, the journal) written and read through one declaration each.

A :class:`JsonFile` stamps what it writes with its format version and checks
it on the way back: a file from a newer replayer is a clear
:class:`RunFileError` (exit 2), never a ``KeyError`` three calls later; an
older one is brought up to date by the file's migrations, one version at a
time, so every reader sees the current shape. Writes go through a temporary
file and a rename: a reader never sees half a file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from replayer._files import write_atomic
from replayer.errors import ReplayerError

Migration = Callable[[dict[str, Any]], dict[str, Any]]


class RunFileError(ReplayerError):
    """A run file that cannot be read: missing, not JSON, or from a newer replayer."""


@dataclass(frozen=True)
class JsonFile:
    """One run file's name, current version and migrations (``migrations[v]``
    turns version ``v`` into ``v + 1``; files written before versions were
    stamped are version 0)."""

    name: str
    version: int
    what: str
    """For messages: "a run directory", "a repro bundle" ..."""
    key: str = "format_version"
    migrations: Mapping[int, Migration] = field(default_factory=dict)

    def path(self, directory: Path) -> Path:
        return directory / self.name

    def load(self, directory: Path) -> dict[str, Any]:
        """The file's content at the current version (see the module doc)."""
        p = self.path(directory)
        try:
            data = orjson.loads(p.read_bytes())
        except FileNotFoundError:
            raise RunFileError(f"{directory}: not {self.what} (no {self.name})") from None
        except OSError as exc:
            raise RunFileError(f"{p}: cannot read: {exc.strerror}") from None
        except orjson.JSONDecodeError as exc:
            raise RunFileError(f"{p}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise RunFileError(f"{p}: not a JSON object")
        return self.upgrade(data, p)

    def upgrade(self, data: dict[str, Any], where: Path | str) -> dict[str, Any]:
        v = data.get(self.key, 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise RunFileError(f"{where}: {self.key} {v!r} is not a version")
        if v > self.version:
            raise RunFileError(
                f"{where}: written by a newer replayer ({self.name} version {v}; this one reads "
                f"up to {self.version}): upgrade replayer"
            )
        while v < self.version:
            step = self.migrations.get(v)
            data = step(dict(data)) if step is not None else dict(data)
            v += 1
            data[self.key] = v
        return data

    def exists(self, directory: Path) -> bool:
        return self.path(directory).is_file()

    def write(self, directory: Path, data: Mapping[str, Any]) -> Path:
        """Write ``data`` stamped with the current version, atomically: on a
        full disk the previous file stays as it was and no temporary is left
        (:class:`~replayer.errors.DiskFullError` names the file)."""
        p = self.path(directory)
        body = {self.key: self.version, **{k: v for k, v in data.items() if k != self.key}}
        write_atomic(p, orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
        return p
