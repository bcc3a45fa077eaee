"""The session table: which replica holds which live session, and per-replica limits (pure).

A session is live from its first placement until it is released (explicitly, or by
idle expiry). Live counts are derived from the table itself, so they can never go
negative or drift from the sessions actually held.

An ``indexed`` table also keeps a heap of the replicas that accept new sessions, by (live
sessions, table order), so the least loaded eligible replica is found in O(log n) instead of a
scan of every replica (1,000 replicas: a scan costs hundreds of microseconds). Its owner (the
ledger) must call :meth:`SessionTable.refresh` after changing a replica's cap, quarantine,
readiness or drain; live counts are tracked by the table itself. A plain table scans.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["ReplicaState", "Session", "SessionTable"]


@dataclass
class ReplicaState:
    """What placement knows about one replica."""

    name: str
    cap: int | None = None
    """Live-session cap; None means unlimited."""
    quarantined: bool = False
    """Receives no new sessions."""
    ready: bool = True
    """Serving; an unready replica receives nothing."""
    draining: bool = False
    """Being removed: keeps its sessions, receives no new ones."""
    kv_capacity_tokens: int | None = None
    """KV capacity, for policies that pack by tokens."""
    inflight: int = 0
    """Requests currently being served (for request-level policies)."""
    sessions: set[str] = field(default_factory=set)
    """Live sessions held."""

    @property
    def live(self) -> int:
        """Live sessions held."""
        return len(self.sessions)

    def accepts_new(self) -> bool:
        """Whether a new session may be placed here under the cap."""
        if not self.ready or self.draining or self.quarantined:
            return False
        return self.cap is None or self.live < self.cap


@dataclass(slots=True)
class Session:
    """One live session."""

    session_id: str
    replica: str
    group: str | None
    last_seen: float
    context_tokens: int = 0
    """Prompt + output tokens of its last completed turn (to spot re-prefill)."""
    projected_tokens: int = 0
    """Largest context it will reach, if known (clairvoyant placement)."""
    prompt_tokens: int = 0
    """Prompt tokens of its first turn, if known."""
    inflight: int = 0
    """Its requests being served (a session with one in flight is never idle)."""
    one_turn: bool = False
    """A request without a session id: released when its turn ends."""
    release_how: str | None = None
    """Set when its release was asked for while a request was in flight: released when the last one ends."""


class SessionTable:
    """Sessions and replicas; every mutation keeps counts exact."""

    def __init__(self, *, indexed: bool = False) -> None:
        self.replicas: OrderedDict[str, ReplicaState] = OrderedDict()
        self.sessions: dict[str, Session] = {}
        self._groups: dict[str, dict[str, int]] = {}
        self._order: dict[str, int] = {}
        """Replica -> a number that grows with insertion (table order, also across a remove and re-add)."""
        self._added = 0
        self._indexed = indexed
        self._heap: list[tuple[int, int, str]] = []
        """(live, order, name) of replicas that accepted new sessions when pushed; stale entries are skipped."""

    def add_replica(self, name: str, **fields: object) -> ReplicaState:
        """Add (or return) a replica."""
        if name not in self.replicas:
            self.replicas[name] = ReplicaState(name=name, **fields)  # type: ignore[arg-type]
            self._added += 1
            self._order[name] = self._added
            self.refresh(name)
        return self.replicas[name]

    def order(self, name: str) -> int:
        """The replica's place in table order (smaller: added earlier)."""
        return self._order[name]

    def refresh(self, name: str) -> None:
        """The replica's live count or eligibility changed: index it again (indexed tables)."""
        if not self._indexed:
            return
        state = self.replicas.get(name)
        if state is not None and state.accepts_new():
            heapq.heappush(self._heap, (state.live, self._order[name], name))
        if len(self._heap) > 4 * len(self.replicas) + 64:  # compact: drop stale entries, amortised O(1)
            self._heap = [(r.live, self._order[n], n) for n, r in self.replicas.items() if r.accepts_new()]
            heapq.heapify(self._heap)

    def least_eligible(self) -> ReplicaState | None:
        """The replica with the fewest live sessions among those accepting new ones (first in table order)."""
        if not self._indexed:
            eligible = [r for r in self.replicas.values() if r.accepts_new()]
            return min(eligible, key=lambda r: r.live) if eligible else None
        heap = self._heap
        while heap:
            live, order, name = heap[0]
            state = self.replicas.get(name)
            if state is not None and self._order[name] == order and state.live == live and state.accepts_new():
                return state
            heapq.heappop(heap)
        return None

    def remove_replica(self, name: str) -> list[str]:
        """Drop a replica; its sessions are released and returned (re-placed on their next turn)."""
        state = self.replicas.pop(name, None)
        if state is None:
            return []
        lost = sorted(state.sessions)
        for sid in lost:
            self._ungroup(self.sessions.pop(sid))
        del self._order[name]
        return lost

    def lookup(self, session_id: str) -> Session | None:
        """The live session, or None."""
        return self.sessions.get(session_id)

    def bind(
        self,
        session_id: str,
        replica: str,
        *,
        now: float,
        group: str | None = None,
        projected_tokens: int = 0,
        prompt_tokens: int = 0,
    ) -> Session:
        """Make ``session_id`` live on ``replica`` (moving it if it was elsewhere)."""
        self.release(session_id)
        session = Session(
            session_id, replica, group, now, projected_tokens=projected_tokens, prompt_tokens=prompt_tokens
        )
        self.sessions[session_id] = session
        self.replicas[replica].sessions.add(session_id)
        self.refresh(replica)
        if group is not None:
            members = self._groups.setdefault(group, {})
            members[replica] = members.get(replica, 0) + 1
        return session

    def release(self, session_id: str) -> Session | None:
        """End a session; returns it, or None when unknown (never a negative count)."""
        session = self.sessions.pop(session_id, None)
        if session is not None:
            state = self.replicas.get(session.replica)
            if state is not None:
                state.sessions.discard(session_id)
                self.refresh(session.replica)
            self._ungroup(session)
        return session

    def _ungroup(self, session: Session) -> None:
        if session.group is None:
            return
        members = self._groups.get(session.group, {})
        count = members.get(session.replica, 0) - 1
        if count > 0:
            members[session.replica] = count
        else:
            members.pop(session.replica, None)
            if not members:
                self._groups.pop(session.group, None)

    def expire(self, *, now: float, idle_timeout: float) -> list[Session]:
        """Release sessions idle longer than ``idle_timeout``; returns them."""
        stale = [s for s in self.sessions.values() if now - s.last_seen > idle_timeout]
        for session in stale:
            self.release(session.session_id)
        return stale

    def group_replicas(self, group: str) -> dict[str, int]:
        """Live members of ``group`` per replica."""
        return dict(self._groups.get(group, {}))

    def group_members(self, group: str) -> dict[str, int]:
        """Live members of ``group`` per replica, without a copy (read it, do not change it)."""
        return self._groups.get(group) or {}
