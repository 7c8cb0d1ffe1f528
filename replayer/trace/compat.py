"""Migrations between trace schema versions (mitmproxy's ``io/compat.py``).

``TRACE_SCHEMA_VERSION`` is bumped by one for every change to the format, and
each bump adds a pure ``migrate_N_to_N1(table) -> table`` step here. Version 1
is the first; there is nothing to migrate yet, so older files are refused.
"""

from __future__ import annotations

from pathlib import Path

from replayer.errors import TraceError

MIGRATIONS: dict[int, object] = {}


def check_migratable(path: Path, version: int) -> None:
    if version not in MIGRATIONS:
        raise TraceError(f"{path}: trace schema v{version} is not readable by this replayer")
