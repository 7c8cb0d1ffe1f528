"""The runtime owns the effects, and the dependency goes one way: effects act
on a :class:`~replayer.emulator.effects.Host`, which the runtime is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from replayer.emulator import effects
from replayer.emulator.config import EmulatorConfig
from replayer.emulator.effects import Host
from replayer.emulator.faults import parse_spec
from replayer.emulator.runtime import Runtime

pytestmark = pytest.mark.inprocess


def test_effects_do_not_import_the_runtime():
    tree = ast.parse(Path(effects.__file__).read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "replayer.emulator.runtime" not in modules


async def test_a_crash_through_the_host_schedules_the_exit():
    rt = Runtime(EmulatorConfig(seed=1), log_stdout=False)
    host: Host = rt  # structural: mypy checks the runtime is a Host
    assert rt.effects.rt is host
    rt.effects.apply(parse_spec("exit code=3 after=30"), None, rt.engine.dump())
    assert rt.engine.dead and rt.exit_code == 3 and not rt.shutting_down
