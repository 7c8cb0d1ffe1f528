"""Run the vLLM emulator as a real subprocess, for tests and benchmarks.

A subprocess, not an in-process app, because the emulator must be able to
really die: ``exit`` faults end in ``os._exit``, ``cut kill=1`` in SIGKILL.
The process binds ``127.0.0.1`` on a free port and reports it through a port
file (no port races); :meth:`EmulatorProcess.start` returns once ``/health``
answers 200, within a bounded time. Every wait here is a bounded poll of an
observable condition; nothing sleeps for a fixed time to "let things
settle".

Stopping is SIGTERM (the emulator's graceful vLLM shutdown), then SIGKILL
after a timeout; processes still alive when the interpreter exits are
killed, so nothing leaks.

Usage::

    with EmulatorProcess(["--speed", "instant", "--fault", "exit when request=3"]) as emu:
        client = openai.OpenAI(base_url=f"{emu.url}/v1", api_key="x")
        ...
        assert emu.wait_exit(10) == 0
        lines = emu.read_request_log()
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

_LIVE: set[EmulatorProcess] = set()


class EmulatorStartError(RuntimeError):
    """The emulator exited or did not become healthy in time."""


def _kill_leftovers() -> None:
    for emu in list(_LIVE):
        emu.kill()


atexit.register(_kill_leftovers)


class EmulatorProcess:
    """One emulator subprocess on ``127.0.0.1`` (sync and async context manager).

    ``args`` are extra ``replayer emulate`` options; ``--host``, ``--port``,
    ``--port-file`` and (unless ``request_log=False``) ``--request-log`` are
    supplied. Files live in ``workdir`` (a temporary directory, removed on
    :meth:`stop`, when not given).
    """

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        workdir: Path | None = None,
        env: Mapping[str, str] | None = None,
        request_log: bool = True,
        log_bodies: bool = False,
        startup_timeout: float = 30.0,
        python: str | None = None,
    ) -> None:
        self.args = list(args)
        self._own_dir = workdir is None
        self.workdir = (
            Path(tempfile.mkdtemp(prefix="replayer-emu-")) if workdir is None else workdir
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.env = dict(env or {})
        self.request_log: Path | None = self.workdir / "requests.jsonl" if request_log else None
        self.log_bodies = log_bodies
        self.log_path = self.workdir / "server.log"
        self.port_file = self.workdir / "port"
        self.startup_timeout = startup_timeout
        self.python = python or sys.executable
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None

    # -- properties ------------------------------------------------------------------

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError("emulator not started")
        return self._proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("emulator port not known yet (start() first)")
        return self._port

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (no trailing slash; the API is under ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    def exited(self) -> bool:
        """The process has ended (the monitor's :class:`ProcessProbe`)."""
        return self._proc is not None and self._proc.poll() is not None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def command(self) -> list[str]:
        cmd = [self.python, "-m", "replayer.emulator", "--host", self.host, "--port", "0"]
        cmd += ["--port-file", str(self.port_file)]
        if self.request_log is not None:
            cmd += ["--request-log", str(self.request_log)]
        if self.log_bodies:
            cmd.append("--log-bodies")
        return cmd + self.args

    # -- lifecycle ---------------------------------------------------------------------

    def launch(self) -> Self:
        """Start the process and learn its port; do not wait for readiness."""
        if self._proc is not None:
            raise RuntimeError("emulator already started")
        self.port_file.unlink(missing_ok=True)
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        _LIVE.add(self)
        try:
            poll_until(self._read_port, self.startup_timeout, what="the emulator's port file")
        except TimeoutError:
            self.kill()
            raise EmulatorStartError(self._failure("did not bind a port")) from None
        return self

    def _read_port(self) -> bool:
        if self.proc.poll() is not None:
            raise EmulatorStartError(self._failure(f"exited with {self.proc.returncode}"))
        try:
            text = self.port_file.read_text()
        except FileNotFoundError:
            return False
        if not text.endswith("\n"):
            return False
        self._port = int(text)
        return True

    def _failure(self, what: str) -> str:
        tail = self.read_log()[-2000:]
        return f"emulator {what}; command: {' '.join(self.command())}\nlog tail:\n{tail}"

    def start(self) -> Self:
        """Launch and wait (bounded) until ``/health`` answers 200."""
        self.launch()
        self.wait_ready()
        return self

    async def astart(self) -> Self:
        """:meth:`start` without blocking the event loop while waiting."""
        await asyncio.to_thread(self.launch)
        await apoll_until(self._ready, self.startup_timeout, what="/health 200")
        return self

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise EmulatorStartError(self._failure(f"exited with {self.proc.returncode}"))
        return self.health() == 200

    def wait_ready(self, timeout: float | None = None) -> None:
        try:
            poll_until(self._ready, timeout or self.startup_timeout, what="/health 200")
        except TimeoutError:
            self.kill()
            raise EmulatorStartError(self._failure("never answered /health 200")) from None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` s; returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        _LIVE.discard(self)
        code = proc.returncode
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return code

    async def astop(self, grace: float = 10.0) -> int | None:
        """:meth:`stop` off the event loop (``grace``: seconds before SIGKILL)."""
        return await asyncio.to_thread(self.stop, grace)

    def kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        _LIVE.discard(self)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.astop()

    # -- observation ---------------------------------------------------------------------

    def health(self, path: str = "/health") -> int | None:
        """The status of ``GET path``, or None when the connection is refused/reset."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        except (ConnectionError, OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def wait_exit(self, timeout: float = 15.0) -> int:
        """Wait (bounded) for the process to exit by itself; its exit code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"emulator still running after {timeout}s") from None

    async def await_exit(self, within: float = 15.0) -> int:
        await apoll_until(lambda: self.proc.poll() is not None, within, what="emulator exit")
        return self.proc.wait()

    def read_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def read_request_log(self) -> list[dict[str, Any]]:
        """Every complete line of the request log, parsed, in file order."""
        if self.request_log is None:
            raise RuntimeError("started with request_log=False")
        try:
            data = self.request_log.read_bytes()
        except FileNotFoundError:
            return []
        lines = data.split(b"\n")
        return [json.loads(line) for line in lines[:-1] if line]

    def events(self, kind: str) -> list[dict[str, Any]]:
        """Request-log lines of one ``event`` kind (``request``, ``trigger``, ...)."""
        return [e for e in self.read_request_log() if e["event"] == kind]

    def wait_log(self, text: str, timeout: float = 10.0) -> str:
        """Wait until the server log contains ``text``; the log."""
        found: list[str] = []

        def check() -> bool:
            log = self.read_log()
            found[:] = [log]
            return text in log

        poll_until(check, timeout, what=f"log line {text!r}")
        return found[0]

    def wait_events(self, kind: str, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until the request log has ``count`` events of ``kind``; all of them."""
        got: list[list[dict[str, Any]]] = [[]]

        def check() -> bool:
            got[0] = self.events(kind)
            return len(got[0]) >= count

        poll_until(check, timeout, what=f"{count} {kind!r} events")
        return got[0]

    async def await_events(
        self, kind: str, count: int, within: float = 10.0
    ) -> list[dict[str, Any]]:
        await apoll_until(lambda: len(self.events(kind)) >= count, within, what=f"{kind} events")
        return self.events(kind)


def poll_until(
    check: Callable[[], bool], timeout: float, *, interval: float = 0.01, what: str = "condition"
) -> None:
    """Call ``check`` until it is true; TimeoutError after ``timeout`` s. The
    loop is bounded in time and in iterations."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 2):
        if check():
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


async def apoll_until(
    check: Callable[[], bool], within: float, *, interval: float = 0.01, what: str = "condition"
) -> None:
    """Async :func:`poll_until` (``within``: the timeout in seconds)."""
    deadline = time.monotonic() + within
    for _ in range(int(within / interval) + 2):
        if check():
            return
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(interval)
    raise TimeoutError(f"timed out after {within}s waiting for {what}")
