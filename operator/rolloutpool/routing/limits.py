"""The session ledger's settings and what it keeps per replica to set caps and quarantine (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rolloutpool.routing.caps import CapRule
from rolloutpool.routing.discovery import OperatorLimit
from rolloutpool.routing.quarantine import PressureState, QuarantineConfig
from rolloutpool.routing.workingset import WorkingSet, WorkingSetConfig

__all__ = ["LedgerConfig", "ReplicaLimits"]


@dataclass(frozen=True)
class LedgerConfig:
    """The ledger's fixed settings."""

    caps: CapRule = field(default_factory=CapRule)
    quarantine: QuarantineConfig | None = field(default_factory=QuarantineConfig)
    """The fast quarantine's thresholds; None: no fast quarantine (the peers' policies in the simulator)."""
    working_set: WorkingSetConfig | None = None
    """Turn-level scheduling (:mod:`~rolloutpool.routing.workingset`): turns held, prefixes kept or let go, new
    sessions admitted by each replica's working set (the router's). None: no scheduling, only the caps (the peers'
    policies in the simulator, fixed caps in hindsight)."""
    scheduler: Callable[[], WorkingSet] | None = None
    """A peer's per-turn scheduler in place of our working set (:mod:`rolloutpool.routing.peers`): a factory, so
    every ledger gets its own; it takes precedence over ``working_set``."""
    queue_max: int | None = None
    """New sessions that may wait; None: unbounded."""
    default_block_size: int = 16
    """Block size assumed until a replica reports its own."""


@dataclass
class ReplicaLimits:
    """What sets one replica's cap and quarantine."""

    fixed_cap: int | None = None
    """The replica's own fixed cap."""
    capacity_tokens: int | None = None
    """Reported KV capacity (None: not reported yet)."""
    block_size: int = 16
    pressure: PressureState | None = None
    """The fast quarantine's state; None without a fast quarantine."""
    operator: OperatorLimit | None = None
    """The operator's cap and quarantine (the RolloutPool status), if any."""
    prefix_caching: bool | None = None
    """The engine's ``enable_prefix_caching`` (None: not reported); off, misses are never re-prefill."""
