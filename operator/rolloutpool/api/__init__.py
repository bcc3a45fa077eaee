"""The RolloutPool API: pydantic models of the CRD, its schema, condition constants (pure)."""

from rolloutpool.api.spec import (
    AutoscalingSpec,
    ConcurrencySpec,
    EngineSpec,
    ModelShape,
    RolloutPoolSpec,
    RouterSpec,
    RouterTraceSpec,
    SimulatorSpec,
    UpdateStrategySpec,
)
from rolloutpool.api.status import (
    API_GROUP,
    API_VERSION,
    KIND,
    PLURAL,
    Condition,
    ReplicaStatus,
    RolloutPool,
    RolloutPoolStatus,
)

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "PLURAL",
    "AutoscalingSpec",
    "ConcurrencySpec",
    "Condition",
    "EngineSpec",
    "ModelShape",
    "ReplicaStatus",
    "RolloutPool",
    "RolloutPoolSpec",
    "RolloutPoolStatus",
    "RouterSpec",
    "RouterTraceSpec",
    "SimulatorSpec",
    "UpdateStrategySpec",
]
