"""The real-vLLM tier's fixture: small traces made once per session, sized
for a tiny model on two cores (the helpers are in tests/helpers/realvllm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.realvllm import cli, synth


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
