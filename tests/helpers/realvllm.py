"""What the real-vLLM tier shares: the session's shared server (what the
``vllm_shared`` fixture yields), the CLI as a user runs it, and small traces
sized for a tiny model on two cores (vocabulary 8,192, contexts under the
servers' 16,384-token limit, short replies)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

VOCAB = 8192
TOKEN_RANGE = f"100:{VOCAB}"
"""Block token ids inside the tiny models' vocabulary."""


def cli(*args: Any, timeout: float = 600, env: dict[str, str] | None = None) -> Any:
    """``replayer ARGS`` in a subprocess, bounded."""
    return subprocess.run(
        [sys.executable, "-m", "replayer", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def summary(run: Path) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads((run / "summary.json").read_bytes())
    return out


def synth(out: Path, *args: Any) -> Path:
    res = cli("synth", "-o", out, "--force", *args, timeout=120)
    assert res.returncode == 0, res.stderr
    return out


class SharedVLLM:
    """The session's shared real vLLM and what it records about admission."""

    def __init__(self, server: Any, admission_log: Path) -> None:
        self.server = server
        self.admission_log = admission_log

    @property
    def url(self) -> str:
        return str(self.server.url)

    @property
    def model(self) -> str:
        return str(self.server.model_name)

    def reset_prefix_cache(self) -> None:
        status, body = self.server.post("/reset_prefix_cache", {})
        assert status == 200, body
