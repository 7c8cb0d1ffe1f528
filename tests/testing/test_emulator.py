"""``replayer.testing.emulator``: start failures are reported, stops escalate
to SIGKILL, the async API works, and nothing is left running."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from replayer.testing.emulator import EmulatorProcess, EmulatorStartError
from tests.helpers.emulator import BOUND, Stream, chat

pytestmark = pytest.mark.e2e


def test_start_failure_carries_the_log_tail(tmp_path):
    emu = EmulatorProcess(["--fault", "boom"], workdir=tmp_path)
    with pytest.raises(EmulatorStartError) as err:
        emu.start()
    assert "exited with 2" in str(err.value) and "unknown effect 'boom'" in str(err.value)
    assert emu.returncode == 2


async def test_async_context_manager_and_cleanup():
    async with EmulatorProcess(["--speed", "instant"], log_bodies=True) as emu:
        assert emu.url == f"http://127.0.0.1:{emu.port}" and emu.health() == 200
        async with asyncio.timeout(BOUND), httpx.AsyncClient(base_url=emu.url) as c:
            r = await c.post("/v1/chat/completions", json=chat(max_tokens=2))
        assert r.status_code == 200
        (line,) = await emu.await_events("request", 1)
        assert line["body"] == chat(max_tokens=2)
        workdir = emu.workdir
    assert emu.returncode == 0 and not workdir.exists()


async def test_stop_escalates_to_sigkill_when_shutdown_hangs(tmp_path):
    # A hung engine never finishes its stream, so the graceful shutdown waits.
    emu = EmulatorProcess(["--fault", "hang"], workdir=tmp_path)
    await emu.astart()
    s = Stream()
    async with (
        asyncio.timeout(BOUND),
        httpx.AsyncClient(base_url=emu.url, timeout=30) as c,
        asyncio.TaskGroup() as tg,
    ):
        task = tg.create_task(s.run(c, "/v1/chat/completions", chat(stream=True)))
        await emu.await_events("effect", 1)
        assert await emu.astop(grace=0.5) == -9
        task.cancel()
    assert emu.returncode == -9
