"""Bodies built off the loop: ahead in plan order within a byte budget, asked
for ones first, live-dependent ones only when asked, errors delivered to the
dispatcher; inline on a virtual clock. The evidence is the worker's own log
of what it built, in order, read once it is blocked on the budget."""

from __future__ import annotations

import threading

import pytest

from replayer.replay.bodies import Bodies

pytestmark = pytest.mark.inprocess


class Builder:
    def __init__(self, size: int = 10, fail: int | None = None) -> None:
        self.order: list[int] = []
        self.threads: set[str] = set()
        self.size, self.fail = size, fail

    def __call__(self, i: int) -> bytes:
        self.order.append(i)
        self.threads.add(threading.current_thread().name)
        if i == self.fail:
            raise ValueError(f"row {i} is corrupt")
        return b"%d:" % i + b"x" * self.size


async def test_bodies_are_built_ahead_in_plan_order_until_the_budget_is_full() -> None:
    build = Builder()
    bodies = Bodies(build, [True] * 8, ahead_bytes=25)
    try:
        await bodies.warm(8, within=30)
        assert build.order == [0, 1, 2]  # 36 bytes >= 25: the worker waits
        assert await bodies.get(0) == b"0:" + b"x" * 10
        assert await bodies.get(1) == b"1:" + b"x" * 10
        # 12 bytes left, under the low water (75% of 25): it resumes, and
        # fills the budget again
        await bodies.warm(8, within=30)
        assert build.order == [0, 1, 2, 3, 4]
        assert [await bodies.get(i) for i in range(2, 8)] == [
            b"%d:" % i + b"x" * 10 for i in range(2, 8)
        ]
        assert build.order == list(range(8))  # each built once
        assert build.threads == {"replayer-bodies"}
    finally:
        bodies.close()


async def test_a_body_that_waits_for_live_replies_is_built_only_when_asked() -> None:
    build = Builder()
    bodies = Bodies(build, [True, False, True, True], ahead_bytes=1 << 20)
    try:
        await bodies.warm(4, within=30)
        assert build.order == [0, 2, 3]
        assert await bodies.get(1) == b"1:" + b"x" * 10
        assert build.order == [0, 2, 3, 1]
    finally:
        bodies.close()


async def test_asked_for_bodies_go_first_and_skipped_ones_free_the_budget() -> None:
    build = Builder()
    bodies = Bodies(build, [True] * 6, ahead_bytes=12)
    try:
        await bodies.warm(6, within=30)
        assert build.order == [0]
        assert await bodies.get(4) == b"4:" + b"x" * 10  # out of order: built now
        bodies.discard(0)  # skipped (over context): its bytes are freed
        await bodies.warm(6, within=30)
        assert build.order == [0, 4, 1]
        for i in (1, 2, 3, 5):
            await bodies.get(i)
        assert build.order == [0, 4, 1, 2, 3, 5]  # 4 is never built twice
    finally:
        bodies.close()


async def test_a_build_error_reaches_the_dispatcher() -> None:
    bodies = Bodies(Builder(fail=1), [True] * 3, ahead_bytes=1 << 20)
    try:
        assert await bodies.get(0)
        with pytest.raises(ValueError, match="row 1 is corrupt"):
            await bodies.get(1)
        assert await bodies.get(2)  # the worker goes on
    finally:
        bodies.close()


async def test_inline_on_a_virtual_clock() -> None:
    build = Builder()
    bodies = Bodies(build, [True] * 3, ahead_bytes=1 << 20, threaded=False)
    assert await bodies.warm(3, within=30) == 0
    assert build.order == []
    assert await bodies.get(2) == b"2:" + b"x" * 10
    assert build.order == [2] and build.threads == {threading.current_thread().name}
    bodies.close()


async def test_only_bodies_due_soon_are_built_ahead() -> None:
    """Bodies due within the horizon of the schedule's now; the rest once the
    schedule reaches them (here: a T0 ten seconds ago, so all are due)."""
    import time

    build = Builder()
    bodies = Bodies(build, [True] * 4, ahead_bytes=1 << 20, due=[0, 0.5, 5, 6], horizon=1.0)
    try:
        await bodies.warm(4, within=30)
        assert build.order == [0, 1]  # before T0 the schedule's now is 0
        bodies.start(time.monotonic() - 10)
        assert [await bodies.get(i) for i in range(4)] == [b"%d:" % i + b"x" * 10 for i in range(4)]
        assert build.order == [0, 1, 2, 3]
    finally:
        bodies.close()
