"""One server a session runs trials on: its lifecycle between trials.

The server is (re)started only when it has to be: at the first trial, after
a failure, or when ``reset`` asks; after a passing trial ``prefix-cache``
clears the cache instead (falling back to a restart, or to nothing, where
the server has no dev mode). A trial may include a ten-minute model load, so
this is the unit of cost of the whole tool.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from replayer.errors import TargetError
from replayer.options.server import ResetMode, Server
from replayer.target.base import ServerTarget

OWNER_ENV = "REPLAYER_BISECT_OWNER"
"""Set in the environment of every server a bisect launches (see :func:`reap_orphan`)."""


def owner_token(out: Path) -> str:
    return str(out.resolve())


@dataclass
class Slot:
    """A server a session holds: its target, how it is reset, and its state."""

    target: ServerTarget
    reset: ResetMode = ResetMode.RESTART
    name: str = "target"
    api_key: str | None = None
    pidfile: Path | None = None
    """Where a launched server's process group is noted, so a bisect killed
    with SIGKILL can reap its orphaned server when it resumes."""
    started: bool = False
    needs_restart: bool = True
    fresh: bool = False
    """Made ready for a trial and not used since: the next :meth:`prepare` is
    a no-op (a pool refreshes a server in the background after its trial)."""

    @classmethod
    def of(
        cls,
        server: Server,
        *,
        log_path: Path | None,
        model: str | None,
        name: str = "target",
        marks: Mapping[str, str] | None = None,
        pidfile: Path | None = None,
        launch: str | None = None,
    ) -> Slot:
        """The slot for ``server`` (``launch`` replaces its command: a variant)."""
        from replayer.target.factory import make_target

        target = make_target(
            launch=launch if launch is not None else server.launch,
            restart_cmd=server.restart_cmd,
            url=server.url,
            log_cmd=server.log_cmd,
            log_path=log_path,
            env=server.env,
            marks=marks,
            model=model,
            api_key=server.api_key,
            ready_timeout=server.ready_timeout,
        )
        return cls(target, server.reset, name, server.api_key, pidfile)

    @property
    def url(self) -> str:
        return self.target.url

    async def prepare(self) -> None:
        """Make the target fresh enough for the next trial."""
        if self.fresh and not self.needs_restart:
            return
        try:
            await self._prepare()
        except BaseException:
            self.needs_restart = True  # whatever state it is in, start over next time
            self.fresh = False
            raise
        self.fresh = True

    async def _prepare(self) -> None:
        t = self.target
        if not self.started:
            await t.start()
            self._note_pid()
            self.started = True
            self.needs_restart = False
            await t.wait_ready()
            return
        if self.needs_restart:
            if not t.can_restart:
                raise TargetError(
                    f"the target at {t.url} failed and cannot be restarted: give --launch or "
                    "--restart-cmd"
                )
            await t.restart()
            self._note_pid()
            self.needs_restart = False
            await t.wait_ready()
            return
        if self.reset is not ResetMode.NONE:
            res = await t.reset(self.reset)
            if res.performed is ResetMode.RESTART:
                self._note_pid()
                await t.wait_ready()

    def _note_pid(self) -> None:
        pid = getattr(self.target, "pid", None)
        if self.pidfile is not None and pid is not None:
            self.pidfile.write_text(f"{pid}\n{_cmdline(pid)}\n")

    async def stop(self) -> None:
        await self.target.stop()
        self.started = False
        self.needs_restart = True
        self.fresh = False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def reap_orphan(pidfile: Path) -> bool:
    """Kill the process group a killed bisect left behind, if it is still the
    same program (pid reuse is checked against the noted command line)."""
    reaped = False
    try:
        pid_text, cmd = [*pidfile.read_text().splitlines(), "", ""][:2]
        pid = int(pid_text)
    except (OSError, ValueError):
        pid, cmd = 0, ""
    if cmd and _cmdline(pid) == cmd:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
            reaped = True
    # A kill between a launch and its pidfile note leaves a server nobody
    # noted: launched servers carry OWNER_ENV naming this bisect, so find them.
    mark = f"{OWNER_ENV}={owner_token(pidfile.parent)}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if mark not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            pgid = os.getpgid(int(proc.name))
            if pgid in (os.getpgid(0), 0):
                continue
            os.killpg(pgid, signal.SIGKILL)
            reaped = True
        except (OSError, ValueError):
            continue
    return reaped
