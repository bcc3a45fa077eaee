"""The turns of live sessions in the session ledger: served, held, resumed or moved, and their usage (pure).

:class:`TurnControls` is the base of :class:`~rolloutpool.routing.ledger.Ledger` between it and
:class:`~rolloutpool.routing.ledger_replicas.ReplicaControls`: a request of a session starts and ends, its
usage is compared with the session's previous context (re-prefill, the fast quarantine), and the turn
scheduler's held turns are resumed when they fit, moved when their replica is gone, or cancelled by their
client. The ledger owns the attributes declared here, the admission queue and placement; a turn that ends a
session calls its :meth:`~TurnControls._drop`.
"""

from __future__ import annotations

from collections import deque

from rolloutpool.routing.events import Placed, Resumed, Usage, Waiting, Withdrawn
from rolloutpool.routing.ledger_replicas import ReplicaControls
from rolloutpool.routing.quarantine import expected_cached_tokens
from rolloutpool.routing.reprefill import reprefill_tokens
from rolloutpool.routing.table import Session

__all__ = ["TurnControls"]


class TurnControls(ReplicaControls):
    """Requests, usage and held turns of the ledger's sessions (its base; the ledger sets every attribute here)."""

    queue: deque[Waiting]
    held: dict[str, list[int]]
    let_go_reprefill: dict[str, int]

    def _drop(self, session: Session, how: str, *, now: float, admit: bool = True) -> None:
        """Release ``session`` now (the ledger's release path)."""
        raise NotImplementedError

    def is_current(self, session: Session) -> bool:
        """Whether ``session`` is still the binding of its id (not released or re-placed since)."""
        return self.table.sessions.get(session.session_id) is session

    def _follow(self, session: Session, *, now: float) -> Session:
        """A session the scheduler resumes on another replica (a peer's, routing/peers/) is bound there first."""
        name = None if self.work is None else self.work.destination(session.session_id)
        if name is None or name == session.replica or name not in self.table.replicas:
            return session
        return self._rebind(session, name, now=now)

    def _move(self, current: Session, name: str, *, now: float) -> Session:
        """A session whose turn would wait moves once to ``name``, where it fits now (its prefix was gone anyway)."""
        assert self.work is not None  # noqa: S101 - only turn scheduling moves sessions
        self.work.move(current.session_id, name, now=now)
        session = self._rebind(current, name, now=now)
        self._resume(current.replica, now=now)
        return session

    def _rebind(self, session: Session, name: str, *, now: float) -> Session:
        """``session`` live on ``name`` instead, with what it knew of its context; caps of both replicas follow."""
        moved = self.table.bind(
            session.session_id,
            name,
            now=now,
            group=session.group,
            projected_tokens=session.projected_tokens,
            prompt_tokens=session.prompt_tokens,
        )
        moved.context_tokens, moved.last_seen = session.context_tokens, session.last_seen
        self._kv_cap(session.replica)
        self._kv_cap(name)
        self.events.append(Placed(moved, "moved"))
        return moved

    def turn_started(self, session: Session) -> None:
        """A request of ``session`` is being served (a stale binding pins nothing)."""
        if self.is_current(session):
            session.inflight += 1
        replica = self.table.replicas.get(session.replica)
        if replica is not None:
            replica.inflight += 1

    def turn_ended(self, session: Session, *, now: float, tool_s: float | None = None) -> None:
        """The request started by :meth:`turn_started` is over; a release asked for meanwhile happens now.

        ``tool_s``: the tool call's duration, told only by a simulated reference (``WorkingSet.turn_finished``)."""
        replica = self.table.replicas.get(session.replica)
        if replica is not None and replica.inflight > 0:
            replica.inflight -= 1
        if not self.is_current(session):
            return
        if session.inflight > 0:
            session.inflight -= 1
        session.last_seen = now
        if session.inflight == 0 and (session.release_how is not None or session.one_turn):
            self._drop(session, session.release_how or "request", now=now)
        elif session.inflight == 0 and self.work is not None:
            self._now = now
            first = self.work.first_context
            self.work.turn_finished(
                session.session_id,
                context=session.context_tokens or None,
                now=now,
                prompt=session.prompt_tokens,
                tool_s=tool_s,
            )
            # a new session's expected context is learned fleet-wide: every replica's room for new ones moves
            touched = list(self.table.replicas) if self.work.first_context != first else [session.replica]
            raised = [name for name in touched if self._kv_cap(name)]
            self._resume(session.replica, now=now)
            if raised:
                self.admit(now=now)

    def finish_turn(self, session: Session, *, now: float, usage: Usage | None) -> tuple[int, int]:
        """A turn's usage: spot re-prefill (as :meth:`observe_cached`), then remember the new context.

        Without usage the context is forgotten, so the next turn is not compared with a stale one.
        """
        if not self.is_current(session):
            return 0, 0  # released (or re-placed) while the request ran
        if usage is None:
            session.context_tokens = 0
            return 0, 0
        checked = self.observe_cached(session, now=now, usage=usage)
        if not session.prompt_tokens and not session.context_tokens:  # its first turn: what a group shares
            session.prompt_tokens = usage.prompt_tokens
        session.context_tokens = usage.prompt_tokens + usage.completion_tokens
        return checked

    def observe_cached(self, session: Session, *, now: float, usage: Usage) -> tuple[int, int]:
        """Compare ``cached_tokens`` with the session's previous context: (expected cached, shortfall).

        A shortfall is re-prefill of a live session's evicted prefix, fed to the fast quarantine. A session whose
        prefix the working set let go re-prefills by decision: that is counted in :attr:`let_go_reprefill`, not in
        the shortfall. Used for turns (:meth:`finish_turn`) and prefix renewals (the context is unchanged).
        """
        excuse = self.weights.excuse(session.session_id, session.replica)  # every answered turn leaves its mark
        limits = self.limits.get(session.replica)
        if limits is None or session.context_tokens <= 0 or usage.cached_tokens is None:
            return 0, 0
        expected = expected_cached_tokens(
            previous_context=session.context_tokens - 1,
            prompt_tokens=usage.prompt_tokens,
            block_size=limits.block_size,
        )
        if excuse is not None:  # a weight update's re-prefill (routing/weights.py): measured, not eviction
            return expected, 0
        counted = reprefill_tokens(  # one block of tolerance; none with caching off (routing/reprefill.py)
            expected_cached=expected,
            cached=usage.cached_tokens,
            block_size=limits.block_size,
            prefix_caching=limits.prefix_caching,
        )
        if self.work is not None and self.work.lapsed(session.session_id):
            self.let_go_reprefill[session.replica] = self.let_go_reprefill.get(session.replica, 0) + counted
            return expected, 0
        pressure = limits.pressure
        if pressure is None:
            return expected, counted
        before = pressure.quarantines
        shortfall = pressure.observe_response(now=now, expected_cached=expected, cached=expected - counted)
        self._sync_quarantine(session.replica, now=now, entered=pressure.quarantines > before)
        return expected, shortfall

    def cancel_held(self, session_id: str, *, now: float, ticket: int | None = None) -> bool:
        """A held request's client gave up (``ticket``; None: the oldest); whether it was held.

        The turn leaves the hold with its last waiting request; the session stays (let go).
        """
        tickets = self.held.get(session_id)
        if not tickets or self.work is None or (ticket is not None and ticket not in tickets):
            return False
        tickets.remove(tickets[0] if ticket is None else ticket)
        if tickets:
            return True  # another request of the turn still waits
        del self.held[session_id]
        self.work.unhold(session_id, now=now)
        self._resume(self.table.sessions[session_id].replica, now=now)
        return True

    def withdraw_resumed(self, session: Session, *, now: float) -> None:
        """A resumed turn's client gave up before its request started (:meth:`turn_started`): the turn is withdrawn."""
        if self.work is not None and self.is_current(session) and session.inflight == 0:
            self.work.unhold(session.session_id, now=now)
            self._resume(session.replica, now=now)

    def _unhold(self, session_id: str) -> None:
        """A held turn of a session that ends (or moves) leaves: its waiter is told."""
        for ticket in self.held.pop(session_id, ()):
            self.events.append(Withdrawn(ticket, session_id, "released"))

    def _resume(self, name: str, *, now: float) -> None:
        """Serve the replica's held turns that fit now (routing/workingset.py), then new sessions if room is left; a
        replica not ready serves none: they move to a ready one with room (as in :meth:`_return`), or wait."""
        if self.work is None:
            return
        self._now = now
        replica = self.table.replicas.get(name)
        if replica is None or replica.ready:
            resumed = self.work.resume(name, now=now)
        else:
            mine = [sid for sid in self.held if self.table.sessions[sid].replica == name]
            resumed = [sid for sid in mine if self._move_held(sid, now=now)]
        for sid in resumed:
            tickets = self.held.pop(sid, ())
            session = self.table.sessions.get(sid)
            if tickets and session is not None:
                session = self._follow(session, now=now)
                self.events.extend(Resumed(ticket, session) for ticket in tickets)
        if self._kv_cap(name) or resumed:
            self.admit(now=now)

    def _move_held(self, sid: str, *, now: float) -> bool:
        """A held turn of a replica not ready moves where it fits now (its cache is out of reach); whether it moved."""
        assert self.work is not None  # noqa: S101 - only turn scheduling holds turns
        candidates = [r.name for r in self.table.replicas.values() if r.accepts_new()]
        name = self.work.move_target(sid, candidates, resident=None, now=now)
        if name is not None:
            self.work.move(sid, name, now=now)
            self._rebind(self.table.sessions[sid], name, now=now)
        return name is not None

    def tick(self, *, now: float) -> None:
        """Time passed (once per scrape round): held turns that now fit or waited their limit go, caps follow."""
        self._now = now
        if self.work is None:
            return
        for name in list(self.table.replicas):
            self._resume(name, now=now)
        if self.queue:
            self.admit(now=now)
