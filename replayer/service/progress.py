"""A job's progress and result, read from the files its command writes.

The worker runs the real command, which already leaves everything needed on
disk: a bisect appends one fsynced line per trial to ``journal.jsonl`` and
rewrites ``bundle/manifest.json`` after every improvement; a replay prints a
progress line per target every few seconds and writes ``summary.json`` at
the end; a verify prints one line per run. Reading those files keeps the
worker a plain ``replayer`` command and the progress true after a restart
of ``serve``.

Status polls must stay cheap (hundreds per second while a job runs): the
journal is read incrementally (only the bytes appended since the last
poll), the manifest and a pool's ``servers.json`` only when their mtime
changes, and logs only as a tail.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from replayer._runfile import RunFileError
from replayer.bisect.files import check_event
from replayer.bundle.files import MANIFEST
from replayer.replay.files import read_summary

TAIL_BYTES = 16 << 10
_REPLAY_LINE = re.compile(
    r"^replay: (?:FAILED )?(?P<target>\S+): sent (?P<sent>[\d,]+)/(?P<total>[\d,]+)\s+"
    r"in flight (?P<inflight>\d+)\s+errors (?P<errors>\d+)"
)
_VERIFY_LINE = re.compile(r"^run (?P<i>\d+)/(?P<n>\d+): (?P<outcome>[A-Z_]+)")


def tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path`` as text ("" if absent)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@dataclass
class _Journal:
    offset: int = 0
    partial: bytes = b""
    trials: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    last: dict[str, Any] | None = None
    verdicts: int = 0
    ino: int | None = None
    error: str | None = None
    """The journal is one this replayer cannot read (a newer format)."""


class ProgressReader:
    """Per-job incremental readers (one instance for the whole service)."""

    def __init__(self) -> None:
        self._journals: dict[Path, _Journal] = {}
        self._manifests: dict[Path, tuple[float, dict[str, Any] | None]] = {}
        self._servers: dict[Path, tuple[tuple[int, int, int], list[dict[str, Any]] | None]] = {}
        self._logs: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}

    def journal(self, path: Path) -> _Journal:
        j = self._journals.setdefault(path, _Journal())
        try:
            st = path.stat()
        except OSError:
            return j
        if j.ino is not None and (st.st_ino != j.ino or st.st_size < j.offset):
            j = self._journals[path] = _Journal()  # replaced: start over
        j.ino = st.st_ino
        if st.st_size == j.offset:
            return j
        with path.open("rb") as f:
            f.seek(j.offset)
            data = j.partial + f.read(st.st_size - j.offset)
        j.offset = st.st_size
        *lines, j.partial = data.split(b"\n")
        for line in lines:
            try:
                e = orjson.loads(line)
                check_event(e, path)
            except orjson.JSONDecodeError:
                continue
            except RunFileError as exc:
                j.error = str(exc)
                continue
            if e.get("event") == "trial":
                rec = e.get("record", {})
                j.trials = max(j.trials, int(rec.get("trial", 0)))
                o = str(rec.get("outcome"))
                j.outcomes[o] = j.outcomes.get(o, 0) + 1
                j.last = {
                    "trial": rec.get("trial"),
                    "stage": rec.get("stage"),
                    "size": rec.get("size"),
                    "outcome": o,
                    "failure_class": rec.get("failure_class"),
                }
            elif e.get("event") == "verdict":
                j.verdicts += 1
        return j

    def manifest(self, path: Path) -> dict[str, Any] | None:
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        cached = self._manifests.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        data: dict[str, Any] | None = None
        with contextlib.suppress(RunFileError):
            data = MANIFEST.load(path.parent)
        self._manifests[path] = (mtime, data)
        return data

    def servers(self, out: Path, slots: Sequence[int] = ()) -> list[dict[str, Any]] | None:
        """What each server of a pool bisect is doing (``servers.json``, which
        the pool keeps current), or None without one. ``server`` is the
        number its journal's trials carry; ``slot`` the pool's number for it
        (``slots``: the servers the job holds, in the pool's order)."""
        path = out / "servers.json"
        try:
            st = path.stat()
        except OSError:
            return None
        # rewritten by a rename each time: a new inode, maybe within one mtime tick
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._servers.get(path)
        if cached is None or cached[0] != key:
            rows: list[dict[str, Any]] | None = None
            bad = (OSError, orjson.JSONDecodeError, AttributeError, TypeError, KeyError)
            with contextlib.suppress(*bad):
                rows = [
                    {k: s.get(k) for k in ("server", "state", "trial", "reason")}
                    for s in orjson.loads(path.read_bytes())["servers"]
                    if isinstance(s, dict)
                ]
            cached = self._servers[path] = (key, rows)
        if cached[1] is None:
            return None
        return [
            {**s, "slot": slots[i] if i < len(slots) else None} for i, s in enumerate(cached[1])
        ]

    def progress(
        self, kind: str, out: Path, log_path: Path, *, slots: Sequence[int] = ()
    ) -> dict[str, Any]:
        """What a running (or finished) job has done so far."""
        if kind == "bisect":
            j = self.journal(out / "journal.jsonl")
            m = self.manifest(out / "bundle" / "manifest.json")
            got = {
                "trials": j.trials,
                "outcomes": dict(j.outcomes),
                "verdicts": j.verdicts,
                "last_trial": j.last,
                "best_requests": len(m.get("requests") or []) if m else None,
                "bundle_status": m.get("status") if m else None,
            }
            servers = self.servers(out, slots)
            if servers is not None:
                got["servers"] = servers
            return got
        try:
            st = os.stat(log_path)
            key = (st.st_size, st.st_mtime_ns)
        except OSError:
            key = (-1, 0)
        cached = self._logs.get(log_path)
        if cached is not None and cached[0] == key:
            return cached[1]
        result = self._from_log(kind, tail(log_path))
        self._logs[log_path] = (key, result)
        return result

    def _from_log(self, kind: str, text: str) -> dict[str, Any]:
        if kind == "replay":
            targets: dict[str, Any] = {}
            for line in text.splitlines():
                match = _REPLAY_LINE.match(line)
                if match:
                    targets[match["target"]] = {
                        "sent": int(match["sent"].replace(",", "")),
                        "total": int(match["total"].replace(",", "")),
                        "in_flight": int(match["inflight"]),
                        "errors": int(match["errors"]),
                        "failed": line.startswith("replay: FAILED "),
                    }
            return {"targets": targets}
        runs = [m for m in map(_VERIFY_LINE.match, text.splitlines()) if m]
        return {
            "runs_done": int(runs[-1]["i"]) if runs else 0,
            "runs": int(runs[-1]["n"]) if runs else None,
            "outcomes": [m["outcome"] for m in runs],
        }

    def forget(self, out: Path) -> None:
        self._journals.pop(out / "journal.jsonl", None)
        self._manifests.pop(out / "bundle" / "manifest.json", None)
        self._servers.pop(out / "servers.json", None)


OUTCOMES = {
    "replay": {0: "clean", 1: "target_failed"},
    "bisect": {0: "complete", 1: "not_reproducible", 3: "budget_exhausted", 5: "below_floor"},
    "verify": {0: "reproduced", 1: "not_reproduced", 5: "below_floor"},
}


def last_error_line(log_path: Path) -> str | None:
    """The command's one-line error (``replayer X: error: ...``), if it printed one."""
    for line in reversed(tail(log_path).splitlines()):
        if line.startswith("== serve"):
            continue
        if ": error: " in line or line.startswith("replayer "):
            return line.strip()[:500]
    return None


def result_of(kind: str, out: Path, log_path: Path) -> dict[str, Any] | None:
    """The compact result shown with a finished job."""
    if kind == "bisect":
        try:
            m = MANIFEST.load(out / "bundle")
        except RunFileError:
            return None
        sig = m.get("signature") or {}
        return {
            "status": m.get("status"),
            "requests": m.get("requests"),
            "signature": {k: sig.get(k) for k in ("hash", "class", "text")} if sig else None,
            "reproduction": (m.get("reproduction") or {}).get("text"),
            "control": m.get("control"),
            "trials": m.get("trials"),
            "bundle": "out/bundle.tar.gz",
        }
    if kind == "replay":
        try:
            s = read_summary(out)
        except RunFileError:
            return None
        if s is None:
            return None
        targets = {}
        for name, t in (s.get("targets") or {}).items():
            f = t.get("failure") or {}
            targets[name] = {
                "failed": t.get("failed"),
                "sent": t.get("sent"),
                "requests": t.get("requests"),
                "status": t.get("status"),
                "failure_class": f.get("class"),
                "failed_request": f.get("request_id"),
                "signature": (f.get("signature") or {}).get("hash"),
            }
        return {"targets": targets, "unreachable": s.get("unreachable")}
    for line in reversed(tail(log_path).splitlines()):
        if line.startswith("bundle "):
            return {"text": line.strip()}
    return None
