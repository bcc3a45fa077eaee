"""What the engine model's prefix cache reports when asked to (pure): vLLM's KV events, before encoding.

Off by default and free then: :class:`~rolloutpool.engine.model.core.Engine` records them only
after :meth:`~rolloutpool.engine.model.core.Engine.record_cache_events`, and the HTTP server
drains them after every step (``engine/server/kv_publisher.py`` turns them into vLLM's wire
format). The fleet simulator never turns them on.

- :class:`BlocksStored`: a request's full blocks ``start .. end - 1`` became cached in one
  step (vLLM's ``BlockStored``, sent for every block the request computed, even one whose
  hash another copy already caches).
- :class:`BlockRemoved`: one cached copy of a block left the cache: evicted, or (the model's
  one simplification) the private copy a request computed of a block already cached, which
  the pool returns at once where vLLM keeps it until it is evicted. Either way each stored
  copy is removed once, so a consumer counting copies stays exact.
- :class:`CacheCleared`: the prefix cache was reset.
"""

from __future__ import annotations

from dataclasses import dataclass

from rolloutpool.engine.model.request import Request

__all__ = ["BlockRemoved", "BlocksStored", "CacheCleared", "CacheEvent"]


@dataclass(frozen=True, slots=True)
class BlocksStored:
    """Blocks ``request.hashes[start:end]`` became cached (the block before them, if any, is ``start - 1``)."""

    request: Request
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """One cached copy of the block with this hash is gone."""

    block_hash: int


@dataclass(frozen=True, slots=True)
class CacheCleared:
    """Every cached block is gone."""


CacheEvent = BlocksStored | BlockRemoved | CacheCleared
