"""Prefix renewal: keep an idle live session's cached context at the young end of the LRU (pure).

vLLM keeps every freed block cached in one free queue and evicts the least recently
freed first; it cannot tell a live session waiting on a tool call from a finished one.
A session idle for long enough is therefore evicted before the newer blocks of sessions
that already finished, even when every live context fits the cache (caps at the
conservative floor). Renewal sends, for a session idle for ``every_seconds``, a request
for its last context with ``max_tokens=1``: a prefix-cache hit that references the
context's blocks and frees them again, so they rejoin the free queue as the newest.
It costs one scheduled sequence and one token; repeated every ``every_seconds`` while the
session stays idle, its prefix is evicted only if the cache turns over faster than that.

:class:`RenewalClock` tracks when each session went idle and when it was last renewed,
and answers which renewals are due; the caller (simulator or router) sends those the turn scheduler
keeps (``Ledger.renews``: a prefix it let go, or one already evicted, waits an interval and is asked again).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

__all__ = ["RenewalClock", "RenewalConfig"]


@dataclass(frozen=True)
class RenewalConfig:
    """When to renew."""

    every_seconds: float = 4.0
    """A session idle this long (since its last turn or its last renewal) is renewed."""

    def __post_init__(self) -> None:
        if not self.every_seconds > 0:
            raise ValueError(f"every_seconds must be positive, got {self.every_seconds}")


class RenewalClock:
    """Idle sessions and their next renewal time; ``now`` is always passed in.

    A session is busy while it has a request in flight (turn or renewal); idle from its
    last response. Each idle period schedules one renewal ``every_seconds`` after it began;
    a renewal's response starts a new idle period, so renewals repeat while the session waits.
    """

    def __init__(self, config: RenewalConfig | None = None) -> None:
        self.config = config or RenewalConfig()
        self._due: dict[str, float] = {}
        """Idle sessions -> when their renewal is due."""
        self._heap: list[tuple[float, str]] = []
        self.renewals = 0
        """Renewals handed out (cumulative)."""

    def idle(self, session_id: str, *, now: float) -> None:
        """The session's last request just answered: renew it ``every_seconds`` from now."""
        due = now + self.config.every_seconds
        self._due[session_id] = due
        heapq.heappush(self._heap, (due, session_id))

    def skipped(self, session_id: str, *, now: float) -> None:
        """A due renewal the caller did not send (not worth it now): not counted; asked again an interval later."""
        self.renewals -= 1
        self.idle(session_id, now=now)

    def busy(self, session_id: str) -> None:
        """The session sent a request (or is being renewed): nothing to renew until it is idle again."""
        self._due.pop(session_id, None)

    forget = busy
    """The session ended: never renew it again."""

    @property
    def idle_sessions(self) -> int:
        """Sessions waiting for their renewal."""
        return len(self._due)

    def due(self, *, now: float) -> list[str]:
        """Sessions whose renewal is due at ``now``, oldest first; each becomes busy (its renewal is in flight)."""
        out: list[str] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, session_id = heapq.heappop(heap)
            if self._due.get(session_id) == when:  # else: stale entry of an earlier idle period
                del self._due[session_id]
                out.append(session_id)
        self.renewals += len(out)
        return out
