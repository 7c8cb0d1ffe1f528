"""The simulated block pool: allocation, reference counts, the prefix index and
vLLM's LRU eviction order."""

from __future__ import annotations

import pytest

from replayer.emulator.kvcache import BlockPool

pytestmark = pytest.mark.inprocess


def h(i: int) -> bytes:
    return bytes([i]) * 16


def test_allocate_until_full_then_none():
    pool = BlockPool(4, 16)
    a = pool.allocate(3)
    assert a is not None and [b.ref for b in a] == [1, 1, 1]
    assert pool.num_used == 3 and pool.usage == 0.75
    assert pool.allocate(2) is None
    assert pool.allocate(1) is not None and pool.usage == 1.0


def test_freed_registered_blocks_stay_cached_until_reused():
    pool = BlockPool(4, 16)
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.register(blocks[0], h(1))
    pool.register(blocks[1], h(2))
    pool.free(blocks)
    assert pool.num_used == 0 and pool.num_cached == 2
    assert pool.lookup([h(1), h(2), h(3)]) == blocks  # stops at the first miss
    assert pool.lookup([h(3), h(1)]) == []


def test_touch_pins_cached_blocks_and_counts_them_as_used():
    pool = BlockPool(4, 16)
    blocks = pool.allocate(1)
    assert blocks is not None
    pool.register(blocks[0], h(1))
    pool.free(blocks)
    hit = pool.lookup([h(1)])
    pool.touch(hit)
    pool.touch(hit)
    assert hit[0].ref == 2 and pool.num_used == 1
    pool.free(hit)
    assert pool.num_used == 1
    pool.free(hit)
    assert pool.num_used == 0


def test_eviction_takes_never_used_blocks_first_then_lru_and_tail_first():
    pool = BlockPool(4, 16)
    first = pool.allocate(2)
    assert first is not None
    for i, b in enumerate(first):
        pool.register(b, h(i))
    pool.free(first)  # tail-first: block for h(1) joins the queue before h(0)
    fresh = pool.allocate(2)  # the two never-used blocks go first
    assert fresh is not None and pool.num_cached == 2
    pool.allocate(1)  # now the LRU head: the prompt's tail, h(1)
    assert pool.lookup([h(0)]) == [first[0]] and pool.lookup([h(0), h(1)]) == [first[0]]
    pool.allocate(1)
    assert pool.lookup([h(0)]) == [] and pool.num_cached == 0


def test_duplicate_hash_keeps_the_first_block():
    pool = BlockPool(4, 16)
    a = pool.allocate(2)
    assert a is not None
    pool.register(a[0], h(1))
    pool.register(a[1], h(1))
    assert a[1].hash is None and pool.lookup([h(1)]) == [a[0]]


def test_reset_refused_while_blocks_are_used():
    pool = BlockPool(4, 16)
    a = pool.allocate(1)
    assert a is not None
    pool.register(a[0], h(1))
    assert pool.reset() is False and pool.num_cached == 1
    pool.free(a)
    assert pool.reset() is True and pool.lookup([h(1)]) == []


def test_caching_off_never_hits():
    pool = BlockPool(4, 16, caching=False)
    a = pool.allocate(1)
    assert a is not None
    pool.register(a[0], h(1))
    pool.free(a)
    assert pool.lookup([h(1)]) == []
