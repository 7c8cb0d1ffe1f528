"""Readiness, resets between trials and facts, shared by every target kind,
against real emulator subprocesses."""

from __future__ import annotations

import logging
import signal

import httpx
import pytest

from replayer.errors import TargetError, UsageError
from replayer.target import ExitInfo, ExternalTarget, ResetMode, ResetResult, reset_mode
from tests.target.conftest import MODEL, chat

pytestmark = pytest.mark.e2e

NO_DEV_MODE = (
    "POST {url}/reset_prefix_cache answered 404: the server is not in dev mode "
    "(start it with VLLM_SERVER_DEV_MODE=1)"
)


async def cached_tokens(url: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        r = await c.post("/v1/chat/completions", json=chat(max_tokens=2))
    assert r.status_code == 200
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


async def test_prefix_cache_reset_in_dev_mode(launched):
    t = launched("--enable-prompt-tokens-details", env={"VLLM_SERVER_DEV_MODE": "1"})
    await t.start()
    await t.wait_ready(20)
    assert [await cached_tokens(t.url), await cached_tokens(t.url)] == [0, 48]
    res = await t.reset("prefix-cache")
    assert res == ResetResult(ResetMode.PREFIX_CACHE, ResetMode.PREFIX_CACHE, None)
    assert await cached_tokens(t.url) == 0
    assert t.launches == 1


async def test_prefix_cache_reset_without_dev_mode_restarts_a_launched_server(launched, caplog):
    t = launched("--enable-prompt-tokens-details")
    await t.start()
    await t.wait_ready(20)
    assert [await cached_tokens(t.url), await cached_tokens(t.url)] == [0, 48]
    note = NO_DEV_MODE.format(url=t.url)
    with caplog.at_level(logging.WARNING, logger="replayer.target"):
        first = await t.reset("prefix-cache")
        second = await t.reset(ResetMode.PREFIX_CACHE)
    assert first == second == ResetResult(ResetMode.PREFIX_CACHE, ResetMode.RESTART, note)
    assert [r.getMessage() for r in caplog.records] == [f"{note}; restarting instead"] * 2
    assert t.launches == 3
    assert await cached_tokens(t.url) == 0  # a fresh server: ready, cache empty
    # the missing endpoint is asked once, not before every trial
    assert t.log_file.read_text().count('"POST /reset_prefix_cache HTTP/1.1" 404') == 1


async def test_reset_restart_and_none(launched):
    t = launched()
    await t.start()
    await t.wait_ready(20)
    first = t.pid
    assert await t.reset("none") == ResetResult(ResetMode.NONE, ResetMode.NONE)
    assert t.pid == first
    assert await t.reset("restart") == ResetResult(ResetMode.RESTART, ResetMode.RESTART)
    assert t.pid != first and t.launches == 2
    async with httpx.AsyncClient(base_url=t.url) as c:
        assert (await c.get("/health")).status_code == 200


async def test_external_target_refuses_restart_and_warns_once(emulator_factory, caplog):
    emu = emulator_factory(["--speed", "instant"])
    t = ExternalTarget(emu.url, model=MODEL)
    assert t.can_restart is False
    assert t.alive() is None and t.exit_info is None
    await t.start()
    await t.wait_ready(10)
    refusal = (
        f"cannot restart the target at {emu.url}: it was given by URL alone; "
        "pass --launch CMD or --restart-cmd CMD to allow restarts"
    )
    with pytest.raises(TargetError) as err:
        await t.restart()
    assert str(err.value) == refusal
    with pytest.raises(TargetError, match="^cannot reset by restart the target at "):
        await t.reset("restart")
    note = NO_DEV_MODE.format(url=emu.url)
    with caplog.at_level(logging.WARNING, logger="replayer.target"):
        results = [await t.reset("prefix-cache") for _ in range(3)]
    assert results == [ResetResult(ResetMode.PREFIX_CACHE, ResetMode.NONE, note)] * 3
    assert [r.getMessage() for r in caplog.records] == [
        f"{note}; the prefix cache is NOT reset between trials"
    ]
    assert await t.stop() is None
    assert emu.health() == 200  # never ours to stop


async def test_external_prefix_reset_on_a_dead_server_is_an_error(emulator_factory):
    emu = emulator_factory(["--speed", "instant"], env={"VLLM_SERVER_DEV_MODE": "1"})
    t = ExternalTarget(emu.url)
    assert (await t.reset("prefix-cache")).performed is ResetMode.PREFIX_CACHE
    emu.stop()
    with pytest.raises(TargetError, match=r"^cannot reset the prefix cache of http://"):
        await t.reset("prefix-cache")


def test_reset_mode_parsing():
    assert reset_mode("prefix-cache") is ResetMode.PREFIX_CACHE
    with pytest.raises(UsageError) as err:
        reset_mode("flush")
    assert str(err.value) == "--reset 'flush': expected one of prefix-cache, restart, none"


def test_exit_info_from_returncode():
    assert ExitInfo.from_returncode(0, 5.0) == ExitInfo(0, None, 5.0)
    assert ExitInfo.from_returncode(-6, 5.0) == ExitInfo(None, signal.SIGABRT, 5.0)
    assert ExitInfo.from_returncode(-6, 5.0).text == "signal SIGABRT"
    assert ExitInfo(None, 99, 0.0).text == "signal 99"
    assert ExitInfo(1, None, 0.0).text == "code 1"
