"""The ``replayer`` command as a user runs it: a real ``python -m replayer``
subprocess, and the shape of its usage errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "traces" / "agents-8x10.arrow"


def run(*args, env=None, timeout=120, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "replayer", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def assert_one_line_error(res, *fragments):
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
