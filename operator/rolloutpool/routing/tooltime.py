"""How long sessions wait on their tools, learned from the gaps the router sees between turns (pure).

A gap is the time from a turn's end to the session's next turn. Tool latencies are heavy-tailed
(DESIGN section 6: lognormal, median ~2 s, p90 ~15 s), so each estimate is a lognormal over
log-seconds: one for the fleet (exponential means of the log gap and its square), one per session
(the same over its own gaps), the session's shrunk towards the fleet's by its number of gaps
(``prior_weight`` pseudo-gaps of the fleet's). :meth:`ToolTimes.lease` is the ``quantile`` of a
session's predicted gap: how long its prefix is worth keeping before most of its tool calls would
have returned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

__all__ = ["SessionGaps", "ToolTimes"]

_MIN_GAP_S = 0.01


@dataclass(slots=True)
class SessionGaps:
    """One session's gaps: count, mean and mean square of the log gap."""

    n: int = 0
    mean: float = 0.0
    square: float = 0.0


class ToolTimes:
    """The fleet's and each session's tool-time estimates."""

    def __init__(self, *, prior_s: float, smoothing: float = 0.02, prior_weight: float = 3.0) -> None:
        if prior_s <= 0 or not 0 < smoothing <= 1 or prior_weight < 0:
            raise ValueError("prior_s must be > 0, smoothing in (0, 1], prior_weight >= 0")
        self.smoothing = smoothing
        self.prior_weight = prior_weight
        self.mean = math.log(prior_s)
        """Fleet mean of the log gap (seeded with the prior lease, as if it were the median)."""
        self.square = self.mean * self.mean
        self.count = 0
        self.sessions: dict[str, SessionGaps] = {}

    def observe(self, sid: str, gap_s: float) -> None:
        """A gap of ``sid`` between two turns."""
        x = math.log(max(gap_s, _MIN_GAP_S))
        a = self.smoothing if self.count >= 1 / self.smoothing else 1 / (self.count + 1)  # a plain mean at first
        self.mean += a * (x - self.mean)
        self.square += a * (x * x - self.square)
        self.count += 1
        own = self.sessions.get(sid)
        if own is None:
            own = self.sessions[sid] = SessionGaps()
        own.n += 1
        own.mean += (x - own.mean) / own.n
        own.square += (x * x - own.square) / own.n

    def forget(self, sid: str) -> None:
        """The session is over."""
        self.sessions.pop(sid, None)

    def lease(self, sid: str, *, quantile: float) -> float:
        """Seconds within which the session's next gap ends with probability ``quantile`` (pure read)."""
        own = self.sessions.get(sid)
        n = 0 if own is None else own.n
        w = self.prior_weight
        mean = self.mean if own is None else (w * self.mean + n * own.mean) / (w + n)
        square = self.square if own is None else (w * self.square + n * own.square) / (w + n)
        sigma = math.sqrt(max(0.0, square - mean * mean))
        return math.exp(mean + NormalDist().inv_cdf(quantile) * sigma)
