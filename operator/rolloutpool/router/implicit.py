"""Implicit sessions on the router: the I/O around :mod:`rolloutpool.routing.implicit` (docs/sessionless-clients.md).

A generation request without a session id (no header, no body field) is decoded once more
(orjson), keyed by its conversation prefix (:mod:`rolloutpool.routing.prefixkey`) and matched in
the index; the proxy then serves it as a turn of the implicit session it names, so it returns to
that session's replica and counts as that session in the ledger (turn scheduling, caps,
re-prefill measurement). The answer's tips (:mod:`rolloutpool.routing.answers`) are recorded when
the response ends. The expiry loop releases implicit sessions idle past their timeout
(``implicit_idle``) or whose digests were all evicted (``implicit_evicted``), and, while new sessions
queue for a place, those idle a little while (``implicit_yield``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from rolloutpool.routing.answers import answer_tips, streamed_tips
from rolloutpool.routing.implicit import ImplicitConfig, ImplicitIndex
from rolloutpool.routing.prefixkey import PrefixKeys, request_keys

if TYPE_CHECKING:
    from rolloutpool.router.sessions import SessionManager

__all__ = ["ImplicitSessions", "Resolved"]


@dataclass(frozen=True)
class Resolved:
    """A sessionless request's implicit session."""

    session_id: str
    group: str | None
    keys: PrefixKeys


class ImplicitSessions:
    """The router's implicit-session index and what feeds it."""

    def __init__(self, config: ImplicitConfig, manager: SessionManager) -> None:
        self.manager = manager
        self.metrics = manager.metrics
        self.index = ImplicitIndex(config, prefix=f"implicit-{uuid.uuid4().hex[:8]}-")
        """Ids ``implicit-<run>-<n>``: a restarted router (its table restored from a snapshot) reuses none."""

    def resolve(self, path: str, raw: bytes) -> Resolved | None:
        """The implicit session of a sessionless generation request; None when its body gives no prefix keys."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        keys = request_keys(path, body) if isinstance(body, dict) else None
        if keys is None:
            return None
        match = self.index.match(keys.chain, now=self.manager.clock())
        self.metrics.implicit.labels(match.outcome).inc()
        return Resolved(match.session_id, match.group, keys)

    def answered(self, resolved: Resolved, payload: bytes) -> None:
        """A non-streamed 200 answer: its choices' tips name the session."""
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        self.index.answered(resolved.session_id, answer_tips(resolved.keys, obj), now=self.manager.clock())

    def streamed(self, resolved: Resolved, text: str | None) -> None:
        """A finished stream's collected text (None: not collectable) names the session."""
        self.index.answered(resolved.session_id, streamed_tips(resolved.keys, text), now=self.manager.clock())

    def ended(self, resolved: Resolved) -> None:
        """The request is over (answered, refused or failed)."""
        self.index.ended(resolved.session_id, now=self.manager.clock())

    def expire(self) -> None:
        """Release implicit sessions idle past the timeout or evicted from the index (the expiry loop)."""
        for sid, how in self.index.expire(now=self.manager.clock(), waiting=self.manager.queue_depth):
            self.manager.release(sid, how=how)
        self.metrics.implicit_entries.set(len(self.index))
