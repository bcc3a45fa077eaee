"""What the session ledger keeps per replica, and the caps and quarantine it gives (pure).

:class:`ReplicaControls` is the base of :class:`~rolloutpool.routing.ledger.Ledger`: a replica's readiness,
drain, reported KV capacity, the operator's limits, the fast quarantine fed by scrapes, and the effective cap
all of that gives with the working set's room (:func:`~rolloutpool.routing.caps.effective_cap`). The ledger
owns the attributes declared here and the admission queue: every change that may free a slot calls its
:meth:`~ReplicaControls.admit`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rolloutpool.routing.caps import effective_cap
from rolloutpool.routing.discovery import OperatorLimit
from rolloutpool.routing.events import CapChanged, Event, QuarantineChanged
from rolloutpool.routing.limits import LedgerConfig, ReplicaLimits
from rolloutpool.routing.table import SessionTable
from rolloutpool.routing.weights import WeightTracker, observe_scrape_excused
from rolloutpool.routing.workingset import WorkingSet

__all__ = ["ReplicaControls"]


class ReplicaControls:
    """Replica state and caps of the ledger (its base; the ledger sets every attribute declared here)."""

    config: LedgerConfig
    table: SessionTable
    limits: dict[str, ReplicaLimits]
    work: WorkingSet | None
    events: list[Event]
    weights: WeightTracker
    _now: float
    _holding: bool

    def admit(self, *, now: float) -> None:
        """Place queued sessions while a replica may take them (the ledger's admission queue)."""
        raise NotImplementedError

    # -- caps -------------------------------------------------------------------------------

    def cap_of(self, name: str) -> int | None:
        """The effective cap of a replica, from its limits (:func:`~rolloutpool.routing.caps.effective_cap`)."""
        limits = self.limits[name]
        replica = self.table.replicas.get(name)
        room = None
        if self.work is not None and name in self.work.replicas:
            room = self.work.room_for_new(name, now=self._now)  # None: no KV capacity reported, no limit from it
        return effective_cap(
            self.config.caps,
            replica_cap=limits.fixed_cap,
            live=0 if replica is None else replica.live,
            room=room,
        )

    def _kv_cap(self, name: str) -> bool:
        """Recompute a replica's cap after its working set changed (no event: it moves every turn)."""
        replica = self.table.replicas.get(name)
        if self.work is None or replica is None:
            return False
        cap = self.cap_of(name)
        if cap == replica.cap:
            return False
        raised = cap is None or (replica.cap is not None and cap > replica.cap)
        replica.cap = cap
        self.table.refresh(name)
        return raised

    def _room_taken(self, name: str) -> None:
        """A returning turn grew (or was held on) the replica's working set: recompute a cap that could stand above
        the room left.

        A cap at or under the live count admits nothing new and stays valid, so only a cap above it is recomputed
        (under load that is one comparison; otherwise a pass over the replica's idle sessions). The new cap can also
        be higher (leases ended since the last recompute), but that never strands a queued session here: while one
        is queued no replica accepts new sessions (:meth:`admit` would have placed the head): each has its cap at or
        under its live count, so this recompute does not run, or takes none for a reason a higher cap cannot lift
        (quarantined, draining, not ready). Room that ended leases free while sessions queue is found at the next
        tick (once per scrape round, 1 s by default).
        """
        replica = self.table.replicas.get(name)
        if self.work is not None and replica is not None and (replica.cap is None or replica.cap > replica.live):
            self._kv_cap(name)

    # -- replica state ----------------------------------------------------------------------

    def set_ready(self, name: str, ready: bool, *, now: float) -> bool:
        """Mark a replica ready or not (an unready one takes no sessions); whether it changed."""
        replica = self.table.replicas.get(name)
        if replica is None or replica.ready == ready:
            return False
        replica.ready = ready
        self.table.refresh(name)
        if ready:
            self.admit(now=now)
        return True

    def set_ready_together(self, names: Iterable[str], *, now: float) -> list[str]:
        """Mark several replicas ready at once, then admit the queue once; the names that changed.

        Replicas that come back in one scrape round are ready together before a queued session is
        placed, so the policy spreads the queue over them instead of piling it on the first one.
        """
        changed = []
        for name in names:
            replica = self.table.replicas.get(name)
            if replica is not None and not replica.ready:
                replica.ready = True
                self.table.refresh(name)
                changed.append(name)
        if changed:
            self.admit(now=now)
        return changed

    def set_draining(self, name: str, draining: bool, *, now: float) -> bool:
        """Drain a replica (keeps its sessions, takes no new ones) or undo it; whether it changed."""
        replica = self.table.replicas[name]
        if replica.draining == draining:
            return False
        replica.draining = draining
        self.table.refresh(name)
        if not draining:
            self.admit(now=now)
        return True

    def set_capacity(self, name: str, *, capacity_tokens: int | None, block_size: int | None, now: float) -> None:
        """A replica's reported KV capacity and block size (None: keep the last report); recomputes its cap."""
        limits = self.limits[name]
        if block_size:
            limits.block_size = block_size
        if capacity_tokens is not None:
            limits.capacity_tokens = capacity_tokens
            self.table.replicas[name].kv_capacity_tokens = capacity_tokens
            if self.work is not None:
                self.work.set_capacity(name, capacity_tokens)
        self._now = now
        self._apply_cap(name, now=now)

    def set_operator_limit(self, name: str, limit: OperatorLimit | None, *, now: float) -> bool:
        """The operator's cap and quarantine of one replica; whether they changed."""
        limits = self.limits.get(name)
        if limits is None or limits.operator == limit:
            return False
        limits.operator = limit
        if self.work is not None:
            self.work.set_target(name, None if limit is None else limit.target)
        self._apply_cap(name, now=now)
        self._sync_quarantine(name, now=now)
        return True

    def set_operator_limits(self, limits: Mapping[str, OperatorLimit], *, now: float) -> list[str]:
        """One status update of the operator for every replica (absent: no limit); the replicas that changed.

        All limits apply before any queued session is admitted: a status is one decision, and admitting
        half-way would favour the replicas applied first.
        """
        self._holding = True
        try:
            changed = [name for name in list(self.limits) if self.set_operator_limit(name, limits.get(name), now=now)]
        finally:
            self._holding = False
        self.admit(now=now)
        return changed

    def observe_scrape(
        self,
        name: str,
        *,
        now: float,
        preemptions_total: float,
        waiting: float,
        kv_usage: float | None = None,
    ) -> None:
        """A scrape's pressure signals, fed to the replica's fast quarantine."""
        grace = self.weights.in_grace(name, now=now)  # the burst of re-prefills after a weight update
        pressure = self.limits[name].pressure
        if pressure is None:
            return
        before = pressure.quarantines
        if grace:
            observe_scrape_excused(pressure, now=now, preemptions_total=preemptions_total)
        else:
            pressure.observe_scrape(now=now, preemptions_total=preemptions_total, waiting=waiting, kv_usage=kv_usage)
        self._sync_quarantine(name, now=now, entered=pressure.quarantines > before)

    def _apply_cap(self, name: str, *, now: float) -> None:
        replica = self.table.replicas[name]
        cap = self.cap_of(name)
        if cap != replica.cap:
            replica.cap = cap
            self.table.refresh(name)
            self.events.append(CapChanged(name, cap, self.limits[name].capacity_tokens))
            self.admit(now=now)

    def _sync_quarantine(self, name: str, *, now: float, entered: bool = False) -> None:
        replica = self.table.replicas[name]
        limits = self.limits[name]
        pressure = limits.pressure
        own = pressure is not None and pressure.quarantined
        was = replica.quarantined
        replica.quarantined = own or bool(limits.operator and limits.operator.quarantined)
        if was != replica.quarantined:
            self.table.refresh(name)
        if entered or was != replica.quarantined:
            reason = pressure.reason if pressure is not None and own else None
            self.events.append(QuarantineChanged(name, replica.quarantined, entered, reason))
        if was and not replica.quarantined:
            self.admit(now=now)
