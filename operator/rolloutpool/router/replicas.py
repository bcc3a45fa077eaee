"""What the router keeps per replica beyond the ledger, and the gauges it exports for each (no I/O here)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from rolloutpool.router.config import ReplicaSpec
from rolloutpool.router.instruments import ReplicaGauges, TurnGauges
from rolloutpool.routing.discovery import OperatorLimit
from rolloutpool.routing.ledger import Ledger, ReplicaLimits
from rolloutpool.routing.quarantine import PressureState
from rolloutpool.routing.reprefill import CachedTokensWatch

__all__ = ["ReplicaRuntime", "replica_gauges"]


@dataclass
class ReplicaRuntime:
    """What the router knows about a replica beyond the ledger (its URL, scrapes); limits are the ledger's."""

    spec: ReplicaSpec
    limits: ReplicaLimits
    """The ledger's record of this replica (capacity, block size, pressure, operator limits)."""
    scrape_failures: int = 0
    """Consecutive failed scrapes."""
    last_scrape: float | None = None
    signals: dict[str, float] = field(default_factory=dict)
    """Last scraped signals, for the admin API."""
    unready_reason: str | None = None
    cached_watch: CachedTokensWatch = field(default_factory=CachedTokensWatch)
    """Whether the replica's responses ever carry ``cached_tokens`` (warned about once)."""

    @property
    def prefix_caching(self) -> bool | None:
        """The engine's ``enable_prefix_caching`` (scraped; None until reported)."""
        return self.limits.prefix_caching

    @prefix_caching.setter
    def prefix_caching(self, value: bool | None) -> None:
        self.limits.prefix_caching = value

    @property
    def pressure(self) -> PressureState:
        """The router's fast quarantine state of the replica."""
        assert self.limits.pressure is not None  # noqa: S101 -- the router runs it (but with a peer's scheduler)
        return self.limits.pressure

    @property
    def block_size(self) -> int:
        """Block size reported by the replica (or the default)."""
        return self.limits.block_size

    @property
    def capacity_tokens(self) -> int | None:
        """Reported KV capacity."""
        return self.limits.capacity_tokens

    @property
    def operator(self) -> OperatorLimit | None:
        """Cap and quarantine the operator wrote into the RolloutPool status, if any."""
        return self.limits.operator


def replica_gauges(ledger: Ledger, runtime: Mapping[str, ReplicaRuntime]) -> Iterator[ReplicaGauges]:
    """Each replica's gauges as the metrics read them at a scrape: the table's counts, the router's own fast
    quarantine (without the operator's) and the turn scheduler's state and decisions."""
    work = ledger.work
    for r in ledger.table.replicas.values():
        own = runtime.get(r.name)  # the router's own fast quarantine, without the operator's
        state = None if own is None else own.limits.pressure  # None: a peer's scheduler runs without it
        pressure = (state.reason or "Unknown") if state is not None and state.quarantined else None
        turns = None
        if work is not None and r.name in work.replicas:
            w = work.replicas[r.name]
            decisions = {
                "held": w.holds,
                "resumed": w.resumes,
                "forced": w.forced,
                "let_go": w.lets_go,
                "moved": w.moves,
            }
            budget = w.budget(work.config.target)
            turns = TurnGauges(
                w.counted,
                budget,
                len(w.held),
                w.kept,
                len(w.out),
                decisions,
                ledger.let_go_reprefill.get(r.name, 0),
            )
        yield ReplicaGauges(r.name, r.live, r.cap, r.quarantined, r.ready, r.draining, r.inflight, pressure, turns)
