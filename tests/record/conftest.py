"""The recorder tests' fixtures: a started fake upstream
(:class:`tests.helpers.record.FakeUpstream`), and a factory for in-process
recording proxies that are always stopped (trace closed) at teardown."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from replayer.record.proxy import RecordConfig, RecordingProxy
from tests.helpers.record import FakeUpstream


@pytest.fixture
async def fake_upstream() -> AsyncIterator[FakeUpstream]:
    up = await FakeUpstream().start()
    yield up
    await up.stop()


@pytest.fixture
async def proxy_factory(tmp_path: Path) -> AsyncIterator[Any]:
    started: list[RecordingProxy] = []

    async def make(upstream: str, name: str = "rec.arrow", **kw: Any) -> RecordingProxy:
        kw.setdefault("flush_interval", 0.2)
        cfg = RecordConfig(upstream=upstream, output=tmp_path / name, port=0, **kw)
        proxy = RecordingProxy(cfg)
        started.append(proxy)
        return await proxy.start()

    yield make
    for p in started:
        await p.stop()
