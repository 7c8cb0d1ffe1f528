"""Shared fixtures and the hooks of the tiers. The real public traces live in
../shared/data beside the checkout (CI puts them there); they are read in
place, never copied. Helpers are in tests/helpers/, never here.

Four tiers, run in this order: the in-process tier (modules marked
``inprocess``: no subprocess, no socket past loopback, held to it by
tests/helpers/inprocess.py; ``make test-fast`` runs it alone, in under a
minute), the emulator tier (everything not marked; with the in-process
tier kept under 10 minutes on 2 cores), the ``slow`` tier (end-to-end bisects and
resumes that take tens of seconds each), and the real-vLLM tier: every test
that uses a real vLLM fixture (``vllm_env`` and what builds on it) is marked
``realvllm`` and runs last, so the servers it starts never share the two
cores with the other tiers. ``make test`` runs the first three on two
pytest-xdist workers, then the real-vLLM tier alone, in a second pytest.
One server, :func:`vllm_shared`, serves every test that does not kill it.
The summary ends with one line per tier: what ran, how long it took
(setup, call and teardown summed), and for the
real-vLLM tier why none could run when none could.
"""

from __future__ import annotations

import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.helpers.realvllm import SharedVLLM

# the helpers' asserts explain themselves as a test's do (they were written as
# part of test files and conftests, which pytest rewrites)
pytest.register_assert_rewrite("tests.helpers")

pytest_plugins = ["replayer.testing.pytest_plugin", "tests.helpers.inprocess"]

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("REPLAYER_SHARED_DATA", REPO.parent / "shared" / "data"))
VLLM_FIXTURES = frozenset({"vllm_env", "vllm_models", "vllm_factory", "vllm_shared"})


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA} (set REPLAYER_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def vllm_shared(
    vllm_env: Any, vllm_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedVLLM]:
    """A Llama on real vLLM as production agents need it: tool calling on,
    per-request cached tokens, dev mode (prefix-cache reset), 4 renderer
    workers (parallel templating, which reorders admission), the Responses
    store (for previous_response_id chains; vLLM's answers without a store
    are checked on the conformance suite's own server), and the plugin's
    admission record. Tests that stop it (SIGSTOP) resume it before they end."""
    from replayer.testing.vllm import VLLMServer
    from tests.helpers.realvllm import SharedVLLM

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
        environ={
            "VLLM_SERVER_DEV_MODE": "1",
            "REPLAYER_VLLM_ADMISSION_LOG": str(admission),
            # Responses chained by previous_response_id (the agent tests)
            "VLLM_ENABLE_RESPONSES_API_STORE": "1",
        },
        served_name="tiny-llama",
    )
    srv.start()
    try:
        yield SharedVLLM(srv, admission)
    finally:
        srv.stop()


TIERS = ("inprocess", "emulator", "slow", "slurm", "realvllm")
TIER_NAMES = {
    "inprocess": "in-process tier",
    "emulator": "emulator tier",
    "slow": "slow tier",
    "slurm": "Slurm tier",
    "realvllm": "real vLLM tier",
}
UNAVAILABLE = {"realvllm": "real vLLM unavailable", "slurm": "Slurm unavailable"}
"""How a skipped tier's reason begins (the fixture that could not provide it says so)."""
TIER_BUDGET_S = {"inprocess": 60.0, "emulator": 600.0}
"""The budgets on an idle 2-core machine (figures to read in the summary,
never assertions: a loaded machine takes longer)."""


def _tier(item: pytest.Item | pytest.TestReport) -> str:
    keys = item.keywords
    for t in ("realvllm", "slurm", "slow", "inprocess"):
        if t in keys:
            return t
    return "emulator"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if VLLM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.realvllm)
    items.sort(key=lambda i: TIERS.index(_tier(i)))  # stable: file order within a tier


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Every real-vLLM (or Slurm) test skipped for the same reason folds into
    one summary line (pytest would print one per test location)."""
    report = yield
    tier = _tier(item)
    if report.skipped and tier in UNAVAILABLE and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if UNAVAILABLE[tier] in reason:
            report.longrepr = (__file__, sys._getframe().f_lineno, reason)
    return report


_TIER: dict[str, Counter[str]] = defaultdict(Counter)
_SECONDS: Counter[str] = Counter()
_SKIPS: dict[str, list[str]] = defaultdict(list)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    t = _tier(report)
    _SECONDS[t] += report.duration
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = "failed" if report.failed else report.outcome
        _TIER[t][outcome] += 1
        if t in UNAVAILABLE and report.skipped and isinstance(report.longrepr, tuple):
            _SKIPS[t].append(str(report.longrepr[2]))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    workers = terminalreporter.config.getoption("numprocesses", None)
    for t in TIERS:
        if not _TIER[t]:
            continue
        parts = ", ".join(f"{n} {k}" for k, n in sorted(_TIER[t].items()))
        line = f"{TIER_NAMES[t]}: {parts} in {_SECONDS[t]:.0f} s"
        if workers:
            line += f" of test time over {workers} workers"
        elif t in TIER_BUDGET_S:
            line += f" (budget {TIER_BUDGET_S[t]:.0f} s on an idle 2-core machine)"
        if _SKIPS[t]:
            line += f" ({Counter(_SKIPS[t]).most_common(1)[0][0].removeprefix('Skipped: ')})"
        terminalreporter.write_line(line, bold=True)
