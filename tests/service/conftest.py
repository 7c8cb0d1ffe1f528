"""Fixtures for the service tests: a real ``replayer serve`` subprocess on
127.0.0.1 with a data directory, a ``targets.toml`` whose targets are
emulator launch commands, and an httpx client carrying the token."""

from __future__ import annotations

import pytest

from replayer.service.launcher import ServeProcess
from tests.helpers.service import TOKEN, Serve


@pytest.fixture
def serve_factory(tmp_path):
    started = []

    def make(data=None, targets=None, token=TOKEN, args=(), **kw):
        data = data or tmp_path / "data"
        data.mkdir(parents=True, exist_ok=True)
        proc = ServeProcess(data, targets=targets, token=token, args=args, **kw)
        started.append(proc)
        proc.start()
        return Serve(proc)

    yield make
    for p in started:
        p.stop(timeout=60)
