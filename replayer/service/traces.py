"""Traces the service knows: uploaded into ``DIR/traces/``, or registered
where they already are inside ``DIR``.

An upload is streamed to a temporary file beside its destination (never
held in memory), counted against the size limit as it arrives (a body past
the limit is cut off with 413 and its bytes deleted), then validated with
:meth:`Trace.open` (in a thread) and linked into place only if it is a
readable trace; an existing name is never overwritten. Registering a path
(an operator rsync'ed a 3 GB production trace into ``DIR/incoming/``)
validates it the same way and records it in ``DIR/traces/.registry.json``
(atomically). Either way, jobs name traces by their path relative to
``DIR``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from replayer.errors import ReplayerError
from replayer.service.jobs import write_json_atomic


class UploadTooLarge(Exception):
    """The body is larger than ``--max-upload-bytes`` (a 413)."""


class TraceRejected(ValueError):
    """Not a readable trace (a 400); the message is the reader's one line."""


@dataclass(frozen=True, slots=True)
class TraceInfo:
    path: str
    """Relative to DIR."""
    bytes: int
    requests: int
    sessions: int
    sha256: str | None
    added_at: float
    how: str
    """``uploaded`` or ``registered``."""

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bytes": self.bytes,
            "requests": self.requests,
            "sessions": self.sessions,
            "sha256": self.sha256,
            "added_at": self.added_at,
            "how": self.how,
        }


def _validate(path: Path) -> tuple[int, int]:
    from replayer.trace.reader import Trace

    try:
        t = Trace.open(path)
        t.verify(bodies=False)  # every batch decodes and matches its digests
    except ReplayerError as exc:
        raise TraceRejected(str(exc).replace(str(path), path.name)) from None
    except Exception as exc:  # a reader bug must not look like a server crash
        raise TraceRejected(f"{path.name}: unreadable: {exc.__class__.__name__}") from None
    return len(t), len(set(t.column("session_id")))


class TraceStore:
    """``DIR/traces`` and the registry (see the module docstring)."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.dir = data / "traces"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.registry_path = self.dir / ".registry.json"
        self.registry: dict[str, dict[str, Any]] = {}
        if self.registry_path.exists():
            try:
                self.registry = orjson.loads(self.registry_path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                self.registry = {}
        for tmp in self.dir.glob(".upload-*"):
            tmp.unlink(missing_ok=True)  # an upload a dead serve never finished

    def _record(self, info: TraceInfo) -> None:
        self.registry[info.path] = info.to_json()
        write_json_atomic(self.registry_path, self.registry)

    async def upload(self, name: str, chunks: AsyncIterator[bytes], limit: int) -> TraceInfo:
        """Stream ``chunks`` into ``traces/name`` (see the module docstring)."""
        final = self.dir / name
        if final.exists() or final.is_symlink():
            raise FileExistsError(f"traces/{name} exists; traces are never overwritten")
        tmp = self.dir / f".upload-{secrets.token_hex(8)}"
        h = hashlib.sha256()
        size = 0
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        try:
            with os.fdopen(fd, "wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise UploadTooLarge(f"the upload exceeds the limit of {limit:,} bytes")
                    h.update(chunk)
                    f.write(chunk)
                f.flush()
                await asyncio.to_thread(os.fsync, f.fileno())
            requests, sessions = await asyncio.to_thread(_validate, tmp)
            try:
                os.link(tmp, final)  # never clobbers: fails if the name appeared meanwhile
            except FileExistsError:
                raise FileExistsError(
                    f"traces/{name} exists; traces are never overwritten"
                ) from None
        finally:
            tmp.unlink(missing_ok=True)
        info = TraceInfo(
            f"traces/{name}", size, requests, sessions, h.hexdigest(), time.time(), "uploaded"
        )
        self._record(info)
        return info

    async def register(self, real: Path) -> TraceInfo:
        """Validate a trace already inside DIR and remember it."""
        info = await asyncio.to_thread(self._inspect, real)
        self._record(info)
        return info

    def _inspect(self, real: Path) -> TraceInfo:
        rel = str(real.relative_to(self.data))
        if not real.is_file():
            raise TraceRejected(f"{rel}: not a regular file")
        requests, sessions = _validate(real)
        return TraceInfo(
            rel, real.stat().st_size, requests, sessions, None, time.time(), "registered"
        )

    def listing(self) -> list[dict[str, Any]]:
        """Registered and uploaded traces that still exist, by path."""
        return [v for k, v in sorted(self.registry.items()) if (self.data / k).is_file()]
