"""The pool lends each server to one trial at a time, refreshes a used one in
the background while the others go on, retires a server that will not start
with its reason, and never leaves a waiter asleep beside a free server (a
cancelled trial gives its server back from a ``finally``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from replayer._async import spawn
from replayer.errors import LaunchError
from replayer.session.pool import MAX_FAILURES, Pool, PoolExhausted, SlotState
from replayer.session.slot import Slot
from replayer.testing import VirtualClock

pytestmark = pytest.mark.inprocess


@dataclass
class _Target:
    url: str
    stopped: int = 0

    async def stop(self) -> None:
        self.stopped += 1


@dataclass(eq=False)
class FakeSlot(Slot):
    """A server that takes ``start`` virtual seconds to launch and restart,
    and fails its launch while ``broken`` says so (with Slurm's words)."""

    clock: VirtualClock = field(default_factory=VirtualClock)
    start: float = 60.0
    broken: int = 0
    launches: int = 0
    resets: int = 0

    async def _prepare(self) -> None:
        if not self.started or self.needs_restart:
            self.launches += 1
            await self.clock.sleep(self.start)
            if self.broken:
                self.broken -= 1
                raise LaunchError(f"job pending: (ReqNodeNotAvail) on {self.url}\nmore")
            self.started, self.needs_restart = True, False
            return
        self.resets += 1


def slots(n: int, clock: VirtualClock, **kw: int) -> list[FakeSlot]:
    return [FakeSlot(_Target(f"http://s{i}"), clock=clock, **kw) for i in range(n)]  # type: ignore[arg-type]


async def _trial(pool: Pool, number: int, *, crash: bool = False) -> str:
    """One trial as the session's runner runs it on a pool."""
    async with pool.lease(number) as slot:
        try:
            await slot.prepare()
        except LaunchError as exc:
            pool.note_failure(slot, str(exc))
            raise
        pool.note_started(slot)
        if crash:
            slot.needs_restart = True
        return slot.url


async def test_each_server_runs_one_trial_at_a_time():
    clock = VirtualClock()
    pool = Pool(slots(2, clock))
    holding: list[str] = []
    release = asyncio.Event()

    async def hold(n: int) -> None:
        async with pool.lease(n) as slot:
            holding.append(slot.url)
            await release.wait()

    tasks = [spawn(hold(n), name=f"hold-{n}") for n in range(3)]
    await clock.settle()
    assert sorted(holding) == ["http://s0", "http://s1"]  # the third waits
    assert [s["state"] for s in pool.states()] == ["running", "running"]
    assert {s["trial"] for s in pool.states()} == {0, 1}
    release.set()
    await asyncio.gather(*tasks)
    assert len(holding) == 3


async def test_a_crashed_server_restarts_in_the_background_while_the_other_runs():
    clock = VirtualClock()
    pool = Pool(slots(2, clock, start=900.0))
    # both start (900 s), one crashes
    assert set(await asyncio.gather(_trial(pool, 1, crash=True), _trial(pool, 2))) == {
        "http://s0",
        "http://s1",
    }
    t_crash = clock.now()
    assert [s["state"] for s in pool.states()] == ["restarting", "ready"]
    # the next trials take the ready server at once, not the restarting one
    assert await _trial(pool, 3) == "http://s1"
    assert await _trial(pool, 4) == "http://s1"
    assert clock.now() == t_crash
    # the restart ran meanwhile: done 900 s later, and the server is lent again
    await clock.advance(900.0)
    assert [s["state"] for s in pool.states()] == ["ready", "ready"]
    assert pool.slots[0].launches == 2  # type: ignore[attr-defined]


async def test_a_server_that_will_not_start_is_retired_with_its_reason():
    clock = VirtualClock()
    bad, good = slots(2, clock)
    bad.broken = MAX_FAILURES
    pool = Pool([bad, good])
    urls = []
    for n in range(4):
        try:
            urls.append(await _trial(pool, n))
        except LaunchError:
            urls.append("launch failed")
    await clock.settle()  # its background relaunch has failed too
    # the broken server was tried until retired; its trials failed, the rest ran
    assert pool.usable == 1
    state = pool.states()[0]
    assert state["state"] == "failed"
    assert state["reason"] == "job pending: (ReqNodeNotAvail) on http://s0"
    assert urls.count("http://s1") >= 2


async def test_an_exhausted_pool_names_every_servers_reason():
    clock = VirtualClock()
    pool = Pool(slots(2, clock, broken=9))
    for n in range(2 * MAX_FAILURES):
        with pytest.raises(LaunchError):
            await _trial(pool, n)
        await clock.settle()
    with pytest.raises(PoolExhausted) as err:
        await _trial(pool, 99)
    assert "server 0: job pending: (ReqNodeNotAvail) on http://s0" in str(err.value)
    assert "server 1: job pending: (ReqNodeNotAvail) on http://s1" in str(err.value)


async def test_a_cancelled_trial_gives_its_server_back_and_wakes_a_waiter():
    clock = VirtualClock()
    pool = Pool(slots(1, clock, start=0.0))
    await _trial(pool, 0)  # started and ready
    entered = asyncio.Event()

    async def stuck() -> None:
        async with pool.lease(1):
            entered.set()
            await asyncio.Event().wait()

    holder = spawn(stuck(), name="stuck")
    await entered.wait()
    waiter = spawn(_trial(pool, 2), name="waiter")
    await clock.settle()
    assert not waiter.done()
    holder.cancel()
    # the cancelled trial left requests in its server: reset before it is lent
    assert await asyncio.wait_for(waiter, 5) == "http://s0"
    assert pool.slots[0].resets == 1  # type: ignore[attr-defined]


async def test_close_stops_every_server_and_its_restart():
    clock = VirtualClock()
    pool = Pool(slots(2, clock, start=900.0))
    await asyncio.gather(_trial(pool, 1, crash=True), _trial(pool, 2))
    assert pool.states()[0]["state"] == SlotState.RESTARTING
    await pool.aclose()
    assert [s["state"] for s in pool.states()] == ["stopped", "stopped"]
    assert not any(s.started for s in pool.slots)
    assert [s.target.stopped for s in pool.slots] == [1, 1]  # type: ignore[attr-defined]


async def test_the_state_file_says_what_each_server_does(tmp_path):
    import json

    clock = VirtualClock()
    state = tmp_path / "servers.json"
    pool = Pool(slots(2, clock, start=900.0), state_file=state)

    def read():
        return [
            (s["server"], s["state"], s["trial"]) for s in json.loads(state.read_text())["servers"]
        ]

    async with pool.lease(7) as slot:
        assert read() == [(0, "running", 7), (1, "idle", None)]
        await slot.prepare()
        slot.needs_restart = True  # it crashed
    assert read() == [(0, "restarting", None), (1, "idle", None)]
    await clock.advance(900.0)
    assert read() == [(0, "ready", None), (1, "idle", None)]
    await pool.aclose()
    assert read() == [(0, "stopped", None), (1, "stopped", None)]
