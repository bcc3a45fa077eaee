"""The slow control loop: the pure law that tunes each replica's working-set target, shared by the operator and
the simulator."""

from rolloutpool.autoscale.law import (
    RATE_WINDOW_SECONDS,
    HealthReason,
    LawParams,
    MetricsHealth,
    ReplicaControl,
    ReplicaSignals,
    classify_health,
    decide_replica,
    pressure_reason,
)

__all__ = [
    "RATE_WINDOW_SECONDS",
    "HealthReason",
    "LawParams",
    "MetricsHealth",
    "ReplicaControl",
    "ReplicaSignals",
    "classify_health",
    "decide_replica",
    "pressure_reason",
]
