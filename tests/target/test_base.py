"""Readiness, resets between trials and facts, shared by every target kind,
against real emulator subprocesses; then the readiness schedule on a
virtual clock, where the backoff and the timeout are exact."""

from __future__ import annotations

import asyncio
import logging
import signal

import httpx
import pytest

from replayer._async import spawn
from replayer.errors import LaunchError, OptionError, TargetError
from replayer.target import ExitInfo, ExternalTarget, ResetMode, ResetResult, reset_mode
from replayer.target.base import NotReady, ServerTarget
from replayer.testing import VirtualClock
from tests.helpers.target import MODEL, chat

pytestmark = pytest.mark.e2e

READY = 120.0
"""A bound on an emulator's start: generous for a loaded machine, never
reached when things work."""

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
    await t.wait_ready(READY)
    assert [await cached_tokens(t.url), await cached_tokens(t.url)] == [0, 48]
    res = await t.reset("prefix-cache")
    assert res == ResetResult(ResetMode.PREFIX_CACHE, ResetMode.PREFIX_CACHE, None)
    assert await cached_tokens(t.url) == 0
    assert t.launches == 1


async def test_prefix_cache_reset_without_dev_mode_restarts_a_launched_server(launched, caplog):
    t = launched("--enable-prompt-tokens-details")
    await t.start()
    await t.wait_ready(READY)
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
    await t.wait_ready(READY)
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
    await t.wait_ready(READY)
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
    with pytest.raises(OptionError) as err:
        reset_mode("flush")
    # the library names the parameter; the CLI says --reset (tests/cli)
    assert (err.value.param, str(err.value)) == (
        "reset",
        "reset 'flush': want one of prefix-cache, restart, none",
    )


def test_exit_info_from_returncode():
    assert ExitInfo.from_returncode(0, 5.0) == ExitInfo(0, None, 5.0)
    assert ExitInfo.from_returncode(-6, 5.0) == ExitInfo(None, signal.SIGABRT, 5.0)
    assert ExitInfo.from_returncode(-6, 5.0).text == "signal SIGABRT"
    assert ExitInfo(None, 99, 0.0).text == "signal 99"
    assert ExitInfo(1, None, 0.0).text == "code 1"


# -- readiness on a virtual clock: the schedule, exactly ------------------------------


class Loading(ServerTarget):
    """A server that is not ready until ``ready_at`` (clock time; None:
    never), whose process may exit at ``exits_at``; probes are logged."""

    def __init__(self, clock, *, ready_at=None, exits_at=None):
        super().__init__("http://loading", clock=clock)
        self.ready_at, self.exits_at = ready_at, exits_at
        self.probes: list[tuple[float, float]] = []
        self.exited = asyncio.Event()
        if exits_at is not None:
            self.exiting = spawn(self._exit(), name="exit")

    async def _exit(self):
        await self.clock.sleep_until(self.exits_at)
        self.exited.set()

    def alive(self):
        return not self.exited.is_set()

    def _exit_event(self):
        return self.exited

    def _check_loading(self):
        if self.exited.is_set():
            raise LaunchError("exited while loading")

    async def _probe(self, client, within):
        self.probes.append((self.clock.now(), within))
        if self.ready_at is None or self.clock.now() < self.ready_at:
            raise NotReady("connection refused or failed (planted)")


BACKOFF = [0.0, 0.1, 0.3, 0.7, 1.5, 3.1, 6.3, 11.3, 16.3]
"""Probe times: 0.1 s doubling, capped at 5 s."""


async def test_readiness_backs_off_and_times_out_exactly():
    clock = VirtualClock(limit=3600)
    t = Loading(clock)
    with pytest.raises(LaunchError) as err:
        await t.wait_ready(20.0)
    assert clock.now() == 20.0
    assert (
        str(err.value)
        == "http://loading not ready after 20s: connection refused or failed (planted)"
    )
    # the last probe comes at the deadline, with what is left of the budget (its floor)
    assert [at for at, _ in t.probes] == pytest.approx([*BACKOFF, 20.0])
    assert [within for _, within in t.probes] == pytest.approx([5.0] * 8 + [3.7, 0.05])


async def test_readiness_ends_at_the_first_probe_that_passes():
    clock = VirtualClock(limit=3600)
    t = Loading(clock, ready_at=2.0)
    await t.wait_ready(20.0)
    assert clock.now() == pytest.approx(3.1)
    assert len(t.probes) == 6


async def test_an_exit_while_loading_ends_the_wait_at_once():
    clock = VirtualClock(limit=3600)
    t = Loading(clock, exits_at=1.0)
    with pytest.raises(LaunchError, match="^exited while loading$"):
        await t.wait_ready(1800.0)
    assert clock.now() == 1.0  # not at the next probe (1.5 s), not at the timeout
    assert await t.exit_after(30.0) is None  # gone: no waiting


async def test_exit_after_waits_for_the_exit_or_its_bound():
    clock = VirtualClock(limit=3600)
    t = Loading(clock, exits_at=2.0)
    await t.exit_after(30.0)
    assert clock.now() == 2.0
    clock = VirtualClock(limit=3600)
    t = Loading(clock)
    await t.exit_after(30.0)
    assert clock.now() == 30.0
