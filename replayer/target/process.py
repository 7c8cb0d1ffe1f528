"""A server we launch ourselves (``--launch CMD``).

The command runs as the leader of a new process group (``start_new_session``),
because vLLM is a family of processes (API server, EngineCore, one worker per
GPU) and stopping only the leader would leave workers holding GPU memory and
ports. stdout and stderr go to the run's ``server.log``, appended across
restarts, one :func:`~replayer.monitor.logs.launch_marker` line per launch.

The exit is watched by polling (every 50 ms, bounded by the process's
life) and recorded as an :class:`~replayer.target.base.ExitInfo` (code or
signal, and when). A process that exits while loading makes
:meth:`wait_ready` fail at once with the log tail, not after the 30-minute
ready timeout.

Stopping is SIGTERM to the group, up to ``stop_grace`` seconds for the whole
group to go (vLLM shuts its engine down on SIGTERM), then SIGKILL to whatever
is left. "Gone" means no member that is not a zombie: where PID 1 does not
reap orphans (some containers and VMs), a dead worker whose parent died first
stays a zombie forever, holding neither memory nor ports.

The string form of a command is split like a shell would (``shlex``), with
leading ``NAME=value`` words taken as environment, but not run by a shell:
the exit status must be the server's own (a shell would turn a SIGABRT into
134). Use ``sh -c '...'`` explicitly for pipes.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from replayer._async import spawn
from replayer._clock import REAL, Clock
from replayer.errors import LaunchError, TargetError, UsageError
from replayer.monitor.logs import launch_marker
from replayer.target.base import (
    DEFAULT_READY_TIMEOUT,
    PROBE_TIMEOUT,
    ExitInfo,
    ServerTarget,
    log,
)
from replayer.target.facts import redact_command, relevant_env

DEFAULT_STOP_GRACE = 30.0
KILL_WAIT = 10.0
POLL_INTERVAL = 0.05
TAIL_LINES = 40
TAIL_BYTES = 64 * 1024

_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_LIVE: set[LaunchedTarget] = set()


def _kill_leftovers() -> None:
    for target in list(_LIVE):
        target.kill()


atexit.register(_kill_leftovers)


def split_command(cmd: str | Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``"VLLM_X=1 vllm serve m"`` -> ``(["vllm", "serve", "m"], {"VLLM_X": "1"})``."""
    try:
        argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    except ValueError as exc:
        raise UsageError(f"--launch: cannot split {cmd!r}: {exc}") from None
    env: dict[str, str] = {}
    while argv and _ASSIGN.match(argv[0]):
        name, value = argv.pop(0).split("=", 1)
        env[name] = value
    if not argv:
        raise UsageError("--launch: empty command")
    return argv, env


def group_members(pgid: int) -> list[int]:
    """Pids of process group ``pgid`` that are not zombies ([] when it is gone)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        return [pgid]
    proc = Path("/proc")
    if not proc.is_dir():
        return [pgid]
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(entry.name))
    return out


class LaunchedTarget(ServerTarget):
    """A server process group started from a command line.

    Usage::

        t = LaunchedTarget("vllm serve moonshotai/Kimi-K3 --port 8000",
                           "http://127.0.0.1:8000", run / "server.log",
                           model="moonshotai/Kimi-K3")
        await t.start()
        await t.wait_ready()
        ...
        info = await t.wait_exit(30)      # after a crash: code or signal
        await t.restart()
        await t.stop()
    """

    def __init__(
        self,
        cmd: str | Sequence[str],
        url: str,
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        marks: Mapping[str, str] | None = None,
        model: str | None = None,
        api_key: str | None = None,
        stop_grace: float = DEFAULT_STOP_GRACE,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        probe_timeout: float = PROBE_TIMEOUT,
        cwd: Path | None = None,
        clock: Clock = REAL,
    ) -> None:
        super().__init__(
            url,
            model=model,
            api_key=api_key,
            log_path=log_path,
            ready_timeout=ready_timeout,
            probe_timeout=probe_timeout,
            clock=clock,
        )
        self.log_file = log_path
        self.argv, cmd_env = split_command(cmd)
        self.env = {**cmd_env, **(env or {})}
        """Set on top of this process's environment for the child."""
        self.marks = dict(marks or {})
        """Environment that tags the child for replayer's own bookkeeping (finding
        orphans); kept out of the command text, so out of logs and bundles."""
        self.stop_grace = stop_grace
        self.cwd = cwd
        self.launches = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._exit: ExitInfo | None = None
        self._exited = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._launching: asyncio.Task[subprocess.Popen[bytes] | OSError] | None = None
        self._launched: asyncio.Task[subprocess.Popen[bytes] | OSError] | None = None
        """The last launch whose process is accounted for: a start that
        finished, or a stop that ended what a cancelled start made."""
        self._started = 0.0
        self._made: list[subprocess.Popen[bytes]] = []
        """Every process this target launched and has not seen end, noted by
        the launching thread itself: whatever became of the start that asked
        for it (cancelled, overtaken by another), stop() ends it, so none
        outlives the target unowned."""

    # -- state ---------------------------------------------------------------------------

    @property
    def can_restart(self) -> bool:
        return True

    @property
    def pid(self) -> int | None:
        """The leader's pid (also the process group id) of the current launch."""
        return None if self._proc is None else self._proc.pid

    def command_text(self) -> str:
        assigns = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*assigns, shlex.join(self.argv)])

    def _poll(self) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        rc = proc.poll()
        if rc is not None and self._exit is None:
            self._exit = ExitInfo.from_returncode(rc, self.clock.wall())
            log.info("%s exited (%s)", self.argv[0], self._exit.text)
        return rc

    def alive(self) -> bool:
        return self._proc is not None and self._poll() is None

    @property
    def exit_info(self) -> ExitInfo | None:
        self._poll()
        return self._exit

    def _exit_event(self) -> asyncio.Event:
        return self._exited

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self._launching is not None and self._launching is not self._launched:
            # a cancelled start's launch (maybe still going on in its thread):
            # what it made is nobody's, and must not take this launch's place
            await self.stop()
        if self.alive():
            raise TargetError(f"{self.argv[0]} is already running (pid {self.pid})")
        await self._reap_group()  # leftovers of the previous launch, if any
        self.launches += 1
        self._begin_segment(launch_marker(self.launches, redact_command(self.command_text())))
        self._exit = None
        self._exited = asyncio.Event()
        _LIVE.add(self)  # from now on it may own a process: never collected before stop()
        launch = spawn(asyncio.to_thread(self._popen), name="target-launch")
        self._launching = launch
        try:
            proc = await asyncio.shield(launch)
        except asyncio.CancelledError:
            # the launch goes on in its thread: the process it makes is ours
            # to stop (a pool closed mid-restart would leak it otherwise)
            launch.add_done_callback(self._adopt)
            raise
        if isinstance(proc, OSError):
            with contextlib.suppress(OSError), self.log_file.open("ab") as out:
                out.write(f"replayer: cannot launch: {proc}\n".encode())
            self._proc = None
            raise LaunchError(f"cannot launch {self.argv[0]!r}: {proc.strerror or proc}")
        self._proc, self._pgid = proc, proc.pid
        self._launched = launch
        self._started = self.clock.now()
        _LIVE.add(self)
        self._watcher = spawn(self._watch(proc, self._exited), name=f"target-exit-{proc.pid}")
        log.info("launched %s (pid %d, launch %d)", self.argv[0], proc.pid, self.launches)

    def _popen(self) -> subprocess.Popen[bytes] | OSError:
        """In a thread: the log is opened here, so a cancelled start never
        closes it under a launch still going on. An OSError is returned (a
        bad command is one line, not a background task's traceback)."""
        try:
            with self.log_file.open("ab") as out:
                proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.env, **self.marks},
                    cwd=self.cwd,
                    start_new_session=True,
                )
        except OSError as exc:
            return exc
        self._made.append(proc)  # here, not in start(): a cancelled start never sees it
        return proc

    def _adopt(self, launch: asyncio.Task[subprocess.Popen[bytes] | OSError]) -> None:
        """Hold the process of a launch whose start was cancelled."""
        if launch.cancelled() or launch.exception() is not None:
            return
        proc = launch.result()
        if isinstance(proc, subprocess.Popen) and self._proc is not proc:
            self._proc, self._pgid = proc, proc.pid
            _LIVE.add(self)

    async def _watch(self, proc: subprocess.Popen[bytes], event: asyncio.Event) -> None:
        # Polled: an awaitable child exit needs a child watcher bound to one
        # event loop; polling keeps a target usable from any loop.
        while proc.poll() is None:  # noqa: ASYNC110
            await self.clock.sleep(POLL_INTERVAL)
        if proc is self._proc:
            self._poll()
        event.set()

    async def wait_exit(self, within: float) -> ExitInfo:
        """Wait (bounded) for the process to exit by itself; how it ended."""
        if self._proc is None:
            raise TargetError("not started")
        if not await self._until(lambda: self._poll() is not None, within):
            raise TimeoutError(f"{self.argv[0]} still running after {within:g}s")
        assert self._exit is not None
        return self._exit

    async def stop(self) -> ExitInfo | None:
        """SIGTERM to the group, SIGKILL after ``stop_grace``; how it ended."""
        launching = self._launching
        if launching is not None:
            if not launching.done():  # a cancelled start's launch: Popen returns at once
                with contextlib.suppress(Exception):
                    await asyncio.shield(launching)
            if launching.done():
                self._adopt(launching)
                self._launched = launching
        proc = self._proc
        if proc is None:
            return self._exit
        pgid = self._pgid
        if pgid is not None and group_members(pgid):
            self._signal(signal.SIGTERM)

            def gone() -> bool:
                return self._poll() is not None and not group_members(pgid)

            if not await self._until(gone, self.stop_grace):
                log.warning("%s: SIGKILL after %gs of SIGTERM", self.argv[0], self.stop_grace)
        await self._reap_group()
        await self._reap_made()
        self._poll()
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        self._exited.set()
        _LIVE.discard(self)
        return self._exit

    async def _reap_made(self) -> None:
        """End every process this target made that still runs (the current
        one is already reaped by its group)."""
        for proc in self._made:
            if proc.poll() is None:
                log.warning("%s: stopping pid %d, a launch no start kept", self.argv[0], proc.pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)

                def ended(p: subprocess.Popen[bytes] = proc) -> bool:
                    return p.poll() is not None

                await self._until(ended, KILL_WAIT)
        self._made = [p for p in self._made if p.poll() is None]

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    def kill(self) -> None:
        """SIGKILL the group now, without waiting (interpreter exit)."""
        self._signal(signal.SIGKILL)
        for proc in self._made:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for made in [self._proc, *self._made]:
            if made is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    made.wait(1.0)
        _LIVE.discard(self)

    def _signal(self, sig: int) -> None:
        if self._pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pgid, sig)

    async def _reap_group(self) -> None:
        """SIGKILL what is left of the group and wait until it is gone."""
        pgid = self._pgid
        if pgid is None:
            return
        if group_members(pgid):
            self._signal(signal.SIGKILL)
            ok = await self._until(
                lambda: self._poll() is not None and not group_members(pgid), KILL_WAIT
            )
            if not ok:
                raise TargetError(
                    f"process group {pgid} survived SIGKILL for {KILL_WAIT:g}s: "
                    f"{group_members(pgid)}"
                )
        self._poll()
        self._pgid = None  # never signal this id again: pids are reused

    async def _until(self, check: Callable[[], bool], within: float) -> bool:
        """Poll ``check`` every 20 ms for at most ``within`` seconds."""
        clock = self.clock
        deadline = clock.now() + within
        for _ in range(int(within / 0.02) + 2):
            if check():
                return True
            if clock.now() >= deadline:
                break
            await clock.sleep(0.02)
        return check()

    # -- readiness and facts -------------------------------------------------------------

    def _check_loading(self) -> None:
        if self._proc is None:
            raise TargetError("the target was not started")
        if self._poll() is None:
            return
        assert self._exit is not None
        after = self.clock.now() - self._started
        raise LaunchError(
            f"{self.argv[0]} exited ({self._exit.text}) {after:.1f}s after launch "
            f"{self.launches}, before it was ready; log tail ({self.log_file}):\n{self.tail()}"
        )

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last lines this launch wrote."""
        try:
            with self.log_file.open("rb") as f:
                end = f.seek(0, 2)
                f.seek(max(self._segment, end - TAIL_BYTES))
                data = f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""
        rows = data.splitlines()
        if rows and rows[0].startswith("==> replayer launch "):
            rows = rows[1:]
        return "\n".join("    " + r for r in rows[-lines:])

    def _command_facts(self) -> dict[str, object]:
        return {
            "kind": "launch",
            "launch": redact_command(self.command_text()),
            "env": relevant_env({**os.environ, **self.env}),
            "launches": self.launches,
            "exit": None if self._exit is None else self._exit.text,
        }
