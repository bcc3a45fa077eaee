"""A vLLM-like KV block pool with prefix caching (pure, no I/O).

Full blocks are identified by a chain hash (parent hash, tokens) supplied by the
caller; a block with a hash is shareable across requests. Every block not held by a
request sits in ONE free queue ordered by the time it was freed: allocation pops the
least recently freed block and, if it was cached, evicts its hash. A finished or
preempted request's blocks are appended in reverse order, so its tail is evicted
before its head (as vLLM's ``free_blocks`` does). Cached-but-free blocks count as
free in :attr:`usage`, exactly as ``vllm:kv_cache_usage_perc`` counts them.

One simplification, documented: when a request fills a block whose hash is already
cached, vLLM keeps both physical copies until one is freed; here the request adopts
the cached block and returns its private copy at once. Both give the same hits.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat

__all__ = ["BlockPool"]


class BlockPool:
    """Fixed pool of KV blocks; one block (the null block) is reserved, as in vLLM."""

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (one is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.capacity = num_gpu_blocks - 1
        # The free queue: ``_order`` holds (key, generation) in free order, ``_free`` maps each
        # key now free to the generation it was freed in; an entry of ``_order`` whose
        # generation differs is stale (the block was taken since) and is skipped.
        # key: a chain hash (>= 0, cached) or a unique negative id (uncached)
        self._gen = 0
        self._free: dict[int, int] = dict.fromkeys(range(-1, -self.capacity - 1, -1), 0)
        self._order: deque[tuple[int, int]] = deque(zip(self._free, repeat(0)))
        self._next_uncached = -(self.capacity + 1)
        self._ref: dict[int, int] = {}
        self.evictions = 0
        """Cached blocks whose hash was evicted to make room (cumulative)."""

    # -- observation ----------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks a request could take now (uncached or cached-but-unreferenced)."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks held by requests."""
        return self.capacity - len(self._free)

    @property
    def usage(self) -> float:
        """Held blocks / usable blocks: vLLM's ``kv_cache_usage_perc`` (cached-free counts as free)."""
        return self.num_used / self.capacity

    def is_cached(self, block_hash: int) -> bool:
        """Whether a block with this hash is resident (held or free)."""
        return block_hash in self._ref or block_hash in self._free

    def is_held(self, block_hash: int) -> bool:
        """Whether a request holds the block with this hash (taking it frees nothing)."""
        return block_hash in self._ref

    def count_hits(self, hashes: list[int], limit: int) -> int:
        """Leading blocks of ``hashes[:limit]`` resident in the cache (binary search).

        Residency is prefix-closed along a chain: a request holding block ``i`` holds
        every block before it, so a block is freed no earlier than its descendants
        and, with tail-first release into an LRU queue, evicted no earlier either.
        ``tests/test_engine.py`` checks the search against a linear scan.
        """
        ref, free = self._ref, self._free
        lo, hi = 0, min(limit, len(hashes))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            h = hashes[mid - 1]
            if h in ref or h in free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def count_held(self, hashes: list[int], limit: int) -> int:
        """Leading blocks of ``hashes[:limit]`` held by some request (binary search, prefix-closed)."""
        ref = self._ref
        lo, hi = 0, min(limit, len(hashes))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in ref:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def take_cached(self, hashes: list[int], held: int | None = None) -> None:
        """Reference resident blocks that :meth:`count_hits` found; ``held`` of them are held already."""
        if held is None:
            held = self.count_held(hashes, len(hashes))
        ref, free = self._ref, self._free
        if held:
            ref.update({h: ref[h] + 1 for h in hashes[:held]})
        reclaimed = hashes[held:]
        for h in reclaimed:
            del free[h]
        ref.update(dict.fromkeys(reclaimed, 1))

    def take_new(self, n: int) -> bool:
        """Take ``n`` private (unhashed) blocks, evicting LRU cached blocks; False if too few."""
        if n > len(self._free):
            return False
        free, order = self._free, self._order
        taken = 0
        while taken < n:
            key, gen = order.popleft()
            if free.get(key) == gen:
                del free[key]
                taken += 1
                if key >= 0:
                    self.evictions += 1
        return True

    def seal(self, block_hash: int) -> None:
        """A private block just became full with ``block_hash``: make it shareable."""
        if block_hash in self._ref:
            self._ref[block_hash] += 1
            self._return_uncached(1)
        elif block_hash in self._free:
            del self._free[block_hash]  # its queue entry goes stale
            self._ref[block_hash] = 1
            self._return_uncached(1)
        else:
            self._ref[block_hash] = 1

    def release(self, hashes: list[int], n_private: int) -> None:
        """Drop a request's blocks: private tail first, then hashed blocks tail to head.

        Ref counts are non-increasing along a chain, so the blocks this release frees
        are a suffix, found by binary search; the rest are decremented in bulk.
        """
        self._return_uncached(n_private)
        if not hashes:
            return
        ref = self._ref
        lo, hi = 0, len(hashes)  # first index whose ref count is 1
        while lo < hi:
            mid = (lo + hi) // 2
            if ref[hashes[mid]] > 1:
                lo = mid + 1
            else:
                hi = mid
        if lo:
            ref.update({h: ref[h] - 1 for h in hashes[:lo]})
        freed = hashes[lo:]
        for h in freed:
            del ref[h]
        self._push_free(freed[::-1])

    def _return_uncached(self, n: int) -> None:
        if n:
            start = self._next_uncached
            self._push_free(range(start, start - n, -1))
            self._next_uncached = start - n

    def _push_free(self, keys: list[int] | range) -> None:
        """Append keys to the free queue in order, as one generation."""
        self._gen += 1
        gen = self._gen
        self._free.update(dict.fromkeys(keys, gen))
        self._order.extend(zip(keys, repeat(gen)))
        if len(self._order) > 2 * self.capacity + 4096:  # drop stale entries (amortised O(1)), keep order
            free = self._free
            self._order = deque(e for e in self._order if free.get(e[0]) == e[1])
