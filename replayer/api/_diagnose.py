"""``diagnose_bundle``: relaunch the server once per diagnostic profile,
replay a bundle, and name the faulting kernel in its README."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replayer.api._common import DEFAULT_WATCH, Say, _stamped, _stderr, _watch
from replayer.api._replay import _bundle_session
from replayer.errors import OptionError
from replayer.options import Server, WatchConfig


@dataclass(frozen=True)
class DiagnoseResult:
    """``bundle diagnose``: one row per profile, the reading, the kernel named."""

    rows: tuple[dict[str, Any], ...]
    reading: str
    out: Path
    """Where the profiles' runs and server logs are."""

    @property
    def fault(self) -> dict[str, Any] | None:
        """The first profile's finding: ``kernel``, ``file``, ``line``, ``how``."""
        return next((r["fault"] for r in self.rows if r.get("fault")), None)

    @property
    def ran(self) -> int:
        return sum(1 for r in self.rows if r.get("outcome") and r["outcome"] != "INFRA")


async def diagnose_bundle(
    bundle: str | os.PathLike[str],
    server: Server,
    profiles: Sequence[str] = ("default",),
    *,
    out: str | os.PathLike[str] | None = None,
    watch: WatchConfig | None = DEFAULT_WATCH,
    say: Say = _stderr,
) -> DiagnoseResult:
    """Relaunch ``server`` once per profile of ``profiles`` (files,
    ``default`` or ``default:NAME,...``; see :mod:`replayer.bundle.diagnose`),
    replay the bundle once on each, and read the faulting kernel, file and
    line from each run's server log. The rows go into the bundle's
    ``manifest.json`` (``diagnosis``) and its README's "Diagnosis" section;
    the runs into ``out`` (default: ``BUNDLE-diagnose-<timestamp>`` beside
    the bundle, so the bundle's tarball stays small)."""
    from replayer.bundle.diagnose import apply, find_fault, load_profiles, reading
    from replayer.bundle.export import refresh
    from replayer.bundle.files import read_manifest
    from replayer.target.facts import redact_command

    if server.launch is None:
        raise OptionError(
            "server",
            "of bundle diagnose is one replayer launches (give launch): each profile "
            "relaunches it with its settings",
        )
    w = _watch(watch, "bundle diagnose")
    d = Path(bundle)
    chosen = load_profiles(profiles, server.launch)
    if not chosen:
        raise OptionError("profiles", "is empty: give default, default:NAME or a file")
    session, o = _bundle_session(d, server, _beside(d, out), "diagnose", w, say)
    rows: list[dict[str, Any]] = []
    try:
        for p in chosen:
            cmd, change = apply(p, server.launch)
            row: dict[str, Any] = {"name": p.name, "note": p.note}
            if cmd is None:
                rows.append({**row, "change": "", "skipped": change})
                say(f"diagnose {p.name}: skipped: {change}")
                continue
            row.update(change=change, launch=redact_command(cmd))
            log_path = o / p.name / "server.log"
            slot = session.variant(cmd, log_path)
            try:
                res = await session.trial(o / p.name / "001", slot=slot)
            finally:
                await slot.stop()
            log = log_path.read_text(errors="replace") if log_path.exists() else ""
            fault = find_fault(log)
            row.update(
                outcome=res.outcome.value,
                failure_class=res.failure_class,
                signature=res.signature.hash if res.signature else None,
                message=(res.message or "")[:300] or None,
                fault=fault,
            )
            rows.append(row)
            named = f": {fault['kernel']}" if fault else ": no kernel named"
            say(f"diagnose {p.name}: {res.outcome.value}{named}")
    finally:
        await session.aclose()
    text = reading(rows)
    diagnosis = {"profiles": rows, "reading": text, "out": _relative(o, d)}
    data = dict(read_manifest(d).data)
    data["diagnosis"] = diagnosis
    refresh(d, data)
    return DiagnoseResult(tuple(rows), text, o)


def _beside(bundle: Path, out: str | os.PathLike[str] | None) -> str | os.PathLike[str]:
    """``out``, or ``BUNDLE-diagnose-<timestamp>`` next to the bundle."""
    if out is not None:
        return out
    full = bundle.resolve()
    return _stamped(full.parent, f"{full.name}-diagnose")


def _relative(path: Path, bundle: Path) -> str:
    """``path`` as the bundle's README names it: from the bundle."""
    return os.path.relpath(path, bundle)


def diagnose_bundle_sync(*args: Any, **kwargs: Any) -> DiagnoseResult:
    """:func:`diagnose_bundle` for code without an event loop (same arguments)."""
    return asyncio.run(diagnose_bundle(*args, **kwargs))
