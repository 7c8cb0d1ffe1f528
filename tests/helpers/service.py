"""What the service tests share: emulator launch commands, ``targets.toml``
files, a small trace, and a started ``replayer serve`` with a client."""

from __future__ import annotations

import shlex
import sys
import time

import httpx

from replayer.service.launcher import ServeProcess
from replayer.trace.synth import SynthOptions, write_trace

MODEL = "moonshotai/Kimi-K3"
TOKEN = "test-token-0123456789abcdef"


def emulator_cmd(port, *faults):
    args = [sys.executable, "-m", "replayer.emulator", "--port", str(port), "--speed", "instant"]
    for f in faults:
        args += ["--fault", f]
    return shlex.join(args)


def write_targets(path, targets):
    """``targets``: name -> dict of keys (strings quoted as TOML basic strings)."""
    lines = []
    for name, table in targets.items():
        lines.append(f"[targets.{name}]")
        for k, v in table.items():
            lines.append(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = """{v}"""')
    path.write_text("\n".join(lines) + "\n")
    return path


def small_trace(path, **kw):
    opts = dict(
        sessions=4, turns=5, context=8_000, rate=50, think=0.0, max_tokens=4, model=MODEL, seed=3
    )
    opts.update(kw)
    write_trace(path, SynthOptions(**opts))
    return path


class Serve:
    """A started ServeProcess and a client for it."""

    def __init__(self, proc: ServeProcess):
        self.proc = proc
        self.client = httpx.Client(base_url=proc.url, headers=proc.auth, timeout=30)

    @property
    def url(self):
        return self.proc.url

    def get(self, path, **kw):
        return self.client.get(path, **kw)

    def post(self, path, **kw):
        return self.client.post(path, **kw)

    def close(self):
        self.client.close()


FAULT = "exit after=0.2 when cached_tokens>=5000 and prompt_tokens>=7000"
"""The planted crash of the service's bisect tests: needs a cache hit."""
OPTIONS = {
    "timing": "asap",
    "settle": 3,
    "grace": 0.5,
    "health-interval": 0.1,
    "calibrate": 2,
    "calibrate-runs": 4,
    "confirm": 1,
    "stages": "calibrate,cut,prefix,sessions,turns",
}
"""A bisect job's options, quick on the emulator."""
TERMINAL = {"finished", "failed", "cancelled", "interrupted"}


def poll(fn, what, timeout=120.0):
    """Call ``fn`` until it returns a truthy value; bounded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.05)  # polling observable state (the job's status), bounded above
    raise AssertionError(f"timed out waiting for {what}")
