"""The target tests' fixture: emulators launched as LaunchedTargets on free
ports, always stopped (the helpers are in tests/helpers/target.py)."""

from __future__ import annotations

import pytest

from replayer.target import LaunchedTarget
from tests.helpers.net import free_port
from tests.helpers.target import MODEL, emulator_cmd


@pytest.fixture
async def launched(tmp_path):
    """``make(cmd_args, **kw)`` -> a LaunchedTarget on a free port, stopped at teardown."""
    made: list[LaunchedTarget] = []

    def make(
        *args: str, load_time: float = 0.0, env=None, port: int | None = None, **kw
    ) -> LaunchedTarget:
        port = free_port() if port is None else port
        t = LaunchedTarget(
            emulator_cmd(port, *args, load_time=load_time),
            f"http://127.0.0.1:{port}",
            tmp_path / f"run{len(made)}" / "server.log",
            env=env,
            model=kw.pop("model", MODEL),
            stop_grace=kw.pop("stop_grace", 5.0),
            **kw,
        )
        made.append(t)
        return t

    yield make
    for t in made:
        await t.stop()
