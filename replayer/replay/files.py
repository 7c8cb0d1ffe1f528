"""A run directory's files, each read and written through one declaration:
``run.json`` (what ran: command, trace, selection, policy, server, facts),
``summary.json`` (what happened, per target) and ``signature.json`` (the
crash, named from the server's log). Every reader of a run directory (the
report, compare, ``--from-run``, the service, a bisect resuming an old
journal) goes through :func:`read_run`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from replayer._runfile import JsonFile, RunFileError

RUN = JsonFile("run.json", 1, "a run directory")
"""Version 1: ``format_version`` stamped (files before it are version 0,
the same shape)."""

SUMMARY = JsonFile("summary.json", 1, "a run directory")
"""Version 1: ``format_version`` stamped (files before it are version 0,
the same shape)."""


@dataclass(frozen=True)
class RunDir:
    """A run directory read back: ``run.json``, ``summary.json`` (when the
    run got that far) and ``signature.json`` (when it crashed with a log)."""

    path: Path
    info: Mapping[str, Any]
    summary: Mapping[str, Any] | None = None
    signature: Mapping[str, Any] | None = field(default=None)

    @property
    def launch(self) -> str | None:
        """The command that launched the server, as recorded (secrets masked)."""
        server = self.info.get("server") or {}
        launch = server.get("launch")
        return str(launch) if launch else None

    @property
    def targets(self) -> Mapping[str, Mapping[str, Any]]:
        got: Mapping[str, Mapping[str, Any]] = (self.summary or {}).get("targets", {})
        return got

    @property
    def failure(self) -> Mapping[str, Any] | None:
        """The first failed target's failure, or None."""
        return next((t["failure"] for t in self.targets.values() if t.get("failure")), None)


def read_run(path: Path) -> RunDir:
    """A run directory, every file at the current version (see :mod:`replayer._runfile`)."""
    info = RUN.load(path)
    summary = SUMMARY.load(path) if SUMMARY.exists(path) else None
    sig = None
    sig_path = path / "signature.json"
    if sig_path.is_file():
        try:
            sig = orjson.loads(sig_path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise RunFileError(f"{sig_path}: cannot read: {exc}") from None
    return RunDir(path, info, summary, sig)


def read_summary(path: Path) -> dict[str, Any] | None:
    """A run directory's ``summary.json`` (None when the run never wrote one)."""
    return SUMMARY.load(path) if SUMMARY.exists(path) else None
