"""Pydantic models of the RolloutPool status and of the whole object."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rolloutpool.api.spec import RolloutPoolSpec

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "PLURAL",
    "Condition",
    "ConditionStatus",
    "ReplicaStatus",
    "RolloutPool",
    "RolloutPoolStatus",
    "StatusModel",
]

API_GROUP = "rolloutpool.io"
API_VERSION = "v1alpha1"
KIND = "RolloutPool"
PLURAL = "rolloutpools"

ConditionStatus = Literal["True", "False", "Unknown"]


class StatusModel(BaseModel):
    """Base of the status models: camelCase wire names, tolerant of fields written by newer operators."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )


class Condition(StatusModel):
    """One observation of the pool's state, Kubernetes style."""

    type: str = Field(min_length=1, max_length=316)
    """Condition type: Ready, Progressing, Degraded, ReplicasQuarantined, MetricsAvailable."""

    status: ConditionStatus
    """True, False or Unknown."""

    reason: str = Field(min_length=1, max_length=1024)
    """CamelCase reason for the last transition."""

    message: str = Field(default="", max_length=32_768)
    """Human-readable detail."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The ``metadata.generation`` this condition was computed from."""

    last_transition_time: datetime
    """When ``status`` last changed."""


class ReplicaTurns(NamedTuple):
    """What the routers report of one replica's turn scheduling (summed over router pods)."""

    held: int
    kept: int
    let_go: int
    moves: int


class ReplicaStatus(StatusModel):
    """Observed state and decided limits of one engine replica."""

    name: str
    """Pod name, ``<pool>-engine-<index>``."""

    index: int = Field(ge=0)
    """Replica index."""

    ready: bool = False
    """Whether the pod is ready to serve."""

    endpoint: str | None = None
    """The engine's base URL, ``http://<podIP>:<port>``, for trainers that call the engines directly (weight
    sync: ``/pause``, ``/update_weights``, ...); unset while the pod has no IP. The router fans the same calls out
    from one URL (``/admin/rl/{call}``)."""

    live_sessions: int = Field(default=0, ge=0)
    """Sessions started on this replica and not yet released."""

    target: float | None = Field(default=None, gt=0.0, le=2.0)
    """The working-set target the control law set (autoscaling on): the share of the replica's KV capacity that
    generating sessions and the idle prefixes the routers keep may fill; unset: the routers' own."""

    held_turns: int = Field(default=0, ge=0)
    """Turns of live sessions the routers hold (paused) until the replica's working set has room."""

    kept_sessions: int = Field(default=0, ge=0)
    """Sessions waiting on a tool whose prefix the routers keep (leases held)."""

    let_go_sessions: int = Field(default=0, ge=0)
    """Live sessions whose prefix the routers let go (the engine may evict it; their next turn needs room)."""

    moves: int = Field(default=0, ge=0)
    """Sessions the routers moved to another replica because their prefix was gone here (cumulative)."""

    kv_capacity_tokens: int | None = Field(default=None, ge=0)
    """KV capacity reported by the engine (``num_gpu_blocks * block_size``)."""

    kv_usage: float | None = Field(default=None, ge=0.0, le=1.0)
    """KV cache usage (0..1) as the engine reports it; idle cached prefixes count as free."""

    quarantined: bool = False
    """Whether the replica receives no new sessions."""

    reason: str | None = None
    """Why the replica is quarantined or draining."""

    router_quarantined: bool = False
    """Whether a router quarantines the replica by itself (its fast loop); routers obey ``quarantined``, not this."""

    router_reason: str | None = None
    """Why a router quarantines the replica (``Evicting``, ``Preempting``, ``Queueing``)."""

    router_quarantined_at: datetime | None = None
    """When a router last reported the quarantine: shown until 15 s after that, unless no router answers."""

    engine_warnings: list[str] = Field(default_factory=list)
    """What the engine does not report, as the routers see it: ``NoCachedTokens`` (no
    ``prompt_tokens_details``: re-prefill is undetectable; start vLLM with ``--enable-prompt-tokens-details``),
    ``PrefixCachingOff`` (nothing is cached; misses never quarantine it)."""

    target_changed_at: datetime | None = None
    """When the control loop last moved ``target`` (its cooldown survives an operator restart)."""

    target_reason: str | None = None
    """Why the control loop last moved or held ``target`` (``Raised``, ``NoMetrics``, a pressure reason)."""


class RolloutPoolStatus(StatusModel):
    """Observed state of a RolloutPool, rebuilt on every reconcile."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The ``metadata.generation`` the operator last acted on."""

    replicas: int = Field(default=0, ge=0)
    """Engine pods that exist."""

    ready_replicas: int = Field(default=0, ge=0)
    """Engine pods that are ready."""

    selector: str | None = None
    """Label selector of the engine pods (for the scale subresource)."""

    live_sessions: int = Field(default=0, ge=0)
    """Live sessions over all replicas."""

    queued_sessions: int = Field(default=0, ge=0)
    """New sessions waiting in the router for a free slot."""

    held_turns: int = Field(default=0, ge=0)
    """Turns of live sessions held for room over all replicas (``replicaStatus[].heldTurns``)."""

    kept_sessions: int = Field(default=0, ge=0)
    """Idle prefixes kept over all replicas (leases held)."""

    moves: int = Field(default=0, ge=0)
    """Sessions moved to another replica because their prefix was gone (cumulative, over all replicas)."""

    quarantined_replicas: int = Field(default=0, ge=0)
    """Replicas currently quarantined, by the operator (``quarantined``) or a router (``routerQuarantined``)."""

    replica_status: list[ReplicaStatus] = Field(default_factory=list)
    """One entry per replica."""

    conditions: list[Condition] = Field(default_factory=list)
    """Ready, Progressing, Degraded, ReplicasQuarantined, MetricsAvailable."""


class RolloutPool(BaseModel):
    """A whole RolloutPool object as the API server returns it."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", use_attribute_docstrings=True)

    api_version: Literal["rolloutpool.io/v1alpha1"] = Field(alias="apiVersion")
    """``rolloutpool.io/v1alpha1``."""

    kind: Literal["RolloutPool"]
    """``RolloutPool``."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    """Standard object metadata."""

    spec: RolloutPoolSpec
    """Desired state."""

    status: RolloutPoolStatus | None = None
    """Observed state."""
