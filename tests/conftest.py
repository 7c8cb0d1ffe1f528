"""Shared fixtures. The real public traces live in ../shared/data beside the
checkout (CI puts them there); they are read in place, never copied."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["replayer.testing.pytest_plugin"]

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("REPLAYER_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA} (set REPLAYER_SHARED_DATA)")
    return SHARED_DATA
