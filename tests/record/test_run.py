"""The recorder process's runtime tuning (replayer.record.run)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from replayer.record.run import event_loop_factory, tune_gc

pytestmark = pytest.mark.inprocess


def test_event_loop_factory_gives_a_working_loop_or_the_default():
    factory = event_loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        assert runner.run(asyncio.sleep(0, result=7)) == 7


def test_tune_gc_freezes_and_raises_the_young_threshold():
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold()[0] == 10_000
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
