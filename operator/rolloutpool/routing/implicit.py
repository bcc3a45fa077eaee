"""Implicit sessions: requests without a session id matched to the conversation they extend (pure).

The index maps prefix digests (:mod:`rolloutpool.routing.prefixkey`) to implicit session ids,
bounded by ``max_entries`` digests (least recently used evicted first) and by ``idle_timeout_s``.
Each implicit session keeps its *prompt key* (the last digest of its latest request) and its
*tips* (the digests of that request's prompt + answer, :mod:`rolloutpool.routing.answers`).

A request's chain is looked up longest prefix first. The first digest found decides:

- it is a tip of its session, and that session has no turn in flight: the request extends the
  session's latest turn: it **continues** that session (same replica, the same ledger session);
- it is the session's prompt key, no tip of that turn is known (the answer was not in the
  response), the request is longer than that prompt and the session is idle: it continues too;
- otherwise the request shares a prefix with the session without extending its latest turn: a
  GRPO sample of the same prompt while the first is still running, a second sample later, a
  retry. It is a **new** session (``forked``), given the first session's group so that the
  placement policy co-locates it (the shared prefix is cached there), until ``yield_after`` forks
  of one prefix: later ones get no group and go where the policy puts them (``yielded``);
- nothing found: a new session (``created``).

Nothing here reads a clock: every call takes ``now``. Memory: at most ``max_entries`` digests
(16 bytes each) and one small record per implicit session that still owns a digest.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["ImplicitConfig", "ImplicitIndex", "ImplicitSession", "Match", "Outcome"]

Outcome = Literal["matched", "created", "forked", "yielded"]


@dataclass(frozen=True)
class ImplicitConfig:
    """Bounds of the implicit-session index."""

    max_entries: int = 65536
    """Most prefix digests remembered (16 bytes each, plus a dict slot); the oldest used goes first."""
    idle_timeout_s: float = 30.0
    """An implicit session idle this long is released (``implicit_idle``)."""
    yield_after: int = 16
    """Forks of one prefix co-located with its first session; later ones are placed freely."""
    yield_idle_s: float = 2.0
    """While new sessions wait for a place, implicit sessions idle this long are released, longest idle first
    (``implicit_yield``): nothing says a sessionless conversation ended, and a fixed cap would hold its slot for the
    whole idle timeout."""

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.yield_after < 0 or not self.idle_timeout_s > 0:
            raise ValueError("implicit sessions: max_entries >= 1, yield_after >= 0 and a positive idle timeout")


@dataclass
class ImplicitSession:
    """What the index knows of one implicit session."""

    session_id: str
    group: str
    """Shared by the sessions forked from this one (co-location)."""
    last_seen: float
    prompt_key: bytes | None = None
    prompt_links: int = 0
    """Links in the latest request's chain."""
    tips: tuple[bytes, ...] = ()
    inflight: int = 0
    keys: set[bytes] = field(default_factory=set)
    """The digests in the index that name this session."""


@dataclass(frozen=True)
class Match:
    """Where a sessionless request goes: its implicit session id, what happened, and its group."""

    session_id: str
    outcome: Outcome
    group: str | None
    """The co-location group: the session's own, shared with the sessions forked from it (None: yielded)."""


class ImplicitIndex:
    """Prefix digests -> implicit sessions, LRU-bounded; the router's and the tests' one implementation."""

    def __init__(self, config: ImplicitConfig | None = None, *, prefix: str = "implicit-") -> None:
        self.config = config or ImplicitConfig()
        self.prefix = prefix
        self.entries: OrderedDict[bytes, str] = OrderedDict()
        self.sessions: dict[str, ImplicitSession] = {}
        self.forks: dict[bytes, int] = {}
        """Per forked-from digest: how many sessions forked from it (bounded with the entries)."""
        self._ids = itertools.count(1)
        self._dropped: list[str] = []

    def __len__(self) -> int:
        return len(self.entries)

    # -- lookup ----------------------------------------------------------------------------

    def _find(self, chain: Sequence[bytes]) -> tuple[int, bytes, ImplicitSession] | None:
        for i in range(len(chain) - 1, -1, -1):
            sid = self.entries.get(chain[i])
            if sid is not None and sid in self.sessions:
                return i, chain[i], self.sessions[sid]
        return None

    def match(self, chain: Sequence[bytes], *, now: float) -> Match:
        """The implicit session of a request whose prompt has ``chain``; records the request as started."""
        found = self._find(chain)
        if found is None:
            return self._new(chain, now=now, outcome="created", group=None)
        at, key, session = found
        idle = session.inflight == 0
        if idle and key in session.tips:
            return self._continue(session, chain, now=now)
        if idle and not session.tips and key == session.prompt_key and len(chain) > at + 1:
            return self._continue(session, chain, now=now)
        forks = self.forks.get(key, 0) + 1
        self.forks[key] = forks
        if forks > self.config.yield_after:
            return self._new(chain, now=now, outcome="yielded", group=None)
        return self._new(chain, now=now, outcome="forked", group=session.group)

    def _continue(self, session: ImplicitSession, chain: Sequence[bytes], *, now: float) -> Match:
        self._started(session, chain, now=now)
        return Match(session.session_id, "matched", session.group)

    def _new(self, chain: Sequence[bytes], *, now: float, outcome: Outcome, group: str | None) -> Match:
        sid = f"{self.prefix}{next(self._ids)}"
        session = ImplicitSession(sid, group=group or f"{sid}-group", last_seen=now)
        self.sessions[sid] = session
        self._started(session, chain, now=now)
        return Match(sid, outcome, None if outcome == "yielded" else session.group)

    # -- a turn's life -----------------------------------------------------------------------

    def _started(self, session: ImplicitSession, chain: Sequence[bytes], *, now: float) -> None:
        session.inflight += 1
        session.last_seen = now
        session.tips = ()
        session.prompt_key = chain[-1] if chain else None
        session.prompt_links = len(chain)
        if session.prompt_key is not None:
            self._put(session.prompt_key, session)

    def answered(self, session_id: str, tips: Sequence[bytes], *, now: float) -> None:
        """The turn's answer is known: its tips name the session (the next turn extends one of them)."""
        session = self.sessions.get(session_id)
        if session is None:
            return
        session.last_seen = now
        session.tips = tuple(tips)
        for tip in tips:
            self._put(tip, session)

    def ended(self, session_id: str, *, now: float) -> None:
        """A request of the session is over (answered or not)."""
        session = self.sessions.get(session_id)
        if session is not None:
            session.inflight = max(0, session.inflight - 1)
            session.last_seen = now

    def forget(self, session_id: str) -> None:
        """The session is gone (released by the router): its digests no longer name it."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        for key in session.keys:
            if self.entries.get(key) == session_id:
                del self.entries[key]
            self.forks.pop(key, None)

    def expire(self, *, now: float, waiting: int = 0) -> list[tuple[str, str]]:
        """Sessions to release: (id, how): idle past the timeout, or left with no digest (evicted); and while
        ``waiting`` new sessions queue, as many idle past ``yield_idle_s`` (longest idle first)."""
        out = [(sid, "implicit_evicted") for sid in self._dropped if sid in self.sessions]
        self._dropped.clear()
        timeout = self.config.idle_timeout_s
        idle = sorted((s for s in self.sessions.values() if s.inflight == 0), key=lambda s: s.last_seen)
        out += [(s.session_id, "implicit_idle") for s in idle if now - s.last_seen > timeout]
        gone = {sid for sid, _ in out}
        spare = [s for s in idle if s.session_id not in gone and now - s.last_seen >= self.config.yield_idle_s]
        out += [(s.session_id, "implicit_yield") for s in spare[:waiting]]
        for sid, _ in out:
            self.forget(sid)
        return out

    # -- the bounded map --------------------------------------------------------------------

    def _put(self, key: bytes, session: ImplicitSession) -> None:
        previous = self.entries.get(key)
        if previous is not None and previous != session.session_id and previous in self.sessions:
            self.sessions[previous].keys.discard(key)
        self.entries[key] = session.session_id
        self.entries.move_to_end(key)
        session.keys.add(key)
        while len(self.entries) > self.config.max_entries:
            old, sid = self.entries.popitem(last=False)
            self.forks.pop(old, None)
            owner = self.sessions.get(sid)
            if owner is None:
                continue
            owner.keys.discard(old)
            if not owner.keys and owner.inflight == 0:
                self._dropped.append(sid)
