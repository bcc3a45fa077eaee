"""A vLLM-like KV block pool with prefix caching (pure, no I/O).

Full blocks are identified by a chain hash (parent hash, tokens) supplied by the
caller; a block with a hash is shareable across requests. Every block not held by a
request sits in ONE free queue: allocation pops its front and, if that block was
cached, evicts its hash. As in vLLM's ``BlockPool.free_blocks``, freed blocks that
carry a hash are appended to the back in reverse order (a request's tail is evicted
before its head; cached prefixes leave least recently freed first), while freed
blocks without a hash go to the FRONT (LIFO reuse of uncached blocks), so no cached
prefix is evicted while an uncached block is free. Cached-but-free blocks count as
free in :attr:`usage`, exactly as ``vllm:kv_cache_usage_perc`` counts them.

Hash lists passed in are whole chains: ``hashes[i]`` is the block at depth ``i``. The pool keeps
references to the lists :meth:`BlockPool.seal` is given, so a caller may append to a list it passed
but never change or remove an entry already in it.

Representation (the semantics above are block by block; only the bookkeeping is
grouped). A request holds a prefix of its chain, so a block's ref count (the number
of requests holding it) never increases along a chain, and residency is
prefix-closed. Resident blocks form a radix tree of *segments*: runs of consecutive
blocks of one chain that share one ref count, each hanging off the segment it
continues and keyed there by its first hash. Holding sets are then equal across a
segment, so every request's held prefix ends on a segment boundary. Looking up a
chain walks a few segments (one comparison each, or a binary search where the chain
branches off inside one); taking a rollout's context back between two turns, or
releasing it, touches a few segments, not a thousand blocks; sealing appends to the
request's own tail segment; eviction truncates one. A segment holds no copy of its hashes: it is a
view ``src[depth:end]`` of the chain list it was sealed from (entries are never changed, so a view
stays valid), and extending, splitting or truncating it moves its bounds, not the hashes. Segments split only where ref
counts or chains come to differ, and a split keeps the deeper part in the original
object (so the free queue and callers' hints stay valid).

The free queue is a deque of *runs*: one release appends one run (the segments it
freed, evicted from the deepest block up) and the uncached free blocks are one run of
a count at its front. A segment knows the run it is free in; taking it back removes it from that
run's live count, so a run reclaimed whole costs nothing at eviction time.
``tests/test_engine.py`` drives this pool and a block-by-block reference in lockstep.

One simplification, documented: when a request fills a block whose hash is already
cached, vLLM keeps both physical copies until one is freed; here the request adopts
the cached block and returns its private copy at once. Both give the same hits.
"""

from __future__ import annotations

from collections import deque

from rolloutpool.engine.model.cache_events import BlockRemoved, CacheCleared, CacheEvent

__all__ = ["BlockPool"]


class _Run:
    """Blocks freed together: ``segs`` in chain order, evicted from the last one's tail; or ``count`` uncached."""

    __slots__ = ("count", "live", "segs")

    def __init__(self, segs: list[_Seg] | None, count: int) -> None:
        self.segs = segs
        self.count = count  # uncached runs: blocks left
        self.live = 0  # segment runs: cached blocks still free in this run


_NONE: list[int] = []  # the source of an empty (evicted or reset) segment: never read, never written


class _Seg:
    """Resident blocks ``src[depth:end]`` (depths ``depth .. end - 1`` of one chain), all with ref count ``ref``.

    A node of the radix tree: ``children`` are the segments that continue it, keyed
    by their first block's hash; ``parent`` is the segment it continues. ``src`` is a
    chain list the pool was given (``src[i]`` is the block at depth ``i``).
    """

    __slots__ = ("children", "depth", "end", "parent", "ref", "run", "src")

    def __init__(self, depth: int, end: int, src: list[int], ref: int, parent: _Seg | None) -> None:
        self.depth = depth
        self.end = end
        self.src = src
        self.ref = ref
        self.parent = parent
        self.children: dict[int, _Seg] = {}
        self.run: _Run | None = None  # the run it is free in (ref 0), else None

    @property
    def hashes(self) -> list[int]:
        """Its blocks' hashes (a copy: for tests and diagnostics)."""
        return self.src[self.depth : self.end]


def _shared_end(seg: _Seg, hashes: list[int], limit: int) -> int:
    """Depth up to which the chain ``hashes[:limit]`` runs through ``seg`` (which holds ``hashes[seg.depth]``).

    A segment is one chain, and a chain hash fixes every block before it, so the
    chain follows the segment exactly up to the last depth where both agree: one
    comparison when it follows the segment to its end or to ``limit``, otherwise a
    binary search for the branch point.
    """
    src = seg.src
    hi = min(seg.end, limit)
    if src is hashes or src[hi - 1] == hashes[hi - 1]:  # the segment's own chain agrees with itself
        return hi
    lo = seg.depth + 1  # depths before lo agree, hi - 1 does not
    hi -= 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if src[mid - 1] == hashes[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class BlockPool:
    """Fixed pool of KV blocks; one block (the null block) is reserved, as in vLLM."""

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (one is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.capacity = num_gpu_blocks - 1
        self._order: deque[_Run] = deque([_Run(None, self.capacity)])
        self._root = _Seg(0, 0, _NONE, 0, None)  # empty: its children start chains
        self._uncached = self.capacity
        self._cached_free = 0
        self.evictions = 0
        """Cached blocks whose hash was evicted to make room (cumulative)."""
        self.events: list[CacheEvent] | None = None
        """Where removals and resets are recorded (vLLM's KV events), or None (off: the default, free)."""

    # -- observation ----------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks a request could take now (uncached or cached-but-unreferenced)."""
        return self._uncached + self._cached_free

    @property
    def num_used(self) -> int:
        """Blocks held by requests."""
        return self.capacity - self.num_free

    @property
    def usage(self) -> float:
        """Held blocks / usable blocks: vLLM's ``kv_cache_usage_perc`` (cached-free counts as free)."""
        return self.num_used / self.capacity

    def is_cached(self, block_hash: int) -> bool:
        """Whether a block with this hash is resident (held or free). Scans the cache: for tests and diagnostics."""
        return any(block_hash in seg.hashes for seg in self._segments())

    def is_held(self, block_hash: int) -> bool:
        """Whether a request holds the block with this hash. Scans the cache: for tests and diagnostics."""
        return any(seg.ref and block_hash in seg.hashes for seg in self._segments())

    def count_hits(self, hashes: list[int], limit: int) -> int:
        """Leading blocks of ``hashes[:limit]`` resident in the cache (a walk down the tree).

        Residency is prefix-closed along a chain: a request holding block ``i`` holds
        every block before it, so a block is freed no earlier than its descendants
        and, with tail-first release into an LRU queue, evicted no earlier either.
        ``tests/test_engine.py`` checks the walk against a linear scan.
        """
        return self._leading(hashes, limit, held_only=False)

    def count_held(self, hashes: list[int], limit: int) -> int:
        """Leading blocks of ``hashes[:limit]`` held by some request (prefix-closed, like residency)."""
        return self._leading(hashes, limit, held_only=True)

    def count_hits_held(self, hashes: list[int], limit: int) -> tuple[int, int]:
        """``(count_hits(hashes, limit), count_held(hashes, hits))`` in one walk (held blocks are a prefix of hits)."""
        limit = min(limit, len(hashes))
        depth, node, held = 0, self._root, -1
        while depth < limit:
            seg = node.children.get(hashes[depth])
            if seg is None:
                break
            if held < 0 and not seg.ref:
                held = depth
            depth = _shared_end(seg, hashes, limit)
            if depth < seg.end:
                break
            node = seg
        return depth, depth if held < 0 else held

    def _leading(self, hashes: list[int], limit: int, *, held_only: bool) -> int:
        """Walk the segment tree along ``hashes``: how many leading blocks are resident (or held)."""
        limit = min(limit, len(hashes))
        depth, node = 0, self._root
        while depth < limit:
            seg = node.children.get(hashes[depth])
            if seg is None or (held_only and not seg.ref):
                return depth
            depth = _shared_end(seg, hashes, limit)
            if depth < seg.end:
                return depth
            node = seg
        return depth

    # -- mutation ---------------------------------------------------------------------

    def take_cached(self, hashes: list[int], n: int) -> None:
        """Reference the resident blocks ``hashes[:n]`` (a chain's first blocks, as :meth:`count_hits` found)."""
        depth, node = 0, self._root
        while depth < n:
            seg = node.children[hashes[depth]]
            stop = _shared_end(seg, hashes, n)
            if stop < seg.end:  # the hit ends, or this chain branches off, inside
                seg = self._split(seg, stop)
            if not seg.ref:
                self._reclaim(seg)
            seg.ref += 1
            depth, node = stop, seg

    def take_new(self, n: int) -> bool:
        """Take ``n`` private (unhashed) blocks, evicting LRU cached blocks; False if too few."""
        if n > self.num_free:
            return False
        order = self._order
        while n:
            run = order[0]
            segs = run.segs
            if segs is None:
                take = min(n, run.count)
                run.count -= take
                self._uncached -= take
                n -= take
                if not run.count:
                    order.popleft()
                continue
            if not run.live:
                order.popleft()
                continue
            seg = segs[-1]
            if seg.run is not run:  # taken back since (or emptied): no longer in this run
                segs.pop()
                continue
            n -= self._evict(seg, min(n, seg.end - seg.depth))
            if seg.end == seg.depth:
                segs.pop()
        return True

    def seal(self, hashes: list[int], start: int, end: int, hint: object = None) -> object:
        """A request holding ``hashes[:start]`` just filled private blocks ``start..end-1``: make them shareable.

        A block whose hash is already cached is adopted (its private copy returns to
        the free queue); the others become resident, extending the request's tail
        segment when it holds that alone and nothing continues it. Returns a hint for
        the request's next call (its tail segment: a split keeps the deeper part in
        the same object, so the hint stays good while the request holds it).
        """
        node, depth = self._root, 0
        if type(hint) is _Seg and hint.depth < hint.end == start and hint.src[start - 1] == hashes[start - 1]:
            # still the segment that ends with our last block (so our chain runs through it: it can view ours)
            if hint.ref == 1 and not hint.children and start < end:
                hint.src, hint.end = hashes, end  # all the loop below would do: extend it
                return hint
            node, depth = hint, start
        while depth < start:  # down the request's held segments (they end on its boundary)
            node = node.children[hashes[depth]]
            depth = node.end
        adopted = 0
        while depth < end:
            seg = node.children.get(hashes[depth])
            if seg is None:  # this block and (prefix-closed) all after it are new
                if node.ref == 1 and not node.children:  # ours alone, ending at depth: it can view our chain
                    node.src, node.end = hashes, end
                else:
                    child = _Seg(depth, end, hashes, 1, node)
                    node.children[hashes[depth]] = child
                    node = child
                break
            stop = _shared_end(seg, hashes, end)
            if stop < seg.end:
                seg = self._split(seg, stop)
            if not seg.ref:
                self._reclaim(seg)
            seg.ref += 1
            adopted += stop - depth
            depth, node = stop, seg
        if adopted:
            self._return_uncached(adopted)
            if self.events is not None:  # the request's own copies of these blocks leave the cache
                self.events.extend(BlockRemoved(h) for h in hashes[start : start + adopted])
        return node

    def release(self, hashes: list[int], n_hashed: int, n_private: int) -> None:
        """Drop a request's blocks (``hashes[:n_hashed]`` and ``n_private``): private first, then hashed tail to head.

        Ref counts are non-increasing along a chain, so the blocks this release frees
        are a suffix of whole segments; they form one run of the free queue.
        """
        self._return_uncached(n_private)
        freed: list[_Seg] = []
        depth, node = 0, self._root
        while depth < n_hashed:
            node = node.children[hashes[depth]]
            node.ref -= 1
            if not node.ref:
                freed.append(node)
            depth = node.end
        if freed:
            run = _Run(freed, 0)
            total = 0
            for seg in freed:
                seg.run = run
                total += seg.end - seg.depth
            run.live = total
            self._cached_free += total
            self._order.append(run)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash (vLLM's ``reset_prefix_cache``, e.g. after a weight update).

        As in vLLM it succeeds only while no request holds a block; otherwise it changes
        nothing and returns False. A reset is not eviction: :attr:`evictions` is unchanged.
        """
        if self.num_used:
            return False
        for seg in self._segments():  # orphan them for good: a stale request hint must never match
            seg.src, seg.end = _NONE, seg.depth
            seg.run = seg.parent = None
        self._order = deque([_Run(None, self.capacity)])
        self._root = _Seg(0, 0, _NONE, 0, None)
        self._uncached = self.capacity
        self._cached_free = 0
        if self.events is not None:
            self.events.append(CacheCleared())
        return True

    # -- segments -----------------------------------------------------------------------

    def _segments(self) -> list[_Seg]:
        out, stack = [], list(self._root.children.values())
        while stack:
            seg = stack.pop()
            out.append(seg)
            stack.extend(seg.children.values())
        return out

    def _split(self, seg: _Seg, depth: int) -> _Seg:
        """Cut ``seg`` at ``depth``; return the new head (``seg`` keeps the tail, its children and its run)."""
        parent = seg.parent
        if parent is None:  # pragma: no cover - only the root has no parent, and it is never split
            raise RuntimeError("cannot split the root")
        src = seg.src
        head = _Seg(seg.depth, depth, src, seg.ref, parent)
        head.run = seg.run
        parent.children[src[seg.depth]] = head
        seg.depth = depth
        seg.parent = head
        head.children[src[depth]] = seg
        return head

    def _reclaim(self, seg: _Seg) -> None:
        """A free segment is referenced again: it leaves its run."""
        n = seg.end - seg.depth
        if seg.run is not None:
            seg.run.live -= n
            seg.run = None
        self._cached_free -= n

    def _evict(self, seg: _Seg, k: int) -> int:
        """Evict the deepest ``k`` blocks of a free segment (nothing continues it: residency is prefix-closed)."""
        if seg.children:  # pragma: no cover - would contradict prefix-closed residency
            raise RuntimeError("evicting blocks that cached blocks continue")
        src, end = seg.src, seg.end
        if self.events is not None:  # deepest first, the order vLLM's free queue evicts a freed chain in
            self.events.extend(BlockRemoved(h) for h in reversed(src[end - k : end]))
        if k == end - seg.depth:
            if seg.parent is not None:
                del seg.parent.children[src[seg.depth]]
            seg.src, seg.end = _NONE, seg.depth
            if seg.run is not None:
                seg.run.live -= k
            seg.run = seg.parent = None
        else:
            seg.end = end - k
            if seg.run is not None:
                seg.run.live -= k
        self._cached_free -= k
        self.evictions += k
        return k

    def _return_uncached(self, n: int) -> None:
        """Freed blocks without a hash go to the FRONT of the free queue: reused before any cached block."""
        if n:
            self._uncached += n
            first = self._order[0] if self._order else None
            if first is not None and first.segs is None:
                first.count += n  # uncached blocks only ever sit at the front: one run
            else:
                self._order.appendleft(_Run(None, n))
