"""Progress-TTL's arithmetic: how long an ACTING program stays ACTIVE, from the return times seen (pure).

vllm-router's program scheduling (0.1.17; issue #285, PR #286) fits an ACTING program's TTL from a
profile of return times in buckets (``return_time_bucket_bounds_seconds``, ``ttl_gamma``,
``ttl_min_samples``, ``max_acting_ttl_seconds``, ``fitted_acting_ttl_seconds``). The release ships as a
compiled binary and the PR's text gives the state machine, not the fit; the fit here is ours, built
from those knobs (``docs/peers.md``): keep a program while the *hazard* of its return, given how long it
has already been in its tool (its progress through the call), is at least ``gamma`` per second; the TTL is
where the bucketed hazard first falls below ``gamma``, capped at ``max_ttl_s``; with fewer than
``min_samples`` returns seen, ``max_ttl_s``. With a heavy-tailed tool time the hazard falls as the wait
grows (most calls return within a second or two): the TTL is short where the source's trace says it
should be (86 % of next requests within 1 s, 95 % within 10 s).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["BOUNDS_S", "ReturnTimes", "fitted_ttl"]

BOUNDS_S: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
"""Return-time bucket upper bounds (seconds); one more bucket past the last."""


@dataclass
class ReturnTimes:
    """Counts of return times by bucket."""

    bounds: tuple[float, ...] = BOUNDS_S
    counts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(self.bounds) or not self.bounds or self.bounds[0] <= 0:
            raise ValueError("bounds must be positive and ascending")
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        """A program came back from its tool after ``seconds``."""
        self.counts[bisect.bisect_left(self.bounds, max(0.0, seconds))] += 1

    @property
    def samples(self) -> int:
        return sum(self.counts)


def fitted_ttl(times: ReturnTimes, *, gamma: float, max_ttl_s: float, min_samples: int) -> float:
    """The TTL: the start of the first bucket whose return hazard is below ``gamma`` per second, at most
    ``max_ttl_s`` (pure).

    The hazard over bucket ``(a, b]`` is the share of programs still out at ``a`` that return by ``b``, per
    second of the bucket's width.
    """
    total = times.samples
    if total < min_samples:
        return max_ttl_s
    out = total  # programs still in their tool at the bucket's start
    start = 0.0
    for bound, count in zip(times.bounds, times.counts, strict=False):
        if start >= max_ttl_s:
            return max_ttl_s
        if out <= 0 or count / out / (bound - start) < gamma:
            return min(start, max_ttl_s)
        out -= count
        start = bound
    return min(start, max_ttl_s)
