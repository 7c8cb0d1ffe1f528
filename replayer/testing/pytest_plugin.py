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


# -- real vLLM (the CPU build, tiny local models) ---------------------------------------


@pytest.fixture(scope="session")
def vllm_env() -> Any:
    """The vLLM CPU environment, installed once into the user's cache; the
    test is skipped, with the one-line reason, where it cannot be."""
    from replayer.testing.vllm import VLLMUnavailable, provision

    try:
        return provision()
    except VLLMUnavailable as exc:
        pytest.skip(f"real vLLM unavailable: {exc}")


@pytest.fixture(scope="session")
def vllm_models(vllm_env: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny models (``llama``, ``dsv2``), built from code for this session."""
    from replayer.testing.vllm import build_models

    return build_models(vllm_env, tmp_path_factory.mktemp("vllm-models"))


@pytest.fixture
def vllm_factory(vllm_env: Any, vllm_models: dict[str, Path], tmp_path: Path) -> Iterator[Any]:
    """``vllm_factory(model="llama", extra=(), tools=True, environ={})`` starts a
    real vLLM for this test and returns it ready; all are stopped at teardown."""
    from replayer.testing.vllm import VLLMServer

    started: list[VLLMServer] = []

    def make(model: str = "llama", **kw: Any) -> VLLMServer:
        srv = VLLMServer(vllm_env, vllm_models[model], tmp_path / f"vllm{len(started)}.log", **kw)
        started.append(srv)
        return srv.start()

    yield make
    for srv in started:
        srv.stop()
