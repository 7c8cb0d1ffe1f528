"""Shared fixtures. The real public traces live in ../shared/data beside the
checkout (CI puts them there); they are read in place, never copied.

The real-vLLM tier: every test that uses a real vLLM fixture (``vllm_env``
and what builds on it) is marked ``realvllm`` and runs after the rest, so
the servers it starts never share the two cores with the emulator tier.
One server, :func:`vllm_shared`, serves every test that does not kill it.
The summary ends with one line saying how many real-vLLM tests ran, or why
none could.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["replayer.testing.pytest_plugin"]

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("REPLAYER_SHARED_DATA", REPO.parent / "shared" / "data"))
VLLM_FIXTURES = frozenset({"vllm_env", "vllm_models", "vllm_factory", "vllm_shared"})


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA} (set REPLAYER_SHARED_DATA)")
    return SHARED_DATA


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


@pytest.fixture(scope="session")
def vllm_shared(
    vllm_env: Any, vllm_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedVLLM]:
    """A Llama on real vLLM as production agents need it: tool calling on,
    per-request cached tokens, dev mode (prefix-cache reset), 4 renderer
    workers (parallel templating, which reorders admission), and the plugin's
    admission record. Tests that stop it (SIGSTOP) resume it before they end."""
    from replayer.testing.vllm import VLLMServer

    d = tmp_path_factory.mktemp("vllm-shared")
    admission = d / "admission.jsonl"
    srv = VLLMServer(
        vllm_env,
        vllm_models["llama"],
        d / "server.log",
        extra=(
            "--enable-prompt-tokens-details",
            "--renderer-num-workers",
            "4",
            "--middleware",
            "replayer.testing.vllm_plugin.ReceiptMiddleware",
        ),
        environ={"VLLM_SERVER_DEV_MODE": "1", "REPLAYER_VLLM_ADMISSION_LOG": str(admission)},
        served_name="tiny-llama",
    )
    srv.start()
    try:
        yield SharedVLLM(srv, admission)
    finally:
        srv.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    real = [i for i in items if VLLM_FIXTURES & set(getattr(i, "fixturenames", ()))]
    for item in real:
        item.add_marker(pytest.mark.realvllm)
    ids = {id(i) for i in real}
    items[:] = [i for i in items if id(i) not in ids] + real


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Every real-vLLM test skipped for the same reason folds into one
    summary line (pytest would print one per test location)."""
    report = yield
    if report.skipped and "realvllm" in item.keywords and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if "real vLLM unavailable" in reason:
            report.longrepr = (__file__, sys._getframe().f_lineno, reason)
    return report


_TIER: Counter[str] = Counter()
_SKIPS: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "realvllm" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = "failed" if report.failed else report.outcome
        _TIER[outcome] += 1
        if report.skipped and isinstance(report.longrepr, tuple):
            _SKIPS.append(str(report.longrepr[2]))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _TIER:
        return
    parts = ", ".join(f"{n} {k}" for k, n in sorted(_TIER.items()))
    line = f"real vLLM tier: {parts}"
    if _SKIPS:
        line += f" ({Counter(_SKIPS).most_common(1)[0][0].removeprefix('Skipped: ')})"
    terminalreporter.write_line(line, bold=True)
