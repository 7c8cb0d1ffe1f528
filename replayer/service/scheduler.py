"""The scheduler: queued jobs start as workers, at most N at once.

A queued job starts when fewer than ``max_concurrent`` jobs run *and* none
of its targets is held by a running job (two jobs driving one GPU server
would ruin both), oldest first; a job waiting for a busy target does not
hold back a later job on a free one. A bisect on a pool
(:mod:`replayer.service.pools`) holds some of the pool's servers instead:
when it starts it gets ``min(max_servers, fair share, free)`` of them, the
lowest free numbers, the fair share being the pool's size over the jobs
that name it (running and queued, at least one server); it waits while
every server is held. The scheduler writes its pool file (the pool's table
and ``slots = [...]``) into the job's folder before the worker starts;
the servers are free again once the worker is gone, however the job ended.
Each running job is one worker
process (:mod:`replayer.cli.worker`) and one task here that waits for
it and records how it ended; a worker's crash is a failed job, never an
exception in the service.

**Restart.** :meth:`Scheduler.recover` runs before the first start: a job
the previous ``serve`` left running has its stale worker (if any) stopped;
a bisect goes back to the queue with ``--resume`` (its journal holds every
finished trial, and ``--resume`` reaps the server the dead worker left; on
a pool it lets go of its servers and gets a share again when it starts); a
replay or verify becomes ``interrupted``, its partial results kept. On a
graceful shutdown the workers are stopped the same way and their jobs stay
``running`` on disk, so the next start resumes them identically. Stale
workers are found by their command line (the job's folder), so a serve
killed between starting a worker and noting its pid leaves none behind.

**A worker killed by a signal** (the OOM killer, an operator's ``kill -9``)
leaves its launched server behind: the scheduler reaps it. A bisect goes
back to the queue and resumes from its journal, unless
:data:`MAX_WORKER_DEATHS` workers in a row died without finishing a trial
(then it fails); a replay or verify fails, its partial results kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from replayer._async import spawn, wait_event
from replayer._http import free_port
from replayer.service.jobs import Job, JobState, JobStore
from replayer.service.pools import POOL_FILE, PoolConfig, allot, write_pool_file
from replayer.service.progress import OUTCOMES, ProgressReader, last_error_line, result_of
from replayer.session import reap_orphan

log = logging.getLogger("replayer.service")

CANCEL_GRACE = 30.0
"""Seconds a worker gets to stop its servers after SIGTERM before SIGKILL."""
EXIT_INTERRUPTED = 130
MAX_WORKER_DEATHS = 3
"""A bisect whose workers are killed this many times in a row, none
finishing a trial, fails instead of going back to the queue."""


@dataclass
class _Running:
    job: Job
    proc: asyncio.subprocess.Process | None = None
    task: asyncio.Task[None] | None = None
    metrics_port: int | None = None
    trials_at_start: int = 0


def _pid_is_worker(pid: int, job_dir: Path) -> bool:
    """Is ``pid`` still the worker of ``job_dir`` (not a reused pid)?"""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # replayer.service.worker: the module's name before 0.2, for jobs a restart finds
    worker = b"replayer.cli.worker" in cmd or b"replayer.service.worker" in cmd
    return worker and str(job_dir).encode() in cmd


def _workers_of(job_dir: Path) -> list[int]:
    """Every live worker of ``job_dir``: a serve killed between starting a
    worker and noting its pid leaves one that state.json does not name."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid != os.getpid() and _pid_is_worker(pid, job_dir):
            out.append(pid)
    return out


async def _wait_gone(pid: int, within: float) -> bool:
    """Wait for a process that is not our child to exit (a pidfd becomes
    readable when it does); True if it did within ``within`` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:
        return await asyncio.to_thread(_poll_gone, pid, within)
    gone = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(fd, gone.set)
    try:
        return await wait_event(gone, within)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _poll_gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)  # no pidfd on this system: a bounded poll of the pid
    return False


class Scheduler:
    """Runs the store's jobs (see the module docstring).

    **Usage**::

        sched = Scheduler(store, max_concurrent=1)
        await sched.recover()
        sched.start()
        ...
        await sched.shutdown()
    """

    def __init__(
        self,
        store: JobStore,
        *,
        max_concurrent: int = 1,
        progress: ProgressReader | None = None,
        cancel_grace: float = CANCEL_GRACE,
        python: str | None = None,
        on_finish: Callable[[Job], None] | None = None,
        pools: Mapping[str, PoolConfig] | None = None,
    ) -> None:
        self.store = store
        self.pools = dict(pools or {})
        self.max_concurrent = max_concurrent
        self.progress = progress or ProgressReader()
        self.cancel_grace = cancel_grace
        self.python = python or sys.executable
        self.on_finish = on_finish
        self.running: dict[str, _Running] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self._loop_task = spawn(self._loop(), name="serve-scheduler")

    def kick(self) -> None:
        self._wake.set()

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            self._start_eligible()
            await self._wake.wait()
            self._wake.clear()

    def queued(self) -> list[Job]:
        jobs = [j for j in self.store.jobs.values() if j.state is JobState.QUEUED]
        return sorted(jobs, key=lambda j: (j.created_at, j.id))

    def held(self) -> dict[str, set[int]]:
        """The servers of each pool that running jobs hold."""
        out: dict[str, set[int]] = {}
        for r in self.running.values():
            if r.job.pool is not None:
                out.setdefault(r.job.pool, set()).update(r.job.slots)
        return out

    def _sharing(self, pool: str, queued: list[Job]) -> int:
        """Jobs that name ``pool``, running or queued (a job picked in this
        pass is both: counted once)."""
        ids = {r.job.id for r in self.running.values() if r.job.pool == pool}
        return len(ids | {j.id for j in queued if j.pool == pool})

    def _start_eligible(self) -> None:
        busy = {t for r in self.running.values() for t in r.job.targets}
        held = self.held()
        queued = self.queued()
        for job in queued:
            if len(self.running) >= self.max_concurrent:
                return
            if busy & set(job.targets):
                continue
            if job.pool is not None and job.pool in self.pools:
                size = self.pools[job.pool].size
                taken = held.setdefault(job.pool, set())
                share = self._sharing(job.pool, queued)
                slots = allot(size, taken, want=job.max_servers, sharing=share)
                if not slots:
                    continue  # every server of the pool is held: wait for one
                taken.update(slots)
                self.store.update(job, slots=slots)
            busy |= set(job.targets)
            # the worker starts inside the task, so one bad start fails one job
            self.running[job.id] = _Running(job)
            self.running[job.id].task = spawn(self._run(job), name=f"job-{job.id}")

    async def _run(self, job: Job) -> None:
        try:
            await self._run_worker(job)
        except Exception as exc:  # the service outlives any job
            log.exception("job %s: the scheduler failed running it", job.id)
            with contextlib.suppress(Exception):
                self.store.update(
                    job, state=JobState.FAILED, message=f"internal error: {exc}"[:500]
                )
        finally:
            self.running.pop(job.id, None)
            self.kick()

    async def _run_worker(self, job: Job) -> None:
        d = self.store.dir(job)
        from replayer.service.hooks import takes_metrics_port

        if job.state is not JobState.QUEUED:
            return  # cancelled between being picked and starting
        env = {
            # the service's token is not the job's business (nor its servers')
            **{k: v for k, v in os.environ.items() if k != "REPLAYER_SERVE_TOKEN"},
            "REPLAYER_SERVE_PID": str(os.getpid()),
            "PYTHONUNBUFFERED": "1",
            # the worker stops hard before serve would SIGKILL it (see worker.py)
            "REPLAYER_WORKER_STOP_GRACE": f"{max(1.0, self.cancel_grace * 2 / 3):g}",
        }
        if job.pool is not None:
            conf = self.pools.get(job.pool)
            if conf is None:
                self.store.update(
                    job,
                    state=JobState.FAILED,
                    message=f"pool {job.pool} is not in targets.toml any more",
                    finished_at=time.time(),
                )
                if self.on_finish is not None:
                    self.on_finish(job)
                return
            write_pool_file(conf, job.slots, d / POOL_FILE)
            self.store.note(
                job,
                f"holds server(s) {', '.join(map(str, job.slots))} of pool {job.pool} "
                f"({conf.size} in all)",
            )
        port = None
        if takes_metrics_port(job.kind):  # live metrics: a port per attempt, not in state.json
            port = free_port()
            env["REPLAYER_WORKER_METRICS_PORT"] = str(port)
        self.store.update(
            job,
            state=JobState.RUNNING,
            started_at=job.started_at or time.time(),
            attempts=job.attempts + 1,
            note=f"worker start {job.attempts + 1}",
        )
        self.store.note(job, f"starting worker (attempt {job.attempts})")
        with self.store.log_path(job).open("ab") as logf:
            proc = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                "replayer.cli.worker",
                str(d),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=logf,
                stderr=asyncio.subprocess.STDOUT,
                cwd=d,
                env=env,
                start_new_session=True,
            )
        run = self.running[job.id]
        run.proc, run.metrics_port = proc, port
        if job.kind == "bisect":
            run.trials_at_start = self.progress.journal(
                self.store.out(job) / "journal.jsonl"
            ).trials
        self.store.update(job, worker_pid=proc.pid)
        if job.cancel_requested:
            self._stop_worker(job, proc)
        code = await proc.wait()
        if self._stopping.is_set() and not job.cancel_requested:
            self.store.note(job, f"worker stopped by serve shutdown (exit {code}); resumes later")
            return  # state stays RUNNING: recover() resumes it on the next start
        if code < 0 and not job.cancel_requested:
            # killed by a signal (the OOM killer, an operator): its servers
            # would outlive it
            reap_orphan(self.store.out(job) / "server.pid")
            if job.kind == "bisect" and self._resume_killed(job, code, run.trials_at_start):
                return
        self._finish(job, code)

    def _resume_killed(self, job: Job, code: int, trials_at_start: int) -> bool:
        """Put a bisect whose worker was killed back in the queue (it resumes
        from its journal), unless its workers keep dying without finishing a
        trial. True if it was requeued."""
        out = self.store.out(job)
        progressed = self.progress.journal(out / "journal.jsonl").trials > trials_at_start
        deaths = 0 if progressed else job.worker_deaths + 1
        if deaths >= MAX_WORKER_DEATHS:
            self.store.update(job, worker_deaths=deaths)
            return False
        self.store.note(job, f"the worker was killed by signal {-code}")
        self.store.update(job, worker_deaths=deaths)
        self._requeue_bisect(job, out, why="its worker was killed by a signal")
        return True

    def _finish(self, job: Job, code: int) -> None:
        out, logp = self.store.out(job), self.store.log_path(job)
        outcome = OUTCOMES.get(job.kind, {}).get(code)
        if job.cancel_requested:
            state, message = JobState.CANCELLED, "cancelled"
        elif outcome is not None:
            state, message = JobState.FINISHED, None
        else:
            state = JobState.FAILED
            if code < 0:
                message = f"the worker was killed by signal {-code}"
                if job.worker_deaths >= MAX_WORKER_DEATHS:
                    message += f" ({job.worker_deaths} times in a row, no trial finished)"
            else:
                message = last_error_line(logp) or f"exit code {code}"
        self.store.note(job, f"worker exited with code {code}: {state.value}")
        self.store.update(
            job,
            state=state,
            exit_code=code,
            outcome=outcome if state is JobState.FINISHED else None,
            message=message,
            finished_at=time.time(),
            worker_pid=None,
            result=result_of(job.kind, out, logp),
        )
        if self.on_finish is not None:
            self.on_finish(job)

    # -- cancel ---------------------------------------------------------------------

    async def cancel(self, job: Job) -> None:
        """Cancel a queued job at once; ask a running one to stop (SIGTERM),
        killing it after the grace period."""
        if job.state is JobState.QUEUED:
            self.store.update(
                job,
                state=JobState.CANCELLED,
                cancel_requested=True,
                message="cancelled before it started",
                finished_at=time.time(),
            )
            return
        run = self.running.get(job.id)
        self.store.update(job, state=JobState.CANCELLING, cancel_requested=True)
        self.store.note(job, "cancel requested: stopping the worker")
        if run is not None and run.proc is not None:  # else: stopped as soon as it starts
            self._stop_worker(job, run.proc)

    def _stop_worker(self, job: Job, proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        spawn(self._kill_after(job, proc), name=f"cancel-{job.id}")

    async def _kill_after(self, job: Job, proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), self.cancel_grace)
            return
        self.store.note(job, f"the worker ignored SIGTERM for {self.cancel_grace:g} s: killed")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        reap_orphan(self.store.out(job) / "server.pid")

    # -- restart --------------------------------------------------------------------

    async def _stop_stale_worker(self, job: Job) -> None:
        d = self.store.dir(job)
        for pid in await asyncio.to_thread(_workers_of, d):
            self.store.note(job, f"stopping the previous serve's worker (pid {pid})")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not await _wait_gone(pid, self.cancel_grace) and _pid_is_worker(pid, d):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)

    async def recover(self) -> None:
        """Settle the jobs a previous ``serve`` left running (module docstring)."""
        for job in list(self.store.jobs.values()):
            if job.state not in (JobState.RUNNING, JobState.CANCELLING):
                continue
            await self._stop_stale_worker(job)
            out = self.store.out(job)
            if job.state is JobState.CANCELLING or job.cancel_requested:
                reap_orphan(out / "server.pid")
                self.store.update(
                    job,
                    state=JobState.CANCELLED,
                    worker_pid=None,
                    finished_at=time.time(),
                    message="cancelled (serve restarted while it stopped)",
                )
                continue
            if job.kind == "bisect":
                self._requeue_bisect(job, out)
                continue
            reap_orphan(out / "server.pid")
            self.store.note(job, "serve restarted while this job ran: interrupted")
            self.store.update(
                job,
                state=JobState.INTERRUPTED,
                worker_pid=None,
                finished_at=time.time(),
                message="serve restarted while it ran; partial results are kept in out/",
                result=result_of(job.kind, out, self.store.log_path(job)),
            )

    def _requeue_bisect(self, job: Job, out: Path, why: str = "serve restarted") -> None:
        argv = list(job.argv)
        spec = dict(job.spec) if job.spec is not None else None
        if (out / "journal.jsonl").exists():
            if "--resume" not in argv:
                argv.insert(len(argv) - 1, "--resume")  # before --out, which stays last
            if spec is not None:
                spec["resume"] = True
            note = f"{why}: the bisect resumes from its journal"
        else:
            # no trial finished: start over, keeping what the first attempt left
            if out.exists():
                out.rename(out.with_name(f"out.attempt-{job.attempts}"))
            note = f"{why} before the first trial finished: the bisect starts over"
        self.store.note(job, note)
        self.store.update(
            job, state=JobState.QUEUED, argv=argv, spec=spec, worker_pid=None, note=note, slots=[]
        )
        self.progress.forget(out)

    # -- shutdown -------------------------------------------------------------------

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after ``grace``); their
        jobs stay ``running`` on disk and resume at the next start."""
        self._stopping.set()
        self._wake.set()
        runs = list(self.running.values())
        for r in runs:
            if r.proc is not None and r.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    r.proc.send_signal(signal.SIGTERM)
        tasks = [r.task for r in runs if r.task is not None]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=grace or self.cancel_grace)
            for r in runs:
                if r.task in pending and r.proc is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(r.proc.pid, signal.SIGKILL)
            if pending:
                await asyncio.wait(pending, timeout=5)
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
