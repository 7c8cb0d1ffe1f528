"""A server run as a Slurm job: one ``sbatch`` per server, on a GPU node a
scheduler hands out.

Labs reach their MI355X and B300 nodes through a scheduler, most often
Slurm. A :class:`SlurmTarget` submits the server's command as a batch job
(``sbatch --wrap``, with the partition, ``--gres=gpu:N``, time limit and
extra arguments of its pool), waits until the job runs, takes its URL from
the node it landed on (``url`` is a template: ``http://{node}:{port}``),
reads its log from the job's output file, and stops it with ``scancel``.
Readiness is the HTTP probe every target shares.

A job that does not start within ``pending_timeout`` (no free node, a drained
one, an unsatisfiable request) is cancelled and reported with Slurm's own
reason (``Resources``, ``ReqNodeNotAvail``, ...): the pool goes on without
it. Every job is named ``replayer-<owner>-<slot>``, so what a killed bisect
left queued can be found and cancelled by name (:func:`cancel_owned`).

Every scheduler call is bounded in time (a drained node makes ``srun`` wait
forever, silently; ``squeue`` on an overloaded controller can stall too).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from replayer._async import spawn
from replayer._clock import REAL, Clock
from replayer.errors import LaunchError, TargetError
from replayer.monitor.logs import launch_marker
from replayer.target.base import DEFAULT_READY_TIMEOUT, ExitInfo, ServerTarget, log
from replayer.target.facts import redact_command

CALL_TIMEOUT = 30.0
"""Seconds any one ``sbatch``/``squeue``/``scancel``/``scontrol`` call may take."""
POLL_S = 1.0
"""How often a running job's state is read (its exit is noticed within this)."""
STOP_WAIT = 60.0
"""Seconds ``scancel`` gets for the job to leave the queue."""
RUNNING = "RUNNING"
_ALIVE_STATES = frozenset({"PENDING", "CONFIGURING", RUNNING, "COMPLETING", "RESIZING"})
_LOST_STATES = frozenset(
    {"CANCELLED", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "TIMEOUT"}
)
"""States in which the scheduler, not the server, ended the job."""


@dataclass(frozen=True)
class SlurmJob:
    """What one job asks of the scheduler (a pool's ``[slurm]`` table)."""

    partition: str | None = None
    gres: str | None = None
    """``gpu:8``: what ``--gres`` asks for."""
    time: str | None = None
    """The job's time limit, Slurm's format (``4:00:00``)."""
    extra: tuple[str, ...] = ()
    """More ``sbatch`` arguments (``--account``, ``--exclusive``, ``--constraint`` ...)."""
    pending_timeout: float = 600.0
    """Seconds a job may wait in the queue before it counts as unstartable."""


class SlurmError(TargetError):
    """A scheduler command failed or did not answer in time."""


async def _call(
    *argv: str, within: float = CALL_TIMEOUT, env: Mapping[str, str] | None = None
) -> str:
    """One scheduler command's stdout; :class:`SlurmError` with its stderr."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
        )
    except OSError as exc:
        raise SlurmError(
            f"cannot run {argv[0]}: {exc.strerror or exc} (is Slurm installed?)"
        ) from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise SlurmError(f"{argv[0]} did not answer within {within:g}s") from None
    if proc.returncode != 0:
        text = err.decode(errors="replace").strip() or out.decode(errors="replace").strip()
        raise SlurmError(f"{shlex.join(argv[:2])}... failed ({proc.returncode}): {text[:300]}")
    return out.decode(errors="replace")


async def _answer(*argv: str, env: Mapping[str, str] | None = None) -> str | SlurmError:
    """:func:`_call` for a background task: its error returned, not raised
    (a refused ``sbatch`` is one line for the user, not a task's traceback)."""
    try:
        return await _call(*argv, env=env)
    except SlurmError as exc:
        return exc


def job_name(owner: str, slot: int) -> str:
    """``replayer-<owner>-<slot>``: the owner is a short hash of who submits
    (a bisect directory), so its jobs are found again after a kill."""
    return f"replayer-{owner}-{slot}"


def owner_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


async def queue_state(job: str) -> tuple[str, str, str] | None:
    """(state, node, reason) of a job still known to ``squeue``, else None."""
    out = await _call("squeue", "-h", "-j", job, "-o", "%T|%N|%r")
    line = out.strip().splitlines()[0] if out.strip() else ""
    if not line:
        return None
    state, node, reason = ([*line.split("|"), "", ""])[:3]
    return state.strip(), node.strip(), reason.strip()


async def job_record(job: str) -> dict[str, str]:
    """``scontrol show job``'s fields (kept a while after the job ended)."""
    try:
        out = await _call("scontrol", "show", "job", job)
    except SlurmError:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", out))


def exit_of(record: Mapping[str, str]) -> ExitInfo | None:
    """``ExitCode=1:0`` -> exit 1; ``0:15`` -> signal 15."""
    m = re.fullmatch(r"(\d+):(\d+)", record.get("ExitCode", ""))
    if m is None:
        return None
    code, sig = int(m.group(1)), int(m.group(2))
    return ExitInfo(None if sig else code, sig or None, time.time())


async def cancel_owned(owner: str) -> list[str]:
    """Cancel every job this owner named (``replayer-<owner>-*``); their ids."""
    out = await _call("squeue", "-h", "-o", "%i %j")
    ids = [i for i, _, name in (line.partition(" ") for line in out.splitlines()) if
           name.startswith(f"replayer-{owner}-")]  # fmt: skip
    if ids:
        await _call("scancel", *ids)
    return ids


class SlurmTarget(ServerTarget):
    """A server run as one Slurm batch job (see the module doc).

    ``command`` is what the job runs (a shell command line: ``sbatch --wrap``
    runs it under ``sh``); ``url`` a template the job's node fills in."""

    def __init__(
        self,
        command: str,
        url: str,
        log_path: Path,
        job: SlurmJob,
        *,
        name: str,
        env: Mapping[str, str] | None = None,
        model: str | None = None,
        api_key: str | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        clock: Clock = REAL,
    ) -> None:
        super().__init__(
            url.replace("{node}", "pending"),
            model=model,
            api_key=api_key,
            log_path=log_path,
            ready_timeout=ready_timeout,
            clock=clock,
        )
        self.command = command
        self.url_template = url
        self.job = job
        self.name = name
        self.env = dict(env or {})
        self.job_id: str | None = None
        self._submitting: asyncio.Task[str | SlurmError] | None = None
        self.node: str | None = None
        self.launches = 0
        self._state: str | None = None
        self._exit: ExitInfo | None = None
        self._exited = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def can_restart(self) -> bool:
        return True

    @property
    def exit_info(self) -> ExitInfo | None:
        return self._exit

    def alive(self) -> bool | None:
        if self.job_id is None:
            return None
        return self._state in _ALIVE_STATES

    @property
    def lost(self) -> str | None:
        """Why the scheduler took the running job away (``scancel``, preemption,
        a node failure, the time limit), or None. A server whose job was
        taken did not crash: its trial is infrastructure, run again."""
        state = (self._state or "").split(" ")[0]
        if self._stopping or state not in _LOST_STATES:
            return None
        return f"slurm job {self.job_id} ({self.name}) {state} by the scheduler"

    def _exit_event(self) -> asyncio.Event:
        return self._exited

    # -- lifecycle -----------------------------------------------------------------------

    def _sbatch_argv(self) -> list[str]:
        assert self.log_path is not None
        argv = ["sbatch", "--parsable", "--job-name", self.name, "--output", str(self.log_path)]
        argv += ["--open-mode=append"]
        if self.job.partition:
            argv += ["--partition", self.job.partition]
        if self.job.gres:
            argv += [f"--gres={self.job.gres}"]
        if self.job.time:
            argv += ["--time", self.job.time]
        argv += [*self.job.extra, "--wrap", f"exec {self.command}"]
        return argv

    async def start(self) -> None:
        if self.alive():
            raise TargetError(f"slurm job {self.job_id} ({self.name}) is already running")
        self.launches += 1
        self._begin_segment(launch_marker(self.launches, redact_command(self.command)))
        self._exit = None
        self._exited = asyncio.Event()
        self._stopping = False
        env = {**os.environ, **self.env}
        out = await self._submit(env)
        self.job_id = out.strip().split(";")[0]
        self._state = "PENDING"
        log.info("submitted %s as slurm job %s", self.name, self.job_id)
        try:
            await self._wait_running()
        except asyncio.CancelledError:
            # a trial cancelled while its server waited in the queue: a job
            # left there would start later for nobody and hold the next start off
            self._stopping = True
            with contextlib.suppress(SlurmError):
                await self._cancel()
            self._state = "CANCELLED"
            self._exited.set()
            raise
        self.url = fill(self.url_template, node=self.node).rstrip("/")
        self._watcher = spawn(self._watch(self.job_id), name=f"slurm-job-{self.job_id}")

    async def _submit(self, env: Mapping[str, str]) -> str:
        """``sbatch``'s answer. Cancelled meanwhile (a stopped bisect), the job
        it queued anyway is cancelled once its id is known: none is left behind."""
        submit = spawn(_answer(*self._sbatch_argv(), env=env), name=f"sbatch-{self.name}")
        self._submitting = submit  # stop() learns its id even if this is cancelled twice
        try:
            out = await asyncio.shield(submit)
        except asyncio.CancelledError:
            with contextlib.suppress(SlurmError):
                job = await submit  # bounded: CALL_TIMEOUT
                if isinstance(job, str):
                    await _call("scancel", job.strip().split(";")[0])
            raise
        if isinstance(out, SlurmError):
            raise out
        self._submitting = None
        return out

    async def _wait_running(self) -> None:
        """Until the job runs on a node; cancelled and reported with Slurm's
        reason when it stays pending past ``pending_timeout`` or ends first."""
        assert self.job_id is not None
        clock = self.clock
        deadline = clock.now() + self.job.pending_timeout
        reason = ""
        for _ in range(int(self.job.pending_timeout / POLL_S) + 2):
            got = await queue_state(self.job_id)
            if got is None:
                rec = await job_record(self.job_id)
                self._state = rec.get("JobState", "GONE")
                self._exit = exit_of(rec)
                self._exited.set()
                raise LaunchError(
                    f"slurm job {self.job_id} ({self.name}) ended before it ran: "
                    f"{self._state} {rec.get('Reason', '')}".strip()
                )
            self._state, node, reason = got
            if self._state == RUNNING and node:
                self.node = node
                return
            if clock.now() >= deadline:
                break
            await clock.sleep(POLL_S)
        why = (
            f"slurm job {self.job_id} ({self.name}) still {self._state} after "
            f"{self.job.pending_timeout:g}s: {reason or 'no reason given'}"
        )
        self._stopping = True  # our own scancel: the job never ran
        await self._cancel()
        self._state = "CANCELLED"  # else alive() holds the next start() off
        self._exited.set()
        raise LaunchError(why)

    async def _watch(self, job: str) -> None:
        """The job's state, every ``POLL_S``, until it leaves the queue."""
        while job == self.job_id:
            try:
                got = await queue_state(job)
            except SlurmError as exc:
                log.warning("slurm job %s: %s", job, exc)
                got = ("UNKNOWN", self.node or "", "")
            if got is None or got[0] not in _ALIVE_STATES:
                rec = await job_record(job)
                if job == self.job_id:
                    self._state = rec.get("JobState", "GONE")
                    self._exit = exit_of(rec)
                    self._exited.set()
                return
            self._state = got[0]
            await self.clock.sleep(POLL_S)

    async def _cancel(self) -> None:
        if self.job_id is None:
            return
        with contextlib.suppress(SlurmError):
            await _call("scancel", self.job_id)
        for _ in range(int(STOP_WAIT / POLL_S) + 1):
            got = await queue_state(self.job_id)
            if got is None or got[0] not in _ALIVE_STATES:
                break
            await self.clock.sleep(POLL_S)

    async def stop(self) -> ExitInfo | None:
        """``scancel``, then wait (bounded) until the job left the queue."""
        submitting, self._submitting = self._submitting, None
        if submitting is not None and self.job_id is None:
            # a start cancelled while sbatch ran: its job is queued all the same
            with contextlib.suppress(Exception):
                out = await asyncio.shield(submitting)
                if isinstance(out, str):
                    self.job_id = out.strip().split(";")[0] or None
        if self.job_id is None:
            return self._exit
        self._stopping = True  # our own scancel: not a job the scheduler took
        await self._cancel()
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        rec = await job_record(self.job_id)
        self._state = rec.get("JobState", "GONE")
        self._exit = self._exit or exit_of(rec)
        self._exited.set()
        return self._exit

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    def _check_loading(self) -> None:
        if self.job_id is None:
            raise TargetError("the target was not started")
        if self.alive() is False:
            raise LaunchError(
                f"slurm job {self.job_id} ({self.name}) ended ({self._state}"
                + (f", {self._exit.text}" if self._exit else "")
                + f") before it was ready; log: {self.log_path}"
            )

    def _command_facts(self) -> dict[str, object]:
        return {
            "kind": "slurm",
            "launch": redact_command(self.command),
            "job": self.job_id,
            "node": self.node,
            "partition": self.job.partition,
            "gres": self.job.gres,
            "launches": self.launches,
            "exit": None if self._exit is None else self._exit.text,
        }


def fill(template: str | Sequence[str], **fields: object) -> str:
    """A template with ``{port}``, ``{slot}``, ``{gpus}``, ``{node}`` filled in:
    only those words, so the JSON a launch command carries keeps its braces."""
    text = template if isinstance(template, str) else shlex.join(template)
    for name, value in fields.items():
        text = text.replace("{" + name + "}", str(value))
    return text
