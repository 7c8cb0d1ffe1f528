"""The emulator tests' fixture: a module-scoped emulator for stateless wire
checks (the request/SSE helpers are in tests/helpers/emulator.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from replayer.testing.emulator import EmulatorProcess


@pytest.fixture(scope="module")
def shared_emulator(tmp_path_factory) -> Iterator[EmulatorProcess]:
    """One instant emulator for checks that do not depend on engine state."""
    emu = EmulatorProcess(
        ["--speed", "instant", "--max-model-len", "1000"],
        workdir=tmp_path_factory.mktemp("shared-emulator"),
    )
    with emu:
        yield emu
