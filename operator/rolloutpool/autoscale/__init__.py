"""Adaptive concurrency: the pure control law shared by the operator and the simulator."""

from rolloutpool.autoscale.law import (
    RATE_WINDOW_SECONDS,
    HealthReason,
    LawParams,
    MetricsHealth,
    ReplicaControl,
    ReplicaSignals,
    cheap_cache_reads,
    classify_health,
    decide_replica,
    decide_unobserved,
    initial_cap,
    pressure_reason,
)

__all__ = [
    "RATE_WINDOW_SECONDS",
    "HealthReason",
    "LawParams",
    "MetricsHealth",
    "ReplicaControl",
    "ReplicaSignals",
    "cheap_cache_reads",
    "classify_health",
    "decide_replica",
    "decide_unobserved",
    "initial_cap",
    "pressure_reason",
]
