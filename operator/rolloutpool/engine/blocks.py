"""A vLLM-like KV block pool with prefix caching (pure, no I/O).

Full blocks are identified by a chain hash (parent hash, tokens) supplied by the
caller; a block with a hash is shareable across requests. Every block not held by a
request sits in ONE free queue ordered by the time it was freed: allocation pops the
least recently freed block and, if it was cached, evicts its hash. A finished or
preempted request's blocks are appended in reverse order, so its tail is evicted
before its head (as vLLM's ``free_blocks`` does). Cached-but-free blocks count as
free in :attr:`usage`, exactly as ``vllm:kv_cache_usage_perc`` counts them.

The queue is stored as *runs*: one release appends one run (the blocks it freed, in
eviction order) and uncached free blocks are runs of a count. Taking a cached block
back removes it from its run's live count, so a run reclaimed whole (a rollout's
context between two turns) costs nothing at eviction time. Per-block work happens in
C (dict and map built-ins); the order of eviction is exactly block by block.

One simplification, documented: when a request fills a block whose hash is already
cached, vLLM keeps both physical copies until one is freed; here the request adopts
the cached block and returns its private copy at once. Both give the same hits.
"""

from __future__ import annotations

from collections import Counter, deque

__all__ = ["BlockPool"]


class _Run:
    """Blocks freed together: ``hashes[lo:hi]`` evicted from ``hi - 1`` down, or ``count`` uncached blocks."""

    __slots__ = ("count", "hashes", "hi", "live", "lo")

    def __init__(self, hashes: list[int] | None, lo: int, hi: int, count: int = 0) -> None:
        self.hashes = hashes
        self.lo = lo
        self.hi = hi
        self.count = count
        self.live = hi - lo if hashes is not None else count


class BlockPool:
    """Fixed pool of KV blocks; one block (the null block) is reserved, as in vLLM."""

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (one is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.capacity = num_gpu_blocks - 1
        self._order: deque[_Run] = deque([_Run(None, 0, 0, count=self.capacity)])
        self._free: dict[int, _Run] = {}  # cached free block -> the run it sits in
        self._uncached = self.capacity
        self._ref: dict[int, int] = {}
        self.evictions = 0
        """Cached blocks whose hash was evicted to make room (cumulative)."""

    # -- observation ----------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks a request could take now (uncached or cached-but-unreferenced)."""
        return self._uncached + len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks held by requests."""
        return self.capacity - self.num_free

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

    # -- mutation ---------------------------------------------------------------------

    def take_cached(self, hashes: list[int], held: int | None = None) -> None:
        """Reference resident blocks that :meth:`count_hits` found; ``held`` of them are held already."""
        if held is None:
            held = self.count_held(hashes, len(hashes))
        ref = self._ref
        if held:
            ref.update({h: ref[h] + 1 for h in hashes[:held]})
        reclaimed = hashes[held:]
        if reclaimed:
            free = self._free
            run = free[reclaimed[0]]
            if run.live == len(reclaimed) and free[reclaimed[-1]] is run:
                # a whole run taken back (a rollout's context between turns): the run's
                # live blocks are exactly these, since they are its only free blocks
                deque(map(free.pop, reclaimed), maxlen=0)
                run.live = 0
            else:
                for owner, n in Counter(map(free.pop, reclaimed)).items():
                    owner.live -= n
            ref.update(dict.fromkeys(reclaimed, 1))

    def take_new(self, n: int) -> bool:
        """Take ``n`` private (unhashed) blocks, evicting LRU cached blocks; False if too few."""
        if n > self.num_free:
            return False
        order, free = self._order, self._free
        while n:
            run = order[0]
            if run.hashes is None:
                take = min(n, run.count)
                run.count -= take
                self._uncached -= take
                n -= take
                if run.count == 0:
                    order.popleft()
                continue
            if run.live == 0:
                order.popleft()
                continue
            run.hi -= 1
            h = run.hashes[run.hi]
            if free.get(h) is run:
                del free[h]
                run.live -= 1
                self.evictions += 1
                n -= 1
        return True

    def seal(self, block_hash: int) -> None:
        """A private block just became full with ``block_hash``: make it shareable."""
        if block_hash in self._ref:
            self._ref[block_hash] += 1
            self._return_uncached(1)
        elif block_hash in self._free:
            self._free.pop(block_hash).live -= 1
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
        if lo < len(hashes):
            deque(map(ref.pop, hashes[lo:]), maxlen=0)  # delete in C
            run = _Run(hashes, lo, len(hashes))
            self._free.update(dict.fromkeys(hashes[lo:], run))
            self._order.append(run)

    def _return_uncached(self, n: int) -> None:
        if n:
            self._uncached += n
            self._order.append(_Run(None, 0, 0, count=n))
