"""vllm-router's program-level Progress-TTL scheduling (pure).

Sources: vllm-project/router issue #285 (the RFC) and PR #286, and the program scheduling shipped in
vllm-router 0.1.17 (its configuration keys; the bench's ``vllm-program`` runs that binary). A program is
ACTIVE or PAUSED; an ACTIVE program waiting on its tool keeps its reservation (its tokens count against
its rank's ``token_capacity_per_target``) for a TTL fitted from the return times seen
(:mod:`~rolloutpool.routing.peers.progress_ttl_math`, at most ``max_acting_ttl_seconds``, 10 s); it is
PAUSED when its TTL expires or under capacity pressure (above ``high_watermark`` of the capacity, the
programs with the least TTL left first, down to ``low_watermark``). The next request of a paused program
is retained in the request pool until capacity frees on its rank, or on another rank with
``cross_rank_headroom`` to spare (where it then moves), oldest first; one retained past
``force_resume_timeout_s`` (300 s) is resumed regardless. New programs bind to the rank with the fewest
programs (``least_program_count``) that has room under the high watermark and no retained request.
The watermarks, the headroom, the hazard threshold and the resume order are our choices where the
sources name the knob but we could not read its default (``docs/peers.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rolloutpool.routing.peers.programs import ProgramScheduler
from rolloutpool.routing.peers.progress_ttl_math import BOUNDS_S, ReturnTimes, fitted_ttl
from rolloutpool.routing.workingset import Tracked

__all__ = ["ProgressTTL", "ProgressTTLConfig"]


@dataclass(frozen=True)
class ProgressTTLConfig:
    """Progress-TTL's knobs (the 10 s TTL cap and the 300 s forced resume are vllm-router's defaults)."""

    max_acting_ttl_s: float = 10.0
    ttl_gamma: float = 0.1
    """Keep an ACTING program while its return hazard is at least this (per second)."""
    ttl_min_samples: int = 32
    high_watermark: float = 0.95
    low_watermark: float = 0.85
    cross_rank_headroom: float = 0.10
    force_resume_timeout_s: float = 300.0
    interval_s: float = 1.0
    """The scheduler's loop (``metrics_interval_seconds``)."""
    bucket_bounds_s: tuple[float, ...] = BOUNDS_S
    """The return-time profile's buckets (a time-scaled bench scales them with every other time constant)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "bucket_bounds_s", tuple(float(b) for b in self.bucket_bounds_s))  # JSON gives a list
        if not 0 < self.low_watermark <= self.high_watermark:
            raise ValueError("need 0 < low_watermark <= high_watermark")
        if self.max_acting_ttl_s < 0 or self.ttl_gamma <= 0 or self.force_resume_timeout_s < 0:
            raise ValueError("max_acting_ttl_s and force_resume_timeout_s must be >= 0, ttl_gamma > 0")
        if not 0 <= self.cross_rank_headroom < self.high_watermark:
            raise ValueError("need 0 <= cross_rank_headroom < high_watermark")


class ProgressTTL(ProgramScheduler):
    """ACTIVE programs keep their KV for a fitted TTL; pressure or expiry pauses them; paused requests wait."""

    name = "progress-ttl"

    def __init__(self, config: ProgressTTLConfig | None = None) -> None:
        super().__init__()
        self.pt = config or ProgressTTLConfig()
        self.interval_s = self.pt.interval_s
        self.returns = ReturnTimes(self.pt.bucket_bounds_s)

    def observe_return(self, seconds: float) -> None:
        self.returns.observe(seconds)

    def ttl(self) -> float:
        """The TTL an ACTING program gets now."""
        pt = self.pt
        return fitted_ttl(
            self.returns, gamma=pt.ttl_gamma, max_ttl_s=pt.max_acting_ttl_s, min_samples=pt.ttl_min_samples
        )

    def _lease(self, sid: str) -> float:
        return self.ttl()

    def room_for_new(self, name: str, *, now: float) -> int | None:
        work = self.replicas[name]
        if work.capacity is None:
            return None
        if work.held:
            return 0
        free = self.pt.high_watermark * work.capacity - work.counted
        return max(0, int(free // max(1.0, self.first_context)))

    def paused_arrival(self, tracked: Tracked, sid: str, *, now: float) -> bool:
        need = self.need(sid)
        work = self.replicas[tracked.replica]
        if not work.held and self.fits(work.name, need, self.pt.high_watermark):
            self.serve_paused(sid, now=now)
            return True
        to = self._elsewhere(work.name, sid)
        if to is None:
            return False
        self.serve_paused(sid, now=now, to=to)
        return True

    def _elsewhere(self, name: str, sid: str) -> str | None:
        share = self.pt.high_watermark - self.pt.cross_rank_headroom
        others = (w.name for w in self.others(name) if not w.held)
        return next((other for other in others if self.fits(other, self.need(sid, other), share)), None)

    def tick(self, name: str, *, now: float) -> list[str]:
        work, pt = self.replicas[name], self.pt
        for sid in [s for s in work.idle if self.sessions[s].until <= now]:  # TTL expired
            self.pause(sid)
        if self.used(name) > pt.high_watermark:  # capacity pressure: least TTL left first
            for sid in sorted(work.idle, key=lambda s: (self.sessions[s].until, s)):
                if self.used(name) <= pt.low_watermark:
                    break
                self.pause(sid)
        out: list[str] = []
        for sid in list(work.held):  # retained requests, oldest first
            need = self.need(sid)
            if now - self.sessions[sid].since >= pt.force_resume_timeout_s:
                self.serve_held(sid, now=now, forced=True)
            elif self.fits(name, need, pt.high_watermark):
                self.serve_held(sid, now=now)
            else:
                to = self._elsewhere(name, sid)
                if to is None:
                    continue
                self.serve_held(sid, now=now, to=to)
            out.append(sid)
        return out
