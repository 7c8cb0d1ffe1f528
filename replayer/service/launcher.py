"""``replayer serve`` as a real subprocess, for tests and benchmarks.

A subprocess because the acceptance is about the real thing: a service that
is killed and restarted, workers that die with it, a port bound on
127.0.0.1. The port comes back through ``--port-file`` (no port races);
:meth:`ServeProcess.start` returns once ``/healthz`` answers, within a
bounded time. Every wait is a bounded poll of an observable condition.

Usage::

    with ServeProcess(data, targets=toml, token="t" * 32) as srv:
        r = httpx.get(f"{srv.url}/api/jobs", headers=srv.auth)
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self


class ServeStartError(RuntimeError):
    """serve exited, or did not answer /healthz in time."""


class ServeProcess:
    """One ``replayer serve`` on ``127.0.0.1`` (see the module docstring)."""

    def __init__(
        self,
        data: Path,
        *,
        targets: Path | None = None,
        token: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 30.0,
        log_path: Path | None = None,
    ) -> None:
        self.data = data
        self.targets = targets
        self.token = token
        self.args = list(args)
        self.env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.log_path = log_path or data.parent / f"{data.name}-serve.log"
        self.port_file = data.parent / f".{data.name}-serve.port"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "replayer", "serve", "--data", str(self.data)]
        cmd += ["--port", "0", "--port-file", str(self.port_file)]
        if self.targets is not None:
            cmd += ["--targets", str(self.targets)]
        return cmd + self.args

    def start(self) -> Self:
        self.port_file.unlink(missing_ok=True)
        env = {**os.environ, **self.env}
        if self.token is not None:
            env["REPLAYER_SERVE_TOKEN"] = self.token
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServeStartError(f"serve exited with {self.proc.returncode}: {self.log()}")
            if self.port is None and self.port_file.exists():
                text = self.port_file.read_text().strip()
                self.port = int(text) if text else None
            if self.port is not None and self._healthy():
                return self
            time.sleep(0.05)  # bounded poll of the port file and /healthz
        self.kill()
        raise ServeStartError(f"serve did not become healthy: {self.log()}")

    def _healthy(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.port or 0, timeout=2)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (serve stops its workers), then SIGKILL after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL: the crash case (workers die with serve)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
