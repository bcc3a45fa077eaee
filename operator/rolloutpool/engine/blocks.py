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

from collections import OrderedDict

__all__ = ["BlockPool"]


class BlockPool:
    """Fixed pool of KV blocks; one block (the null block) is reserved, as in vLLM."""

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (one is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.capacity = num_gpu_blocks - 1
        # key: a chain hash (>= 0, cached) or a unique negative id (uncached)
        self._free: OrderedDict[int, None] = OrderedDict((-(i + 1), None) for i in range(self.capacity))
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
        """Leading blocks of ``hashes[:limit]`` resident in the cache."""
        n = 0
        ref, free = self._ref, self._free
        for h in hashes[:limit]:
            if h in ref or h in free:
                n += 1
            else:
                break
        return n

    # -- mutation ---------------------------------------------------------------------

    def take_cached(self, hashes: list[int]) -> None:
        """Reference blocks that :meth:`count_hits` found resident."""
        ref, free = self._ref, self._free
        for h in hashes:
            if h in ref:
                ref[h] += 1
            else:
                del free[h]
                ref[h] = 1

    def take_new(self, n: int) -> bool:
        """Take ``n`` private (unhashed) blocks, evicting LRU cached blocks; False if too few."""
        if n > len(self._free):
            return False
        free = self._free
        for _ in range(n):
            key, _ = free.popitem(last=False)
            if key >= 0:
                self.evictions += 1
        return True

    def seal(self, block_hash: int) -> None:
        """A private block just became full with ``block_hash``: make it shareable."""
        if block_hash in self._ref:
            self._ref[block_hash] += 1
            self._return_uncached(1)
        elif block_hash in self._free:
            del self._free[block_hash]
            self._ref[block_hash] = 1
            self._return_uncached(1)
        else:
            self._ref[block_hash] = 1

    def release(self, hashes: list[int], n_private: int) -> None:
        """Drop a request's blocks: private tail first, then hashed blocks tail to head."""
        self._return_uncached(n_private)
        ref, free = self._ref, self._free
        for h in reversed(hashes):
            count = ref[h] - 1
            if count:
                ref[h] = count
            else:
                del ref[h]
                free[h] = None

    def _return_uncached(self, n: int) -> None:
        for _ in range(n):
            self._free[self._next_uncached] = None
            self._next_uncached -= 1
