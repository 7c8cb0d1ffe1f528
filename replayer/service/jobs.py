"""Jobs on disk: one folder per job, one atomic state file.

``DIR/jobs/<id>/`` holds:

* ``state.json``: the job (what it runs, its state, timestamps, exit code,
  outcome). Every change is written to a temporary file, fsynced, renamed
  over the old one and the folder fsynced, so a crash of ``serve`` at any
  instant leaves the previous or the next state, never a torn one. It holds
  the argv (launch commands included), so it is never served over the API.
* ``job.log``: the worker's stdout and stderr, and ``serve``'s notes
  (``== serve: ...``) about starts, resumes and cancels.
* ``out/``: what the command writes (the run directory of a replay, the
  bisect directory with its journal and bundle, the verify runs). Only
  this folder is downloadable.

States::

    queued -> running -> finished | failed | cancelled
                   \\-> (serve restarts, or its worker is killed) bisect: queued again, resumes
                        from its journal
                   \\-> (its worker is killed) replay, verify: failed (partial results kept)
                   \\-> (serve restarts) replay, verify: interrupted (partial results kept)
    queued -> cancelled;  running -> cancelling -> cancelled

``finished`` means the command ran to its end: its ``outcome`` says what
it found (a bisect ``complete``, ``not_reproducible``, ``budget_exhausted``
or ``below_floor``; a replay ``clean`` or ``target_failed``; a verify
``reproduced``, ``not_reproduced`` or ``below_floor``). ``failed`` means it could not do its
work (bad input, unreachable target, a crash of the worker).
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("replayer.service")


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


TERMINAL = frozenset({JobState.FINISHED, JobState.FAILED, JobState.CANCELLED, JobState.INTERRUPTED})


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path``: tmp + fsync + rename + fsync of the folder."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def new_job_id(now: float | None = None) -> str:
    """Sortable by submission time, unguessable enough to not collide."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now or time.time()))
    return f"{stamp}-{secrets.token_hex(3)}"


@dataclass
class Job:
    """One job, as ``state.json`` holds it."""

    id: str
    kind: str
    argv: list[str]
    """The equivalent ``replayer`` command line (after the program name):
    what a person would type; a job queued before specs existed runs it."""
    targets: list[str]
    inputs: dict[str, str]
    options: dict[str, Any]
    label: str | None = None
    state: JobState = JobState.QUEUED
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    outcome: str | None = None
    message: str | None = None
    attempts: int = 0
    """How many times a worker was started (a resumed bisect has more than one)."""
    worker_pid: int | None = None
    cancel_requested: bool = False
    result: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    """Transitions: ``{"at": time, "state": ..., "note": ...}``."""
    spec: dict[str, Any] | None = None
    """What the worker runs (:class:`~replayer.service.specs.JobPlan.spec`)."""
    pool: str | None = None
    """The pool (``targets.toml``) a bisect runs on, instead of a target."""
    max_servers: int | None = None
    """The most servers of ``pool`` it may hold (None: as many as its share)."""
    slots: list[int] = field(default_factory=list)
    """The servers of ``pool`` given to its current (or last) worker: held
    while the job runs, cleared when it goes back to the queue."""
    worker_deaths: int = 0
    """Workers of this bisect killed by a signal in a row, none of which
    finished a trial: it goes back to the queue until this reaches
    :data:`replayer.service.scheduler.MAX_WORKER_DEATHS`."""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Job:
        d = dict(d)
        d["state"] = JobState(d["state"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def public(self) -> dict[str, Any]:
        """What the API shows (no argv: it holds the operator's commands)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "label": self.label,
            "state": self.state.value,
            "targets": self.targets,
            "inputs": self.inputs,
            "options": self.options,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "exit_code": self.exit_code,
            "outcome": self.outcome,
            "message": self.message,
            "attempts": self.attempts,
            "result": self.result,
            "pool": self.pool,
            "max_servers": self.max_servers,
            "slots": self.slots,
        }


class JobStore:
    """Every job under ``DIR/jobs``, loaded at start and kept in memory; each
    change goes to disk before it is visible.

    **Usage**::

        store = JobStore(Path("/data/jobs"))
        job = store.create(kind="bisect", argv=[...], targets=["mi355"], inputs={}, options={})
        store.update(job, state=JobState.RUNNING)
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.jobs: dict[str, Job] = {}
        self._path_cache: dict[str, tuple[Path, Path, Path]] = {}
        self._load()

    def _load(self) -> None:
        for d in sorted(self.root.iterdir()):
            state = d / "state.json"
            if not d.is_dir() or d.is_symlink() or not state.is_file():
                continue
            for tmp in d.glob(".state.json.*.tmp"):
                tmp.unlink(missing_ok=True)
            try:
                job = Job.from_json(orjson.loads(state.read_bytes()))
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning("ignoring %s: unreadable state (%s)", d, exc)
                continue
            if job.id != d.name:
                log.warning("ignoring %s: its state names job %s", d, job.id)
                continue
            self.jobs[job.id] = job

    def _paths(self, job: Job | str) -> tuple[Path, Path, Path]:
        # status polls ask for these hundreds of times a second: build them once
        job_id = job if isinstance(job, str) else job.id
        got = self._path_cache.get(job_id)
        if got is None:
            d = self.root / job_id
            got = self._path_cache[job_id] = (d, d / "out", d / "job.log")
        return got

    def dir(self, job: Job | str) -> Path:
        return self._paths(job)[0]

    def out(self, job: Job | str) -> Path:
        return self._paths(job)[1]

    def log_path(self, job: Job | str) -> Path:
        return self._paths(job)[2]

    def create(
        self,
        *,
        job_id: str,
        kind: str,
        argv: list[str],
        targets: list[str],
        inputs: dict[str, str],
        options: dict[str, Any],
        label: str | None = None,
        spec: dict[str, Any] | None = None,
        pool: str | None = None,
        max_servers: int | None = None,
    ) -> Job:
        job = Job(
            job_id,
            kind,
            argv,
            targets,
            inputs,
            options,
            label,
            spec=spec,
            pool=pool,
            max_servers=max_servers,
        )
        job.events.append({"at": job.created_at, "state": job.state.value, "note": "submitted"})
        d = self.dir(job)
        d.mkdir(mode=0o750)
        write_json_atomic(d / "state.json", job.to_json())
        self.jobs[job.id] = job
        return job

    def update(self, job: Job, *, note: str | None = None, **changes: Any) -> None:
        """Apply ``changes`` and persist; a state change is also an event."""
        before = job.state
        for k, v in changes.items():
            setattr(job, k, v)
        if job.state != before or note:
            job.events.append({"at": time.time(), "state": job.state.value, "note": note})
            job.events = job.events[-200:]
        write_json_atomic(self.dir(job) / "state.json", job.to_json())

    def note(self, job: Job, text: str) -> None:
        """A line from ``serve`` in the job's log."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self.log_path(job).open("a") as f:
            f.write(f"== serve {stamp}: {text}\n")

    def by_state(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for j in self.jobs.values():
            key = (j.kind, j.state.value)
            out[key] = out.get(key, 0) + 1
        return out

    def listing(self) -> list[Job]:
        """Newest first."""
        return sorted(self.jobs.values(), key=lambda j: (j.created_at, j.id), reverse=True)
