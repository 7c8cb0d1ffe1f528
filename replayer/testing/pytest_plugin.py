"""pytest fixtures for the emulator subprocess.

``emulator_factory(args, **kw)`` starts an :class:`EmulatorProcess` in the
test's ``tmp_path`` and returns it once ``/health`` is 200; every process it
started is stopped at teardown, whatever the test did. ``emulator`` is one
instant-speed emulator with a request log.

Usage::

    def test_something(emulator_factory):
        emu = emulator_factory(["--speed", "instant", "--fault", "exit when request=2"])
        ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from replayer.testing.emulator import EmulatorProcess

EmulatorFactory = Callable[..., EmulatorProcess]


@pytest.fixture
def emulator_factory(tmp_path: Path) -> Iterator[EmulatorFactory]:
    started: list[EmulatorProcess] = []

    def make(args: Sequence[str] = (), *, start: bool = True, **kw: Any) -> EmulatorProcess:
        emu = EmulatorProcess(args, workdir=tmp_path / f"emulator{len(started)}", **kw)
        started.append(emu)
        return emu.start() if start else emu

    yield make
    for emu in started:
        emu.stop()


@pytest.fixture
def emulator(emulator_factory: EmulatorFactory) -> EmulatorProcess:
    return emulator_factory(["--speed", "instant"], log_bodies=True)
