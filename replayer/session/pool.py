"""N interchangeable servers of one configuration, each a :class:`Slot`.

A bisect on one server pays a restart (a model load: 10-20 minutes on the
hardware this is for) after every crash, one trial after another. A lab that
has the crash has many such servers; a :class:`Pool` lends them out, one
trial each, and restarts a server that crashed in the background while the
others go on, so the next trial finds a server ready.

A server that cannot start (a launch that exits, a Slurm job that stays
pending with its reason) is retired after :data:`MAX_FAILURES` launches in a
row, with that reason; the pool goes on with the rest and fails only when
none is left. :meth:`Pool.states` says what each server is doing, for the
progress line and the service's job page.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from replayer._async import Signal, spawn
from replayer._files import write_atomic
from replayer._http import free_port
from replayer.errors import LaunchError, OutputError, TargetError
from replayer.options.pool import PoolSpec
from replayer.session.slot import Slot

MAX_FAILURES = 2
"""Launches in a row that may fail before a server is retired."""


class SlotState(StrEnum):
    IDLE = "idle"
    """Not started yet (servers start on first use)."""
    STARTING = "starting"
    READY = "ready"
    RUNNING = "running"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass
class Member:
    """One server of a pool and what it is doing."""

    slot: Slot
    index: int
    state: SlotState = SlotState.IDLE
    trial: int | None = None
    """The trial it runs (while ``running``)."""
    reason: str | None = None
    """Why it failed, or why it last failed to start."""
    failures: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.index,
            "url": self.slot.url,
            "state": self.state.value,
            "trial": self.trial,
            "reason": self.reason,
        }


class PoolExhausted(LaunchError):
    """No server of the pool could start: each one's reason is in the message."""


class Pool:
    """Lends its servers out one trial at a time (see the module doc)."""

    def __init__(
        self,
        slots: Sequence[Slot],
        *,
        name: str = "target",
        spec: PoolSpec | None = None,
        owner: Path | None = None,
        state_file: Path | None = None,
    ) -> None:
        if not slots:
            raise TargetError("a pool needs at least one server")
        self.name = name
        self.spec = spec
        """What the servers were built from, every port chosen (a variant of
        server i launches from it in server i's place)."""
        self.owner = owner
        """The run directory that marks its servers (and names its Slurm jobs)."""
        self.state_file = state_file
        """Where :meth:`states` is kept current (``servers.json``): what the
        service's job page and a person with ``cat`` read."""
        self.members = [Member(s, i) for i, s in enumerate(slots)]
        self._free = Signal()

    def __len__(self) -> int:
        return len(self.members)

    @property
    def slots(self) -> list[Slot]:
        return [m.slot for m in self.members]

    @property
    def usable(self) -> int:
        """Servers not retired."""
        return sum(m.state is not SlotState.FAILED for m in self.members)

    def states(self) -> list[dict[str, Any]]:
        return [m.to_dict() for m in self.members]

    def _pick(self) -> Member | None:
        """A ready server first, then one never started, then none."""
        for want in (SlotState.READY, SlotState.IDLE, SlotState.STOPPED):
            for m in self.members:
                if m.state is want:
                    return m
        return None

    @contextlib.asynccontextmanager
    async def lease(self, trial: int | None = None) -> AsyncIterator[Slot]:
        """A free server for one trial; after it, a server that crashed (or
        whose trial was cancelled) is made fresh again in the background."""
        member = await self._take(trial)
        ok = False
        try:
            yield member.slot
            ok = True
        finally:
            self._give(member, ok)

    async def _take(self, trial: int | None) -> Member:
        while True:
            if not self.usable:
                raise PoolExhausted(
                    f"no server of the {self.name} pool could start: "
                    + "; ".join(f"server {m.index}: {m.reason}" for m in self.members)
                )
            m = self._pick()
            if m is not None:
                m.state, m.trial = SlotState.RUNNING, trial
                self._save()
                return m
            await self._free.wait()

    def _give(self, m: Member, finished: bool) -> None:
        """Sync: it runs in ``finally`` blocks of cancelled trials."""
        m.trial = None
        slot = m.slot
        if not finished:
            slot.fresh = False  # a cancelled trial left requests in it: reset before reuse
        if slot.needs_restart or not slot.fresh:
            m.state = SlotState.RESTARTING if slot.started else SlotState.STARTING
            m.task = spawn(self._refresh(m), name=f"pool-{self.name}-{m.index}-refresh")
            self._save()
            return
        self._ready(m)

    async def _refresh(self, m: Member) -> None:
        """Make ``m`` fresh (restart after a crash, reset after a pass)."""
        try:
            await m.slot.prepare()
        except (LaunchError, TargetError) as exc:
            m.failures += 1
            m.reason = str(exc).splitlines()[0][:300]
            if m.failures >= MAX_FAILURES:
                m.state = SlotState.FAILED
            else:
                m.state = SlotState.STOPPED  # tried again when next taken
            self._save()
            self._free.fire()
            return
        m.failures = 0
        self._ready(m)

    def _ready(self, m: Member) -> None:
        m.state = SlotState.READY
        self._save()
        self._free.fire()

    def _save(self) -> None:
        """Best effort: a full disk must not stop a trial over a status file."""
        if self.state_file is None:
            return
        import json

        with contextlib.suppress(OSError, OutputError):
            data = json.dumps({"pool": self.name, "servers": self.states()}) + "\n"
            write_atomic(self.state_file, data.encode())

    def note_failure(self, slot: Slot, reason: str) -> None:
        """A trial found ``slot`` would not start (INFRA): count it toward
        retiring the server."""
        for m in self.members:
            if m.slot is slot:
                m.failures += 1
                m.reason = reason.splitlines()[0][:300] if reason else m.reason
                if m.failures >= MAX_FAILURES:
                    m.state = SlotState.FAILED
                    self._save()
                    self._free.fire()  # waiters may now find the pool exhausted
                return

    def note_started(self, slot: Slot) -> None:
        for m in self.members:
            if m.slot is slot:
                m.failures = 0

    async def aclose(self) -> None:
        """Stop every server (background restarts included)."""
        tasks = [m.task for m in self.members if m.task is not None and not m.task.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(m.slot.stop() for m in self.members), return_exceptions=True)
        for m in self.members:
            if m.state is not SlotState.FAILED:
                m.state = SlotState.STOPPED
        self._save()


def build_slots(
    spec: PoolSpec,
    *,
    logs: Path | None,
    model: str | None,
    owner: Path | None,
    name: str = "target",
) -> tuple[PoolSpec, list[Slot]]:
    """One slot per member of ``spec``: a local launch on its own port, a
    Slurm job, or a server someone else runs; logs at ``logs/NAME-server-I.log``.
    Also ``spec`` with every port chosen, so a variant of server i (``--vary``)
    can be launched in its place, on its port and GPUs."""
    members = tuple(m if m.port is not None else replace(m, port=free_port()) for m in spec.members)
    spec = replace(spec, members=members)
    slots = [
        build_slot(spec, i, logs=logs, model=model, owner=owner, name=name)
        for i in range(len(members))
    ]
    return spec, slots


def build_slot(
    spec: PoolSpec,
    index: int,
    *,
    logs: Path | None,
    model: str | None,
    owner: Path | None,
    name: str = "target",
    launch: str | None = None,
    log: Path | None = None,
) -> Slot:
    """The slot of server ``index`` of ``spec`` (its port chosen);
    ``launch`` replaces the pool's launch template (a variant)."""
    from replayer.options.pool import fill
    from replayer.session.slot import OWNER_ENV, owner_token

    m = spec.members[index]
    marks = {OWNER_ENV: owner_token(owner)} if owner is not None else None
    if log is None and logs is not None:
        log = logs / f"{name}-server-{m.slot}.log"
    fields = {"port": m.port, "slot": m.slot, "gpus": m.gpus}
    template = launch if launch is not None else spec.launch_template or m.server.launch
    launch = fill(template, **fields) if template else None
    url = fill(spec.url_template, **fields) if spec.url_template else m.server.url
    if spec.slurm is not None and launch is not None:
        from replayer.target.slurm import SlurmJob, SlurmTarget, job_name, owner_hash

        s = spec.slurm
        assert log is not None, "a Slurm job needs a log file for its output"
        target = SlurmTarget(
            launch,
            fill(url or s.url, **fields),
            log,
            SlurmJob(s.partition, s.gres, s.time, s.extra, s.pending_timeout),
            name=job_name(owner_hash(owner_token(owner) if owner else str(log)), m.slot),
            env=m.server.env,
            model=model,
            api_key=m.server.api_key,
            ready_timeout=m.server.ready_timeout,
        )
        return Slot(target, m.server.reset, name, m.server.api_key)
    server = replace(m.server, launch=launch, url=url)
    # noted so a resumed bisect can stop what a killed one left running
    pidfile = owner / f"{name}-server-{m.slot}.pid" if owner is not None else None
    return Slot.of(server, log_path=log, model=model, name=name, marks=marks, pidfile=pidfile)
