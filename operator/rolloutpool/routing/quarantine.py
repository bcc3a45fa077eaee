"""Fast quarantine: react to eviction of LIVE sessions' prefixes, preemptions, a stuck queue (pure).

Signals, per replica:

- re-prefill: a returning session whose ``cached_tokens`` falls short of the context
  it had after its previous turn (whole blocks) by more than a tolerance. Only live
  sessions return, so the churn of finished sessions' cached blocks never counts; and
  the shortfalls within ``window_seconds`` must add up to ``min_window_tokens``: LRU churn
  that costs a few short prefixes now and then is not pressure (quarantine does not stop it);
- preemptions: the engine's preemption counter moved since the last scrape;
- a waiting queue seen on several consecutive scrapes while the KV cache is nearly full
  (``queue_kv_usage``; when the usage is known): requests that wait while blocks are free
  wait for compute or ``max_num_seqs``, which no cap on sessions relieves.

Any signal quarantines the replica (no new sessions). It is lifted when no signal
has been seen for ``hold_seconds``, or as soon as one of its sessions finishes (a
slot freed, so taking one new session does not add pressure).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rolloutpool.routing.pressure import PressureReason
from rolloutpool.routing.window import WindowSum

__all__ = ["PressureState", "QuarantineConfig", "expected_cached_tokens"]


@dataclass(frozen=True)
class QuarantineConfig:
    """Thresholds of the fast loop."""

    min_evicted_tokens: int = 256
    """A shortfall of at least this many cached tokens counts as eviction."""
    evicted_fraction: float = 0.25
    """...and at least this fraction of the expected cached tokens."""
    window_seconds: float = 10.0
    """Evicted re-prefill counts as pressure when the shortfalls within this window..."""
    min_window_tokens: int = 4096
    """...add up to at least this many tokens (one long context's worth, a dozen short ones)."""
    waiting_scrapes: int = 3
    """Consecutive scrapes with waiting requests that count as pressure."""
    queue_kv_usage: float = 0.9
    """...while KV usage is at least this (when the scrape has it): a queue with free blocks is not KV pressure."""
    hold_seconds: float = 10.0
    """Quarantine lasts at least this long after the last sign of pressure."""
    lift_on_finish: bool = True
    """Lift as soon as one of the replica's sessions finishes."""


def expected_cached_tokens(*, previous_context: int, prompt_tokens: int, block_size: int = 16) -> int:
    """Cached tokens a returning session should see if nothing was evicted (pure).

    Whole blocks of its previous context, and never more than vLLM can report for
    this prompt (``prompt_tokens - 1`` rounded down to whole blocks). The previous
    context is the previous turn's ``prompt_tokens + completion_tokens - 1``: the
    last sampled token's KV is never computed, so its block may not be cached.
    """
    limit = max(0, prompt_tokens - 1)
    return (min(previous_context, limit) // block_size) * block_size


@dataclass
class PressureState:
    """Quarantine state of one replica, advanced by observations (pure)."""

    config: QuarantineConfig
    quarantined: bool = False
    reason: str | None = None
    last_pressure: float = float("-inf")
    waiting_streak: int = 0
    last_preemptions: float | None = None
    quarantines: int = 0
    """How many times the replica entered quarantine."""
    evicted: WindowSum = field(init=False)
    """Shortfalls of recent evictions, within ``window_seconds``."""

    def __post_init__(self) -> None:
        self.evicted = WindowSum(self.config.window_seconds)

    def _pressure(self, now: float, reason: str) -> None:
        if not self.quarantined:
            self.quarantines += 1
        self.quarantined = True
        self.reason = reason
        self.last_pressure = now

    def observe_response(self, *, now: float, expected_cached: int, cached: int) -> int:
        """A returning session's response; returns the re-prefilled (evicted) tokens."""
        shortfall = max(0, expected_cached - cached)
        cfg = self.config
        if shortfall < cfg.min_evicted_tokens or shortfall < cfg.evicted_fraction * expected_cached:
            return shortfall
        if self.evicted.add(shortfall, now=now) >= cfg.min_window_tokens:
            self._pressure(now, PressureReason.EVICTING)
        return shortfall

    def observe_scrape(
        self, *, now: float, preemptions_total: float, waiting: float, kv_usage: float | None = None
    ) -> None:
        """A scrape of the engine's metrics (``kv_usage``: 0..1, None when the scrape lacks it)."""
        if self.last_preemptions is not None and preemptions_total > self.last_preemptions:
            self._pressure(now, PressureReason.PREEMPTING)
        self.last_preemptions = preemptions_total
        full = kv_usage is None or kv_usage >= self.config.queue_kv_usage
        self.waiting_streak = self.waiting_streak + 1 if waiting > 0 and full else 0
        if self.waiting_streak >= self.config.waiting_scrapes:
            self._pressure(now, PressureReason.QUEUEING)
        if self.quarantined and now - self.last_pressure >= self.config.hold_seconds:
            self.quarantined = False
            self.reason = None

    def session_finished(self) -> None:
        """One of the replica's sessions was released."""
        if self.quarantined and self.config.lift_on_finish:
            self.quarantined = False
            self.reason = None
