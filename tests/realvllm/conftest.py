"""What the real-vLLM tier's tests share: the CLI as a user runs it, and small
traces sized for a tiny model on two cores (vocabulary 8,192, contexts under
the servers' 16,384-token limit, short replies)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

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


@pytest.fixture(scope="session")
def traces(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> dict[str, Path]:
    """Small traces: ``chat`` (agent sessions with tools), ``blocks``
    (token-id prompts sharing prefixes), ``tau2`` (the real tau2-bench
    sessions), ``ordered`` (long prompts then short ones, for admission order)."""
    d = tmp_path_factory.mktemp("traces")
    chat = synth(
        d / "chat.arrow",
        *("--sessions", 4, "--turns", 4, "--context", 3000, "--system-tokens", 500),
        *("--max-tokens", 16, "--seed", 1),
    )
    blocks = synth(
        d / "blocks.arrow",
        *("--sessions", 4, "--turns", 5, "--context", 4000, "--system-tokens", 500),
        *("--payload", "blocks", "--max-tokens", 8, "--seed", 2),
    )
    tau2 = d / "tau2.arrow"
    src = sorted((shared_data / "tau2_bench").glob("*.json.gz"))
    res = cli("import", "tau2-bench", *src, "-o", tau2, timeout=120)
    assert res.returncode == 0, res.stderr
    return {"chat": chat, "blocks": blocks, "tau2": tau2}
