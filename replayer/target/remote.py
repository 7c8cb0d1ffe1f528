"""Servers someone else runs: restartable by a command, or only a URL.

``--restart-cmd CMD`` (``ssh node docker restart vllm``, ``systemctl restart
vllm``) is run by ``/bin/sh -c`` in its own process group, with a timeout,
and must return once the old server is down (``docker restart`` and
``systemctl restart`` do; an asynchronous ``kubectl rollout restart`` would
let the readiness wait see the old server). The new server then loads, and
:meth:`wait_ready` waits for it like for a launched one.

``--log-cmd CMD`` fetches the server's log; its stdout replaces the current
launch's segment of ``server.log`` each time it runs (container logs repeat
everything since the container started). ``{since}`` (RFC 3339, UTC) and
``{since_unix}`` in it become the time of the last (re)start, so
``docker logs --since {since} vllm`` returns only the current launch and a
crash is never blamed on an earlier one.

A target given by ``--url`` alone cannot be restarted: every operation that
needs a restart raises :class:`~replayer.errors.TargetError` in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from replayer.errors import TargetError
from replayer.monitor.logs import launch_marker
from replayer.target.base import DEFAULT_READY_TIMEOUT, PROBE_TIMEOUT, ServerTarget, log
from replayer.target.facts import redact_command

COMMAND_TIMEOUT = 600.0
OUTPUT_TAIL = 2000


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How a ``--restart-cmd``/``--log-cmd`` run ended."""

    code: int | None
    """Exit status (negative: the signal that ended it)."""
    stderr: str
    """The tail of its stderr."""
    stdout: str
    """The tail of its stdout (empty when redirected to a file)."""

    @property
    def last_line(self) -> str:
        """The last line of stderr, else of stdout: the likeliest reason ("" if none)."""
        for text in (self.stderr, self.stdout):
            lines = text.strip().splitlines()
            if lines:
                return lines[-1]
        return ""

    def failure(self, what: str) -> str:
        """``--restart-cmd exited with code 7: no such container``."""
        line = self.last_line
        return f"{what} exited with code {self.code}" + (f": {line}" if line else "")


async def run_command(cmd: str, *, within: float, stdout: IO[bytes] | None = None) -> CommandResult:
    """Run ``cmd`` with ``/bin/sh -c`` in its own process group; the whole
    group is killed after ``within`` seconds (TimeoutError) or when the
    caller is cancelled."""
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        cmd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=stdout if stdout is not None else asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within)
    except BaseException:  # timeout or cancellation: leave nothing behind
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    return CommandResult(
        proc.returncode,
        (err or b"").decode(errors="replace")[-OUTPUT_TAIL:],
        (out or b"").decode(errors="replace")[-OUTPUT_TAIL:],
    )


class _CommandLogTarget(ServerTarget):
    """Launch counting and ``--log-cmd`` for servers we do not run."""

    def __init__(
        self,
        url: str,
        *,
        log_cmd: str | None = None,
        log_path: Path | None = None,
        model: str | None = None,
        api_key: str | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        probe_timeout: float = PROBE_TIMEOUT,
        command_timeout: float = COMMAND_TIMEOUT,
    ) -> None:
        if log_cmd is not None and log_path is None:
            raise ValueError("log_cmd needs a log_path to write to")
        super().__init__(
            url,
            model=model,
            api_key=api_key,
            log_path=log_path,
            ready_timeout=ready_timeout,
            probe_timeout=probe_timeout,
        )
        self.log_cmd = log_cmd
        self.command_timeout = command_timeout
        self.launches = 0
        self.since = time.time()
        """When the current launch began (``{since}`` in ``--log-cmd``)."""

    def _new_launch(self, what: str) -> None:
        self.launches += 1
        self.since = time.time()
        self._begin_segment(launch_marker(self.launches, what, self.since))

    async def start(self) -> None:
        """Attach to the running server (nothing is started)."""
        self._new_launch(f"attach {self.url}")

    def log_command(self) -> str | None:
        """``--log-cmd`` with ``{since}`` and ``{since_unix}`` filled in."""
        if self.log_cmd is None:
            return None
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))
        return self.log_cmd.replace("{since}", stamp).replace("{since_unix}", str(int(self.since)))

    async def collect_log(self) -> str:
        cmd = self.log_command()
        if cmd is None or self.log_path is None:
            return self.read_log()
        if self.launches == 0:
            self._new_launch(f"attach {self.url}")
        with self.log_path.open("r+b") as f:  # keep the marker, replace the rest
            f.seek(self._segment)
            marker = f.readline()
            f.truncate(self._segment + len(marker))
        with self.log_path.open("ab") as out:
            try:
                res = await run_command(cmd, within=self.command_timeout, stdout=out)
            except TimeoutError:
                log.warning("--log-cmd did not finish within %gs", self.command_timeout)
                return self.read_log()
        if res.code != 0:
            log.warning("%s", res.failure("--log-cmd"))
        return self.read_log()

    def _command_facts(self) -> dict[str, object]:
        return {
            "kind": type(self).__name__,
            "log_cmd": None if self.log_cmd is None else redact_command(self.log_cmd),
            "launches": self.launches,
        }


class RestartableTarget(_CommandLogTarget):
    """A server restarted by a command (container, remote host, service).

    Usage::

        t = RestartableTarget("ssh gpu3 docker restart vllm", "http://gpu3:8000",
                              log_cmd="ssh gpu3 docker logs --since {since} vllm",
                              log_path=run / "server.log")
        await t.start()            # attach
        await t.wait_ready()
        ...
        await t.restart()          # keeps the old launch's log, then restarts
        await t.wait_ready()
    """

    def __init__(
        self,
        restart_cmd: str,
        url: str,
        *,
        log_cmd: str | None = None,
        log_path: Path | None = None,
        model: str | None = None,
        api_key: str | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        probe_timeout: float = PROBE_TIMEOUT,
        command_timeout: float = COMMAND_TIMEOUT,
    ) -> None:
        super().__init__(
            url,
            log_cmd=log_cmd,
            log_path=log_path,
            model=model,
            api_key=api_key,
            ready_timeout=ready_timeout,
            probe_timeout=probe_timeout,
            command_timeout=command_timeout,
        )
        self.restart_cmd = restart_cmd

    @property
    def can_restart(self) -> bool:
        return True

    async def restart(self) -> None:
        if self.log_cmd is not None:
            await self.collect_log()  # the ending launch's log, before it is gone
        self._new_launch(redact_command(self.restart_cmd))
        try:
            res = await run_command(self.restart_cmd, within=self.command_timeout)
        except TimeoutError:
            raise TargetError(
                f"--restart-cmd did not finish within {self.command_timeout:g}s"
            ) from None
        if res.code != 0:
            raise TargetError(res.failure("--restart-cmd"))
        log.info("restarted %s (launch %d)", self.url, self.launches)

    def _command_facts(self) -> dict[str, object]:
        return {**super()._command_facts(), "restart_cmd": redact_command(self.restart_cmd)}


class ExternalTarget(_CommandLogTarget):
    """A server known only by its URL: it is never started, stopped or
    restarted, and anything that needs a restart raises TargetError.

    Usage::

        t = ExternalTarget("http://10.0.0.3:8000")
        await t.wait_ready()
        await t.reset("prefix-cache")    # warns once and does nothing without dev mode
    """
