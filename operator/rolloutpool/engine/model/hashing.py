"""Chain hashes of full KV blocks (pure).

A block's hash covers its parent's hash and its own tokens, so two sequences share a
block exactly when they share every token up to the end of that block (vLLM's
prefix-cache key). Only hash EQUALITY matters to the engine (the pool keys dicts by
hash and compares them; nothing orders by value), so any scheme works that gives equal
hashes to equal prefixes and makes a collision astronomically unlikely. Python's hash
of ints and tuples of ints does not depend on ``PYTHONHASHSEED``, so runs are
reproducible.

``hash_token_blocks`` hashes real token ids (the HTTP engine simulator): non-negative
62-bit integers. ``SegmentChain`` hashes sequences described as segments
``(segment_id, length)`` without building token lists (the fleet simulator): token
``i`` of segment ``s`` is the pair ``(s, i)``. The whole blocks one :meth:`~SegmentChain.extend`
adds are consecutive integers ``base, base + 1, ...`` where ``base`` is a 62-bit hash
of (parent hash, segment, offset): the parent fixes every token before the run and
(segment, offset, position in the run) fixes the block's own tokens, so equal hashes
still mean equal prefixes, and building a long run costs one hash, not one per block.
Two runs collide only if their ranges of a few thousand integers overlap in a 2**62
space: less likely than a collision among per-block hashes of the same blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MASK", "SegmentChain", "hash_token_blocks"]

MASK = (1 << 62) - 1


def hash_token_blocks(tokens: Sequence[int], block_size: int = 16, parent: int = 0) -> list[int]:
    """Chain hashes of every full block of ``tokens``."""
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size]))) & MASK
        out.append(parent)
    return out


class SegmentChain:
    """Incremental chain hashes of a sequence built from segments."""

    __slots__ = ("_parent", "_pending", "_pending_len", "block_size", "hashes", "length")

    def __init__(self, block_size: int = 16) -> None:
        self.block_size = block_size
        self.hashes: list[int] = []
        self.length = 0
        self._parent = 0
        self._pending: list[tuple[int, int, int]] = []
        self._pending_len = 0

    def copy(self) -> SegmentChain:
        """An independent chain with the same content."""
        other = SegmentChain(self.block_size)
        other.hashes = list(self.hashes)
        other.length = self.length
        other._parent = self._parent
        other._pending = list(self._pending)
        other._pending_len = self._pending_len
        return other

    def extend(self, segment_id: int, n_tokens: int) -> None:
        """Append ``n_tokens`` tokens of segment ``segment_id``."""
        bs = self.block_size
        offset = 0
        if self._pending_len:
            take = min(bs - self._pending_len, n_tokens)
            self._pending.append((segment_id, 0, take))
            self._pending_len += take
            offset = take
            if self._pending_len == bs:
                self._parent = hash((self._parent, tuple(self._pending))) & MASK
                self.hashes.append(self._parent)
                self._pending = []
                self._pending_len = 0
        whole = (n_tokens - offset) // bs  # whole blocks inside this segment
        if whole:
            base = hash((self._parent, segment_id, offset)) & MASK
            self.hashes += range(base, base + whole)
            offset += whole * bs
            self._parent = base + whole - 1
        if offset < n_tokens:
            self._pending = [(segment_id, offset, n_tokens)]
            self._pending_len = n_tokens - offset
        self.length += n_tokens
