"""Which part of each session's context is still resident on one replica, from the engine's KV events (pure).

vLLM 0.32 publishes its prefix cache's changes (``--kv-events-config``; the wire types are in
:mod:`rolloutpool.api.kv_events`): ``BlockStored`` when full blocks become cached (their chain
hashes, the parent of the first, and the ``session_id`` of the request that filled them),
``BlockRemoved`` when a cached block is evicted (hashes only), ``AllBlocksCleared`` on a reset.
:class:`ResidencyIndex` folds them into, per session, the number of leading tokens of its latest
context whose blocks are all still cached: exactly what the session's next turn finds
(``usage.prompt_tokens_details.cached_tokens``), capped by vLLM's rule that a hit stops at
``(prompt_len - 1)`` rounded down to whole blocks.

How the events map to residency:

- A block hash may be stored more than once: two requests that compute the same block before
  either has cached it keep two physical copies, each stored and later removed on its own. A
  block is resident while its copies outnumber its removals.
- A request's cache hits produce no event (vLLM's default ``kv_cache_report_mode``), so a
  session's context is rebuilt from parents: a ``BlockStored`` continues the session's own
  chain at its parent, or, when the parent is another session's block (a group's shared
  prompt), the chain of parents back to the first block. A request holds every block before
  the ones it fills, so a stored block's ancestors are resident when it is stored.
- Residency is counted prefix-closed: a session's resident tokens are its leading blocks up to
  the first one not cached, whatever follows (the engine's hit stops there too).

Memory: resident blocks (hash -> copies, parent) are bounded by the replica's KV pool, and each
live session keeps its chain until :meth:`ResidencyIndex.forget`. A ``BlockStored`` that arrives
for a session just forgotten (the last step's events can trail its response) is not attributed
to it: a forgotten id is ignored for the next ``forget_horizon`` stores, then may be used again.
More resident blocks than ``max_blocks`` means removals were lost: the index drops its blocks and
marks itself unreliable.

Reliability: events lost in transit (a gap in the publisher's sequence numbers, seen by the
subscriber in :mod:`rolloutpool.router.kv_events`) make the index wrong in unknown ways;
:meth:`ResidencyIndex.invalidate` marks it so, and :meth:`ResidencyIndex.resident_tokens`
answers ``None`` until an ``AllBlocksCleared`` (or a fresh publisher) gives an exact start again.

Assumed, as RL rollouts do: one request at a time per session (a session's chain follows the
request that stored last), and only full-attention KV cache group 0 fed in (the subscriber
filters ``group_idx``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "IndexStats",
    "ResidencyEvent",
    "ResidencyIndex",
]

BlockHash = int | bytes
"""vLLM's ``ExternalBlockHash``: a 64-bit integer by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``), else bytes."""

PRIMARY_MEDIUM = "GPU"
"""vLLM's ``MEDIUM_GPU``: the tier an engine computes from (also on the CPU backend)."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks became cached: ``block_hashes`` in chain order, the first continuing ``parent_hash``."""

    block_hashes: Sequence[BlockHash]
    parent_hash: BlockHash | None
    session_id: str | None = None
    medium: str | None = PRIMARY_MEDIUM
    block_size: int | None = None
    """Tokens per block as the event reports it (checked against the index's)."""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cached blocks were evicted (one copy each)."""

    block_hashes: Sequence[BlockHash]
    medium: str | None = PRIMARY_MEDIUM


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The prefix cache was reset (``/reset_prefix_cache``, a weight update)."""


ResidencyEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class IndexStats:
    """Counts of what one index holds and has seen (for metrics and tests)."""

    blocks: int
    """Distinct block hashes resident now."""
    sessions: int
    """Sessions with a chain."""
    stored: int
    """``BlockStored`` events applied (cumulative)."""
    removed: int
    """``BlockRemoved`` events applied (cumulative)."""
    cleared: int
    """``AllBlocksCleared`` events applied (cumulative)."""
    unknown_removals: int
    """Removed hashes that were not resident (lost stores, or events from before the subscription)."""
    ignored: int
    """Events of another medium (an offload tier), not counted as resident."""
    reliable: bool


class _Chain:
    """One session's latest context, block by block, and how many leading blocks are resident."""

    __slots__ = ("at", "hashes", "known", "resident")

    def __init__(self) -> None:
        self.hashes: list[BlockHash] = []
        self.at: dict[BlockHash, int] = {}
        """Position of each hash in ``hashes`` (a chain hash fixes its depth: no hash appears twice)."""
        self.resident = 0
        """Leading blocks of ``hashes`` all cached."""
        self.known = True
        """False when a stored block's ancestors could not be traced: its context is unknown."""


class ResidencyIndex:
    """One replica's cached blocks and, per session, its resident context prefix (pure, no I/O)."""

    def __init__(
        self,
        *,
        block_size: int,
        medium: str | None = PRIMARY_MEDIUM,
        max_blocks: int = 1 << 21,
        forget_horizon: int = 1024,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if max_blocks < 1 or forget_horizon < 0:
            raise ValueError("max_blocks must be >= 1 and forget_horizon >= 0")
        self.block_size = block_size
        self.medium = medium
        """Events of this tier are counted; ``None`` counts every tier as resident."""
        self.max_blocks = max_blocks
        self.forget_horizon = forget_horizon
        self.reliable = True
        """False after :meth:`invalidate` until :meth:`cleared`."""
        self._copies: dict[BlockHash, int] = {}
        self._parent: dict[BlockHash, BlockHash | None] = {}
        self._owners: dict[BlockHash, set[str]] = {}
        self._chains: dict[str, _Chain] = {}
        self._forgotten: dict[str, int] = {}
        self._forgotten_order: deque[tuple[int, str]] = deque()
        self._stored = self._removed = self._cleared = 0
        self._unknown_removals = self._ignored = 0

    # -- events ---------------------------------------------------------------------------

    def apply(self, events: Iterable[ResidencyEvent]) -> None:
        """Apply decoded events in order (each as :meth:`stored`, :meth:`removed` or :meth:`cleared`)."""
        for event in events:
            if isinstance(event, BlockStored):
                self.stored(
                    block_hashes=event.block_hashes,
                    parent_hash=event.parent_hash,
                    session_id=event.session_id,
                    medium=event.medium,
                    block_size=event.block_size,
                )
            elif isinstance(event, BlockRemoved):
                self.removed(block_hashes=event.block_hashes, medium=event.medium)
            else:
                self.cleared()

    def stored(
        self,
        *,
        block_hashes: Sequence[BlockHash],
        parent_hash: BlockHash | None,
        session_id: str | None = None,
        medium: str | None = PRIMARY_MEDIUM,
        block_size: int | None = None,
    ) -> None:
        """Blocks ``block_hashes`` (chain order, the first continuing ``parent_hash``) became cached.

        Raises ``ValueError`` (changing nothing) on an empty list, a hash that is neither int nor
        bytes, or a ``block_size`` other than the index's.
        """
        _check_hashes(block_hashes)
        if parent_hash is not None and not isinstance(parent_hash, _HASH_TYPES):
            raise ValueError(f"parent_hash must be an int, bytes or None, got {type(parent_hash).__name__}")
        if block_size is not None and block_size != self.block_size:
            raise ValueError(f"event block_size {block_size} differs from the index's {self.block_size}")
        if not self._counted(medium):
            return
        self._stored += 1
        copies, parents = self._copies, self._parent
        parent = parent_hash
        for h in block_hashes:
            n = copies.get(h, 0)
            copies[h] = n + 1
            if not n:
                parents[h] = parent
                for session in self._owners.get(h, ()):
                    self._advance(self._chains[session])
            parent = h
        if session_id is not None and self._attributed(session_id):
            self._extend(session_id, parent_hash, block_hashes)
        if len(copies) > self.max_blocks:
            self.invalidate()

    def removed(self, *, block_hashes: Sequence[BlockHash], medium: str | None = PRIMARY_MEDIUM) -> None:
        """One cached copy of each of ``block_hashes`` was evicted. ``ValueError`` (no change) on bad hashes."""
        _check_hashes(block_hashes)
        if not self._counted(medium):
            return
        self._removed += 1
        copies = self._copies
        for h in block_hashes:
            n = copies.get(h)
            if n is None:
                self._unknown_removals += 1
                continue
            if n > 1:
                copies[h] = n - 1
                continue
            del copies[h]
            del self._parent[h]
            for session in self._owners.get(h, ()):
                chain = self._chains[session]
                chain.resident = min(chain.resident, chain.at[h])

    def cleared(self) -> None:
        """Every cached block is gone; the index is exact again (empty)."""
        self._cleared += 1
        self._copies.clear()
        self._parent.clear()
        for chain in self._chains.values():
            chain.resident = 0
        self.reliable = True

    def invalidate(self) -> None:
        """Events were lost: drop the cached blocks and answer ``None`` until :meth:`cleared`."""
        self.reliable = False
        self._copies.clear()
        self._parent.clear()
        for chain in self._chains.values():
            chain.resident = 0

    def forget(self, session_id: str) -> None:
        """The session was released: drop its chain (idempotent)."""
        chain = self._chains.pop(session_id, None)
        if chain is not None:
            self._disown(session_id, chain.hashes)
        if self.forget_horizon:
            self._prune()
            self._forgotten[session_id] = self._stored
            self._forgotten_order.append((self._stored, session_id))
            if len(self._forgotten_order) > 4 * self.forget_horizon:  # many releases, no store: keep it bounded
                at, old = self._forgotten_order.popleft()
                if self._forgotten.get(old) == at:
                    del self._forgotten[old]

    # -- queries ---------------------------------------------------------------------------

    def resident_tokens(self, session_id: str) -> int | None:
        """Leading tokens of the session's latest context still cached, in whole blocks.

        ``None`` when no event has named the session (or it was forgotten), when its context
        could not be traced, or while the index is unreliable.
        """
        chain = self._chains.get(session_id)
        if chain is None or not chain.known or not self.reliable:
            return None
        return chain.resident * self.block_size

    def context_blocks(self, session_id: str) -> int | None:
        """Blocks of the session's latest context the events have shown (resident or not); None if unknown."""
        chain = self._chains.get(session_id)
        return None if chain is None or not chain.known else len(chain.hashes)

    def sessions(self) -> list[str]:
        """The sessions the index holds a context for."""
        return list(self._chains)

    def is_resident(self, block_hash: BlockHash) -> bool:
        """Whether at least one copy of the block is cached."""
        return block_hash in self._copies

    def owners(self, block_hash: BlockHash) -> frozenset[str]:
        """Sessions whose latest context contains the block (resident or not)."""
        return frozenset(self._owners.get(block_hash, ()))

    @property
    def stats(self) -> IndexStats:
        """What the index holds and has seen."""
        return IndexStats(
            blocks=len(self._copies),
            sessions=len(self._chains),
            stored=self._stored,
            removed=self._removed,
            cleared=self._cleared,
            unknown_removals=self._unknown_removals,
            ignored=self._ignored,
            reliable=self.reliable,
        )

    # -- internals ---------------------------------------------------------------------------

    def _counted(self, medium: str | None) -> bool:
        if self.medium is None or medium is None or medium == self.medium:
            return True
        self._ignored += 1
        return False

    def _attributed(self, session_id: str) -> bool:
        """False while the session was forgotten less than ``forget_horizon`` stores ago."""
        if not self._forgotten_order:
            return True
        self._prune()
        at = self._forgotten.get(session_id)
        return at is None or at + self.forget_horizon <= self._stored

    def _prune(self) -> None:
        """Drop the tombstones of sessions forgotten ``forget_horizon`` stores ago or more."""
        order, forgotten, horizon = self._forgotten_order, self._forgotten, self.forget_horizon
        while order and order[0][0] + horizon <= self._stored:
            at, old = order.popleft()
            if forgotten.get(old) == at:
                del forgotten[old]

    def _extend(self, session_id: str, parent: BlockHash | None, new: Sequence[BlockHash]) -> None:
        """The session's context is now its blocks up to ``parent`` followed by ``new``."""
        chain = self._chains.get(session_id)
        if chain is None:
            chain = self._chains[session_id] = _Chain()
        trail: list[BlockHash] = []
        if parent is None:
            keep = 0
        elif (pos := chain.at.get(parent)) is not None and chain.known:
            keep = pos + 1
        else:
            found = self._trace(parent, chain)
            if found is None:  # ancestors not cached: the context's start is unknown
                self._disown(session_id, chain.hashes)
                chain.hashes, chain.at, chain.resident, chain.known = [], {}, 0, False
                return
            keep, trail = found
        old = chain.hashes
        if keep < len(old):
            self._disown(session_id, old[keep:])
            del old[keep:]
            for h in list(chain.at):
                if chain.at[h] >= keep:
                    del chain.at[h]
        chain.known = True
        chain.resident = min(chain.resident, keep)
        owners, at = self._owners, chain.at
        for h in (*trail, *new) if trail else new:
            at[h] = len(old)
            old.append(h)
            holders = owners.get(h)
            if holders is None:
                owners[h] = {session_id}
            else:
                holders.add(session_id)
        self._advance(chain)

    def _trace(self, parent: BlockHash, chain: _Chain) -> tuple[int, list[BlockHash]] | None:
        """Walk cached parents from ``parent`` to the chain's first block, or to a block ``chain`` holds.

        Returns (blocks of ``chain`` kept, the blocks walked in chain order), or None when an
        ancestor is not cached (its parent unknown).
        """
        walked: list[BlockHash] = []
        h: BlockHash | None = parent
        parents = self._parent
        while h is not None:
            if chain.known and (pos := chain.at.get(h)) is not None:
                walked.reverse()
                return pos + 1, walked
            if h not in parents:
                return None
            walked.append(h)
            h = parents[h]
        walked.reverse()
        return 0, walked

    def _advance(self, chain: _Chain) -> None:
        hashes, copies, n = chain.hashes, self._copies, chain.resident
        while n < len(hashes) and hashes[n] in copies:
            n += 1
        chain.resident = n

    def _disown(self, session_id: str, hashes: Iterable[BlockHash]) -> None:
        owners = self._owners
        for h in hashes:
            holders = owners.get(h)
            if holders is not None:
                holders.discard(session_id)
                if not holders:
                    del owners[h]


_HASH_TYPES = (int, bytes)


def _check_hashes(block_hashes: Sequence[BlockHash]) -> None:
    if isinstance(block_hashes, str | bytes) or not block_hashes:
        raise ValueError("block_hashes must be a non-empty sequence of block hashes")
    for h in block_hashes:
        if type(h) is not int and type(h) is not bytes and (not isinstance(h, _HASH_TYPES) or isinstance(h, bool)):
            raise ValueError(f"a block hash must be an int or bytes, got {type(h).__name__}")
