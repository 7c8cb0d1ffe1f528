"""Simulated paged KV cache with prefix caching, shaped like vLLM v1's
``BlockPool`` + ``FreeKVCacheBlockQueue``.

* The cache has ``num_blocks`` blocks of ``block_size`` tokens. A block is
  *used* while some request references it (``ref > 0``); KV usage is
  ``used / num_blocks``, as ``vllm:kv_cache_usage_perc`` reports it.
* A full, computed prompt block is registered under its chained hash. When its
  last user frees it, it stays in the cache but joins the free queue, so a
  later request can revive it (a prefix-cache hit) until the block is handed
  out again.
* The free queue is one LRU list: allocation takes from the head (never-used
  blocks first, then the least recently freed), and a request frees its blocks
  tail-first, so a prompt's end is evicted before its shared start - vLLM's
  policy, which is what makes long shared system prompts survive.

No timing, requests or HTTP here: the scheduler (:mod:`.engine`) decides who
gets blocks and when.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Block:
    """One KV block."""

    id: int
    """Index in the pool."""
    ref: int = 0
    """Requests holding the block."""
    hash: bytes | None = None
    """Chained hash while the block is in the prefix cache."""


class BlockPool:
    """Blocks, their free LRU queue and the prefix-cache index.

    Usage::

        pool = BlockPool(num_blocks=1024, block_size=16)
        hit = pool.lookup(hashes)            # cached prefix blocks
        pool.touch(hit)                      # pin them
        fresh = pool.allocate(3)             # None when the cache is full
        pool.free(hit + fresh)               # tail-first
    """

    def __init__(self, num_blocks: int, block_size: int, *, caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, Block] = OrderedDict((b.id, b) for b in self.blocks)
        self._cached: dict[bytes, Block] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def lookup(self, hashes: Sequence[bytes]) -> list[Block]:
        """The longest run of cached blocks matching ``hashes`` from the start."""
        if not self.caching:
            return []
        hit: list[Block] = []
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def touch(self, blocks: Sequence[Block]) -> None:
        """Add one reference to each block, taking free ones off the queue."""
        for b in blocks:
            if b.ref == 0:
                del self._free[b.id]
            b.ref += 1

    def allocate(self, n: int) -> list[Block] | None:
        """``n`` fresh blocks (evicting cached ones from the LRU head), or None."""
        if n > len(self._free):
            return None
        out: list[Block] = []
        for _ in range(n):
            _, b = self._free.popitem(last=False)
            if b.hash is not None:
                del self._cached[b.hash]
                b.hash = None
            b.ref = 1
            out.append(b)
        return out

    def free(self, blocks: Sequence[Block]) -> None:
        """Drop one reference from each block; freed blocks join the queue
        tail-first so a prompt's tail is evicted before its head."""
        for b in reversed(blocks):
            b.ref -= 1
            if b.ref == 0:
                self._free[b.id] = b

    def register(self, block: Block, h: bytes) -> None:
        """Put a full computed block into the prefix cache under ``h``. If
        another block already holds ``h`` (two requests prefilled the same
        prefix at once), the first one stays canonical, as in vLLM."""
        if not self.caching or block.hash is not None or h in self._cached:
            return
        block.hash = h
        self._cached[h] = block

    def reset(self) -> bool:
        """Drop the prefix index; refused (False) while any block is in use."""
        if self.num_used:
            return False
        for b in self._cached.values():
            b.hash = None
        self._cached.clear()
        return True
