"""The conformance suite's ``vllm`` half joins the real-vLLM tier.

Its tests are parametrized ``[emulator, vllm]`` through one fixture, so the
real-vLLM fixtures are requested dynamically and tests/conftest.py cannot
see them: here the ``vllm`` items get the ``realvllm`` marker and move to the
end of the run (in file order, so the death test stays last), where the real
servers do not share the two cores with the emulator tier.

It also holds what the suite's modules (test_wire.py, test_agent_apis.py)
share to start the servers a death test kills: both time the kill by the
server's watchdog, so both note when the port began accepting.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replayer.testing.emulator import EmulatorProcess, poll_until

BOUND = 60.0
"""Upper bound, in seconds, on any single wait here."""


def _real(item: pytest.Item) -> bool:
    spec = getattr(item, "callspec", None)
    return (
        spec is not None
        and "tests/conformance/" in item.nodeid.replace("\\", "/")
        and "vllm" in spec.params.values()
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    real = [i for i in items if _real(i)]
    for item in real:
        item.add_marker(pytest.mark.realvllm)
    ids = {id(i) for i in real}
    items[:] = [i for i in items if id(i) not in ids] + real


def accepting(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def watched_emulator(emu: EmulatorProcess) -> Iterator[EmulatorProcess]:
    """Run ``emu`` for a fixture (``yield from``), with ``listening_since``
    the ``time.monotonic()`` when its port began accepting."""
    emu.launch()  # bound, not yet listening
    poll_until(lambda: accepting(emu.port), BOUND, what="the emulator listening")
    emu.listening_since = time.monotonic()  # type: ignore[attr-defined]
    emu.wait_ready()
    try:
        yield emu
    finally:
        emu.stop()


def watched_vllm(vllm_env: Any, model: Path, log: Path, served_name: str) -> Iterator[Any]:
    """Run a dedicated real vLLM for a fixture (``yield from``): no tool
    flags, prompt-token details, ~100 tokens/s (the plugin's 10 ms a step),
    with ``listening_since`` noted by a thread that watches its port (vLLM's
    watchdog starts then, give or take its lifespan start-up)."""
    from replayer.testing.vllm import VLLMServer, free_port

    srv = VLLMServer(
        vllm_env,
        model,
        log,
        tools=False,
        extra=("--enable-prompt-tokens-details",),
        served_name=served_name,
        port=free_port(),
        environ={"REPLAYER_VLLM_FAULTS": "slow add=0.01 when step=1"},
    )
    seen: list[float] = []

    def watch() -> None:
        poll_until(lambda: accepting(srv.port), srv.startup_timeout, what="vLLM listening")
        seen.append(time.monotonic())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    srv.start()
    try:
        watcher.join(BOUND)
        srv.listening_since = seen[0] if seen else None
        yield srv
    finally:
        srv.stop()
