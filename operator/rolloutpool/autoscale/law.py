"""The slow control loop's law: measured pressure -> each replica's cap and quarantine (pure).

The operator runs it every ``autoscaling.intervalSeconds`` on signals read from Prometheus;
``rolloutpool simulate`` runs the same function on the signals a scrape would have seen.
Nothing here does I/O or reads a clock: ``now`` is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "HealthReason",
    "LawParams",
    "MetricsHealth",
    "ReplicaControl",
    "ReplicaSignals",
    "classify_health",
    "decide_replica",
    "pressure_reason",
]

HealthReason = Literal[
    "MetricsAvailable", "AutoscalingDisabled", "PrometheusUnreachable", "MetricsMissing", "MetricsStale"
]


@dataclass(frozen=True)
class ReplicaSignals:
    """What one replica showed over the last control interval (any field may be unknown)."""

    kv_usage: float | None = None
    """``vllm:kv_cache_usage_perc`` or ``gpu_cache_usage_perc``, 0..1; idle cached prefixes count as free."""
    preemptions_per_s: float | None = None
    """``rate(vllm:num_preemptions_total)`` over the interval."""
    waiting: float | None = None
    """``vllm:num_requests_waiting`` (includes preempted requests)."""
    prefix_hit_ratio: float | None = None
    """``rate(prefix_cache_hits) / rate(prefix_cache_queries)`` over the interval."""
    reprefill_tokens_per_s: float | None = None
    """``rate(rolloutpool_router_reprefilled_tokens_total)``: live sessions' prefixes lost to eviction."""
    kv_capacity_tokens: int | None = None
    """``num_gpu_blocks * block_size`` from ``vllm:cache_config_info``."""
    live_sessions: int | None = None
    """The router's live sessions on the replica."""
    sampled_at: float | None = None
    """Unix time of the newest sample these values come from."""


@dataclass(frozen=True)
class ReplicaControl:
    """The law's decision for one replica; kept in the pool's status so it survives a restart."""

    cap: int
    changed_at: float | None = None
    """Unix time of the last cap change (cooldown)."""
    quarantined: bool = False
    reason: str | None = None
    """Why quarantined (``LivePrefixEviction``, ``Preempting``, ``Queueing``) or why the cap last moved."""


@dataclass(frozen=True)
class LawParams:
    """Knobs of the law, from ``spec.concurrency`` and ``spec.autoscaling``."""

    floor: int
    """Conservative cap: ``kv_capacity // max_model_len`` (never evicts); the cap never goes below it."""
    ceiling: int
    """``maxSessionsPerReplica`` (or a large default); the cap never goes above it."""
    target_kv_usage: float = 0.85
    cooldown_seconds: float = 60.0
    decrease_factor: float = 0.7
    increase_step: int = 1
    tolerance: float = 0.05
    """Band under ``target_kv_usage`` in which the cap holds (anti-flap)."""
    reprefill_tokens_per_s: float = 1.0
    """Re-prefill rate of live sessions above which a replica is under pressure."""
    waiting_threshold: float = 1.0
    """Waiting requests above which a replica is under pressure."""


@dataclass(frozen=True)
class MetricsHealth:
    """Whether the law had signals to act on; becomes the ``MetricsAvailable`` condition."""

    available: bool
    reason: HealthReason
    message: str


def pressure_reason(signals: ReplicaSignals, params: LawParams) -> str | None:
    """The pressure a replica shows, most telling first, or None (pure).

    Re-prefill of live sessions and preemptions are eviction; a waiting queue is the symptom
    that follows. Cache churn of finished sessions is not pressure: it shows in none of these.
    """
    if (signals.reprefill_tokens_per_s or 0.0) > params.reprefill_tokens_per_s:
        return "LivePrefixEviction"
    if (signals.preemptions_per_s or 0.0) > 0.0:
        return "Preempting"
    if (signals.waiting or 0.0) > params.waiting_threshold:
        return "Queueing"
    return None


def _clamp(cap: int, params: LawParams) -> int:
    return max(params.floor, min(params.ceiling, cap))


def decide_replica(
    *,
    previous: ReplicaControl | None,
    signals: ReplicaSignals | None,
    params: LawParams,
    now: float,
) -> ReplicaControl:
    """Next cap and quarantine of one replica (pure).

    Starts at the floor; under pressure cuts the cap multiplicatively and quarantines; without
    pressure and with KV usage under the target band raises it additively; inside the band it
    holds. A cap changes at most once per cooldown, except that a cut never waits for a raise's
    cooldown. Without signals the replica falls back to the floor, unquarantined.
    """
    if previous is None:
        previous = ReplicaControl(cap=params.floor)
    current = _clamp(previous.cap, params)
    if signals is None:
        if current == params.floor and not previous.quarantined:
            return replace(previous, cap=current)
        return ReplicaControl(cap=params.floor, changed_at=now, quarantined=False, reason="NoMetrics")
    cooled = previous.changed_at is None or now - previous.changed_at >= params.cooldown_seconds
    reason = pressure_reason(signals, params)
    if reason is not None:
        cut = _clamp(math.floor(current * params.decrease_factor), params)
        raised_recently = previous.reason == "Raised" and not cooled
        if cut < current and (cooled or raised_recently):
            return ReplicaControl(cap=cut, changed_at=now, quarantined=True, reason=reason)
        return ReplicaControl(cap=current, changed_at=previous.changed_at, quarantined=True, reason=reason)
    usage = signals.kv_usage
    if usage is not None and usage < params.target_kv_usage - params.tolerance and cooled:
        raised = _clamp(current + params.increase_step, params)
        if raised > current:
            return ReplicaControl(cap=raised, changed_at=now, quarantined=False, reason="Raised")
    return ReplicaControl(cap=current, changed_at=previous.changed_at, quarantined=False, reason=previous.reason)


def classify_health(
    *,
    enabled: bool,
    reachable: bool,
    signals: dict[str, ReplicaSignals | None],
    now: float,
    stale_after_seconds: float,
    error: str = "",
) -> MetricsHealth:
    """``MetricsAvailable`` from what the read returned (pure)."""
    if not enabled:
        return MetricsHealth(False, "AutoscalingDisabled", "autoscaling is disabled; caps stay at the spec's value")
    if not reachable:
        return MetricsHealth(False, "PrometheusUnreachable", f"Prometheus query failed: {error}".rstrip(": "))
    missing = sorted(name for name, s in signals.items() if s is None or s.kv_usage is None)
    if missing:
        return MetricsHealth(False, "MetricsMissing", f"no engine metrics for {', '.join(missing)}")
    stale = sorted(
        name
        for name, s in signals.items()
        if s is not None and (s.sampled_at is None or now - s.sampled_at > stale_after_seconds)
    )
    if stale:
        age = f"{stale_after_seconds:.0f}s"
        return MetricsHealth(False, "MetricsStale", f"metrics older than {age} for {', '.join(stale)}")
    return MetricsHealth(True, "MetricsAvailable", f"fresh metrics for {len(signals)} replicas")
