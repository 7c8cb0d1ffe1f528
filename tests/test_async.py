"""Tasks that cannot be lost: ``spawn`` names every task and holds it until it
is done, an exception that escapes one is logged once, and ``wait_event``
returns as soon as its event is set."""

from __future__ import annotations

import asyncio
import logging

import pytest

from replayer._async import live_tasks, spawn, wait_event

pytestmark = pytest.mark.inprocess


async def test_a_spawned_task_is_named_and_held_until_done():
    release = asyncio.Event()

    async def work() -> int:
        await release.wait()
        return 7

    task = spawn(work(), name="replay.dispatch[mi355]")
    assert task.get_name() == "replay.dispatch[mi355]"
    assert task in live_tasks()
    release.set()
    assert await task == 7
    # its done callback ran before the awaiting code resumed (added first)
    assert task not in live_tasks()


async def test_an_escaping_exception_is_logged_once(caplog):
    async def boom() -> None:
        raise RuntimeError("scrape failed")

    with caplog.at_level(logging.ERROR, logger="replayer._async"):
        task = spawn(boom(), name="monitor.scrape")
        with pytest.raises(RuntimeError):
            await task
    assert [(r.getMessage(), r.exc_info[1].args) for r in caplog.records] == [
        ("task monitor.scrape failed", ("scrape failed",))
    ]


async def test_a_cancelled_task_is_not_an_error(caplog):
    task = spawn(asyncio.Event().wait(), name="idle")
    task.cancel()
    with (
        caplog.at_level(logging.ERROR, logger="replayer._async"),
        pytest.raises(asyncio.CancelledError),
    ):
        await task
    assert caplog.records == [] and task not in live_tasks()


async def test_wait_event_returns_when_set_or_after_its_time():
    event = asyncio.Event()
    assert await wait_event(event, 0) is False
    event.set()
    assert await wait_event(event, 3600) is True  # set: no wait at all
