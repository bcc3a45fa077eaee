"""The session ledger: one pure owner of the session lifecycle, driven by the router and the simulator (pure).

It holds the session table (:mod:`~rolloutpool.routing.table`), the placement policy, each
replica's limits (its fixed cap, reported KV capacity and block size, the operator's cap and
quarantine, the fast quarantine's :class:`~rolloutpool.routing.quarantine.PressureState`; kept,
with the caps they give, by its base in :mod:`~rolloutpool.routing.ledger_replicas`) and the
admission queue as data. Every operation takes ``now`` and returns its answer; what else it
changed (queued sessions admitted, sessions released, quarantine, caps) is appended to
:attr:`Ledger.events` for the caller to act on (:mod:`~rolloutpool.routing.events`). The router
adds futures, HTTP, metrics and logs; the simulator submits turns to its engine models. So the
simulator runs the router's lifecycle, not a copy of it.

The lifecycle:

- a turn of a live session returns to its replica (sticky policies) unless that replica is gone
  or not ready; then the session is released (``replaced``) and placed again as a new one;
- a new session is placed by the policy, unless sessions already wait (FIFO: nobody overtakes
  the queue) or no replica may take it; then it queues (bounded by ``queue_max``);
- queued sessions are admitted oldest first whenever a slot may have freed (a release, an expiry,
  a replica added or ready again, a cap raised, a quarantine lifted, a drain undone); the head
  blocks the rest;
- ``release`` is idempotent and never blocks: for a session with a request in flight it marks
  the session, which is released when its last request ends; an id released and seen again is a
  NEW session (placed again); a one-turn session (a request without a session id) holds no slot
  after its turn.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from rolloutpool.routing.events import (
    Admitted,
    Arrival,
    Bound,
    Event,
    Held,
    Placed,
    Queued,
    Rejected,
    Released,
    Usage,
    Waiting,
    Withdrawn,
)
from rolloutpool.routing.ledger_turns import TurnControls
from rolloutpool.routing.limits import LedgerConfig, ReplicaLimits
from rolloutpool.routing.policies import Placement, Policy
from rolloutpool.routing.quarantine import PressureState
from rolloutpool.routing.table import Session, SessionTable
from rolloutpool.routing.weights import WeightTracker
from rolloutpool.routing.workingset import WorkingSet

__all__ = ["Ledger", "LedgerConfig", "ReplicaLimits", "Usage", "Waiting"]

_NOT_FINISHED = frozenset(
    {
        "replaced",
        "upstream_error",
        "replica_lost",
        "moved",
        "rejected",
        "implicit_idle",
        "implicit_evicted",
        "implicit_yield",
    }
)
"""Release paths that say nothing about the replica's pressure (the session did not finish there; ``rejected``:
the engine refused the request that created it; ``implicit_*``: a sessionless conversation's index entry timed
out or was evicted, which says nothing of whether the rollout finished, routing/implicit.py)."""


def _turn_scheduler(config: LedgerConfig) -> WorkingSet | None:
    """Our working set, or a peer's scheduler in its place (it takes precedence), or none."""
    if config.scheduler is not None:
        return config.scheduler()
    return None if config.working_set is None else WorkingSet(config.working_set)


class Ledger(TurnControls):
    """Sessions, replicas, limits and the admission queue; every mutation keeps counts exact.

    Replica state (readiness, drain, capacity, the operator's limits, the fast quarantine) and the caps it gives
    are its bases' (:mod:`~rolloutpool.routing.ledger_replicas`), and so are the requests of live sessions, their
    usage and held turns (:mod:`~rolloutpool.routing.ledger_turns`).
    """

    def __init__(self, config: LedgerConfig, *, policy: Policy) -> None:
        self.config = config
        self.policy = policy
        self.table = SessionTable(indexed=True)
        self.limits: dict[str, ReplicaLimits] = {}
        self.queue: deque[Waiting] = deque()
        self.closed = False
        self.events: list[Event] = []
        """What operations changed besides their answer, oldest first (see :meth:`take_events`)."""
        self.weights = WeightTracker()
        """Weight updates: a flush's or a new salt's re-prefill is measured, never taken for eviction."""
        self._tickets = 0
        self._now = 0.0
        """The latest ``now`` an operation was given (caps computed between operations use it)."""
        self.work = _turn_scheduler(config)
        """Turn-level scheduling: working sets, held turns, prefixes let go (routing/workingset.py; a peer's,
        routing/peers/, when ``config.scheduler`` is set)."""
        self.held: dict[str, list[int]] = {}
        """Session id -> the tickets of its held turn, oldest first (one per request of the turn that waits)."""
        self.let_go_reprefill: dict[str, int] = {}
        """Per replica: tokens re-prefilled by sessions whose prefix the working set let go (by decision)."""
        self._holding = False
        """Admissions wait (one operator status applies as a whole)."""

    def take_events(self) -> list[Event]:
        """The events since the last call (and forget them)."""
        events, self.events = self.events, []
        return events

    # -- membership ---------------------------------------------------------------------

    def add_replica(
        self, name: str, *, now: float, fixed_cap: int | None = None, capacity_tokens: int | None = None
    ) -> None:
        """Start placing on a replica (a known name is left as it is: remove it first to replace it)."""
        if name in self.limits:
            return
        quarantine = self.config.quarantine
        limits = ReplicaLimits(
            fixed_cap=fixed_cap,
            capacity_tokens=capacity_tokens,
            block_size=self.config.default_block_size,
            pressure=None if quarantine is None else PressureState(quarantine),
        )
        self.limits[name] = limits
        if self.work is not None:
            self.work.add_replica(name, capacity=capacity_tokens)
        self.table.add_replica(name, cap=self.cap_of(name), kv_capacity_tokens=capacity_tokens)
        self.admit(now=now)

    def remove_replica(self, name: str) -> list[Session]:
        """Stop placing on a replica; its sessions stop being live (placed again on their next turn)."""
        state = self.table.replicas.get(name)
        if state is None:
            return []
        lost = [self.table.sessions[sid] for sid in sorted(state.sessions)]
        for session in lost:
            self._unhold(session.session_id)
            if self.work is not None:
                self.work.released(session.session_id)
        if self.work is not None:
            self.work.remove_replica(name)
        self.table.remove_replica(name)
        del self.limits[name]
        self.weights.forget_replica(name)
        for session in lost:
            self.weights.forget(session.session_id)
        self.events.extend(Released(s, "replica_lost") for s in lost)
        return lost

    # -- views ----------------------------------------------------------------------------

    def lookup(self, session_id: str) -> Session | None:
        """The live session, or None (also while its release waits for its request to end)."""
        session = self.table.sessions.get(session_id)
        return None if session is None or session.release_how is not None else session

    def renews(self, session_id: str, *, resident: int | None) -> bool:
        """Whether prefix renewal should refresh the session's cached context now (the turn scheduler's
        :meth:`~rolloutpool.routing.workingset.WorkingSet.renews`; without one, always)."""
        return self.work is None or self.work.renews(session_id, resident=resident)

    @property
    def now(self) -> float:
        """The time of the latest event the ledger was told of (caps are computed as of then)."""
        return self._now

    # -- arrivals and admission -------------------------------------------------------------

    def arrive(self, placement: Placement, *, now: float, one_turn: bool = False) -> Arrival:
        """A turn of ``placement.session_id`` arrives: where it goes, or that it queues, is held or is refused."""
        self._now = now
        sid = placement.session_id
        current = self.table.sessions.get(sid)
        if current is not None and current.release_how is not None:
            self._drop(current, current.release_how, now=now)  # released while its last turn ran: a new session
            current = None
        if current is not None:
            replica = self.table.replicas.get(current.replica)
            if replica is not None and replica.ready:
                if self.policy.sticky:
                    return self._return(current, now=now, resident=placement.resident_tokens, turns=placement.turns)
                return self._route_again(current, placement, now=now)
            self._drop(current, "replaced", now=now)
            # Re-placed mid-rollout: its next usage is its whole context, not the prompt its group shares, so it
            # joins no group (counted whole, as any session; the group's other members keep their discount).
            placement = replace(placement, group=None)
        if self.closed:
            return Rejected("shutting_down")
        if not self.queue:
            session = self._place(placement, now=now, kind="new", one_turn=one_turn)
            if session is not None:
                return Bound(session, created=True)
        if self.config.queue_max is not None and len(self.queue) >= self.config.queue_max:
            return Rejected("queue_full")
        self._tickets += 1
        self.queue.append(Waiting(self._tickets, placement, now, one_turn))
        return Queued(self._tickets)

    def _return(self, current: Session, *, now: float, resident: int | None, turns: bool = True) -> Arrival:
        """A live session's turn on its replica: served now, or held for room (routing/workingset.py)."""
        current.last_seen = now
        work = self.work
        served = work is None or not turns or work.arrive(current.session_id, now=now, resident=resident)
        self._room_taken(current.replica)
        if work is None or served:
            return Bound(self._follow(current, now=now), created=False)
        if self.closed:  # shutting down: close() withdrew every waiter
            work.unhold(current.session_id, now=now)
            return Rejected("shutting_down")
        if current.session_id in self.held:  # another request of a held turn
            self._tickets += 1  # waits with the first: it neither moves the session nor replaces that ticket
            self.held[current.session_id].append(self._tickets)
            return Held(self._tickets)
        candidates = [r.name for r in self.table.replicas.values() if r.accepts_new()]
        name = work.move_target(current.session_id, candidates, resident=resident, now=now)
        if name is not None:
            return Bound(self._move(current, name, now=now), created=False)
        self._tickets += 1
        self.held[current.session_id] = [self._tickets]
        return Held(self._tickets)

    def _route_again(self, current: Session, placement: Placement, *, now: float) -> Arrival:
        """A non-sticky policy chooses every turn; a session that moves is bound anew on its new replica."""
        name = self.policy.choose(placement, self.table)
        if name is None or name == current.replica:
            current.last_seen = now
            return Bound(current, created=False)
        session = self._bind(placement, name, now=now, one_turn=False)
        self.events.append(Placed(session, "moved"))
        return Bound(session, created=False)

    def _bind(self, placement: Placement, name: str, *, now: float, one_turn: bool) -> Session:
        moved_from = self.table.sessions.get(placement.session_id)
        session = self.table.bind(
            placement.session_id,
            name,
            now=now,
            group=placement.group,
            projected_tokens=placement.projected_tokens,
            prompt_tokens=placement.prompt_tokens,
        )
        session.one_turn = one_turn
        if self.work is not None and not placement.turns:
            self.work.released(placement.session_id)  # direct placement: not in the working set
            if moved_from is not None and moved_from.replica != name:
                self._kv_cap(moved_from.replica)
            self._kv_cap(name)
        elif self.work is not None:
            if moved_from is not None:
                self._unhold(placement.session_id)
            first = None if not placement.prompt_tokens else placement.prompt_tokens + int(self.work.growth) // 2
            self.work.make_room(name, first or int(self.work.first_context), now=now)
            self.work.bound(
                placement.session_id,
                name,
                now=now,
                first_context=first,
                group=placement.group,
                shared=placement.prompt_tokens if placement.group is not None else 0,
            )
            if moved_from is not None and moved_from.replica != name:
                self._kv_cap(moved_from.replica)
            self._kv_cap(name)
        return session

    def _place(self, placement: Placement, *, now: float, kind: str, one_turn: bool) -> Session | None:
        if self.closed:
            return None
        name = self.policy.choose(placement, self.table)
        if name is None:
            return None
        session = self._bind(placement, name, now=now, one_turn=one_turn)
        self.events.append(Placed(session, kind))
        return session

    def admit(self, *, now: float) -> None:
        """Place queued sessions, oldest first, while a replica may take them (FIFO: the head blocks)."""
        self._now = now
        while self.queue and not self.closed and not self._holding:
            head = self.queue[0]
            sid = head.placement.session_id
            existing = self.table.sessions.get(sid)
            if existing is not None and existing.release_how is not None:
                self._drop(existing, existing.release_how, now=now, admit=False)
                existing = None
            session = existing or self._place(head.placement, now=now, kind="queued", one_turn=head.one_turn)
            if session is None:
                return
            self.queue.popleft()
            self.events.append(Admitted(head.ticket, session))

    def cancel(self, ticket: int, *, now: float) -> bool:
        """Take a waiting session out of the queue (its client gave up or timed out); whether it was queued."""
        for waiting in self.queue:
            if waiting.ticket == ticket:
                self.queue.remove(waiting)
                self.admit(now=now)  # the head may have been what blocked (a policy may size by request)
                return True
        return False

    def close(self) -> None:
        """Refuse new sessions and withdraw every waiting one (shutdown)."""
        self.closed = True
        while self.queue:
            waiting = self.queue.popleft()
            self.events.append(Withdrawn(waiting.ticket, waiting.placement.session_id, "shutting_down"))
        for ticket, sid in sorted((t, sid) for sid, tickets in self.held.items() for t in tickets):
            self.events.append(Withdrawn(ticket, sid, "shutting_down"))
        self.held.clear()

    # -- release ----------------------------------------------------------------------------

    def release(self, session_id: str, *, how: str, now: float) -> Session | None:
        """Release a session; the session, or None when there was nothing to release (idempotent, never blocks).

        A session with a request in flight is marked and released when its last request ends
        (:meth:`turn_ended`); it is no longer :meth:`lookup`-able, and its id seen again is a new session.
        Requests of the id still waiting in the queue leave it, so it is never placed after its release.
        """
        withdrawn = [w for w in self.queue if w.placement.session_id == session_id]
        for waiting in withdrawn:
            self.queue.remove(waiting)
            self.events.append(Withdrawn(waiting.ticket, session_id, "released"))
        session = self.table.sessions.get(session_id)
        if session is None or session.release_how is not None:
            if withdrawn:
                self.admit(now=now)
            return None
        if session.inflight > 0:
            session.release_how = how
            return session
        self._drop(session, how, now=now)
        return session

    def _drop(self, session: Session, how: str, *, now: float, admit: bool = True) -> None:
        self.table.release(session.session_id)
        if self.work is not None:
            self._unhold(session.session_id)
            self.work.released(session.session_id)
            self._kv_cap(session.replica)
            self._resume(session.replica, now=now)
        self.weights.forget(session.session_id)
        self.events.append(Released(session, how))
        limits = self.limits.get(session.replica)
        if limits is not None and limits.pressure is not None and how not in _NOT_FINISHED:
            limits.pressure.session_finished()
            self._sync_quarantine(session.replica, now=now)
        if admit:
            self.admit(now=now)

    def expire(self, *, now: float, idle_timeout: float) -> list[Session]:
        """Release sessions idle longer than ``idle_timeout``; one with a request in flight or held is never idle."""
        stale = [
            s
            for s in self.table.sessions.values()
            if s.inflight == 0 and s.session_id not in self.held and now - s.last_seen > idle_timeout
        ]
        for session in stale:
            self._drop(session, "expired", now=now, admit=False)
        if stale:
            self.admit(now=now)
        return stale

    def restore(
        self, session_id: str, replica: str, *, group: str | None, last_seen: float, context: int, prompt: int = 0
    ) -> None:
        """Re-create a session from a snapshot (no placement decision); ``prompt``: its first turn's (0: unknown)."""
        session = self.table.bind(session_id, replica, now=last_seen, group=group, prompt_tokens=prompt)
        session.context_tokens = context
        if self.work is not None:
            shared = prompt if group is not None else 0  # what its group shares (counted once per replica)
            self.work.restored(session_id, replica, context=context, now=last_seen, group=group, shared=shared)
            self._kv_cap(replica)
