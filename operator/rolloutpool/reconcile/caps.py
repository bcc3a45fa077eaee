"""The spec's check, each replica's capacity, and the control law's inputs and state (pure).

The operator checks a spec it was given (``parse_spec``: a replica must hold one full context, the
ceiling must hold the conservative floor), turns the spec into the law's knobs (``law_params``),
recovers the law's state from the status after a restart (``controls_from_status``) and runs one
control step for every replica (``plan_controls``): each replica's working-set target. Nothing here
does I/O; ``now`` is passed in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from rolloutpool.api.spec import RolloutPoolSpec, SimulatorSpec
from rolloutpool.api.status import RolloutPoolStatus
from rolloutpool.autoscale.law import LawParams, MetricsHealth, ReplicaControl, ReplicaSignals, decide_replica
from rolloutpool.capacity import (
    MODEL_PRESETS,
    SessionCaps,
    estimate_kv_capacity_tokens,
    kv_bytes_per_token,
    session_caps,
)
from rolloutpool.engine.model.cost import hardware_preset
from rolloutpool.reconcile.labels import MAX_POOL_NAME_LENGTH
from rolloutpool.routing.pressure import pressure_reason_named

__all__ = [
    "DRAIN_REASONS",
    "controls_from_status",
    "estimated_kv_capacity_tokens",
    "law_params",
    "parse_spec",
    "plan_controls",
    "replica_caps",
]

DRAIN_REASONS = frozenset({"Draining", "Drained", "DrainTimeout", "Terminating"})
"""Replica-status reasons of the operator's lifecycle quarantine, not of the control law."""


_NAMED_VALUE_ERROR = re.compile(r"^Value error, (?P<message>(?P<path>[a-z][A-Za-z0-9]*(?:\.[A-Za-z0-9]+)+) .*)$")


def _error_path(loc: tuple[int | str, ...]) -> str:
    return "spec" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def estimated_kv_capacity_tokens(spec: RolloutPoolSpec) -> int | None:
    """KV capacity per replica the spec implies before an engine reports it; None when unknown (pure).

    ``engine.kvCapacityTokens`` when set; for a simulated engine its hardware preset's pool; for
    vLLM an estimate from ``modelShape`` (weights from ``modelShape.weightGib`` or a known model
    preset) and the GPU memory settings.
    """
    engine = spec.engine
    if engine.kv_capacity_tokens is not None:
        return engine.kv_capacity_tokens
    if engine.kind == "simulated":
        return hardware_preset((engine.simulator or SimulatorSpec()).hardware).kv_capacity_tokens
    preset = MODEL_PRESETS.get(engine.model.rsplit("/", 1)[-1].lower())
    shape = engine.model_shape
    if shape is not None:
        weight = shape.weight_gib if shape.weight_gib is not None else (preset.weight_gib if preset else None)
        if weight is None:
            return None
        per_token = kv_bytes_per_token(
            layers=shape.layers, kv_heads=shape.kv_heads, head_dim=shape.head_dim, kv_dtype=shape.kv_dtype
        )
    elif preset is not None:
        weight = preset.weight_gib
        per_token = kv_bytes_per_token(layers=preset.layers, kv_heads=preset.kv_heads, head_dim=preset.head_dim)
    else:
        return None
    return estimate_kv_capacity_tokens(
        gpu_memory_gib=engine.gpu_memory_gib,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        weight_gib=weight,
        bytes_per_token=per_token,
        num_gpus=max(1, engine.gpus_per_replica),
    )


def replica_caps(*, spec: RolloutPoolSpec, kv_capacity_tokens: int | None = None) -> SessionCaps | None:
    """Floor and ceiling of one replica (the floor: sessions that fit at full context); None when its capacity
    is unknown (pure).

    ``kv_capacity_tokens`` is what the engine reported; without it the spec's estimate is used.
    Raises ``ValueError`` naming the spec field when the spec cannot be served.
    """
    capacity = kv_capacity_tokens if kv_capacity_tokens is not None else estimated_kv_capacity_tokens(spec)
    if capacity is None:
        return None
    return session_caps(
        capacity_tokens=capacity,
        max_model_len=spec.engine.max_model_len,
        expected_residency=1.0,
        headroom=0.0,
        ceiling=spec.concurrency.max_sessions_per_replica,
    )


def parse_spec(*, pool: Mapping[str, Any]) -> tuple[RolloutPoolSpec | None, str | None]:
    """Validate a RolloutPool object's spec and check the operator can serve it (pure).

    Returns ``(spec, None)``, or ``(spec_or_None, error)`` where ``error`` starts with the
    offending field (``spec.concurrency.maxSessionsPerReplica: ...``). A spec the schema admits
    but the operator cannot serve is returned together with its error.
    """
    name = str((pool.get("metadata") or {}).get("name", ""))
    if len(name) > MAX_POOL_NAME_LENGTH:
        return None, (
            f"metadata.name: {len(name)} characters; at most {MAX_POOL_NAME_LENGTH} fit the router's "
            f"Service name <pool>-router"
        )
    try:
        spec = RolloutPoolSpec.model_validate(pool.get("spec"))
    except ValidationError as exc:
        first = exc.errors()[0]
        named = _NAMED_VALUE_ERROR.match(first["msg"])
        if named:  # a cross-field rule names its field itself: "engine.image is required when ..."
            return None, f"spec.{named['path']}: {named['message']}"
        return None, f"{_error_path(first['loc'])}: {first['msg']}"
    try:
        replica_caps(spec=spec)
    except ValueError as exc:
        return spec, str(exc)
    return spec, None


def law_params(*, spec: RolloutPoolSpec) -> LawParams:
    """The control law's knobs, from ``spec.concurrency`` and ``spec.autoscaling`` (pure)."""
    autoscaling = spec.autoscaling
    return LawParams.at_target(
        max(autoscaling.min_target, spec.concurrency.working_set_target),
        maximum=autoscaling.max_target,
        minimum=autoscaling.min_target,
        step=autoscaling.target_step,
        decrease_factor=autoscaling.decrease_factor,
        cooldown_seconds=float(autoscaling.cooldown_seconds),
    )


def _timestamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _current_spelling(reason: str | None) -> str | None:
    """A reason in its canonical spelling (a stored status may spell it ``LivePrefixEviction``)."""
    named = pressure_reason_named(reason)
    return named.value if named is not None else reason


def controls_from_status(status: RolloutPoolStatus | None) -> dict[str, ReplicaControl]:
    """The law's state per replica as the last status recorded it, so it survives a restart (pure).

    Target, cooldown (``targetChangedAt``) and the reason the target last moved (``targetReason``). Replicas
    without a target are left out; a drain or termination is the operator's lifecycle, not the law's quarantine,
    and is not carried over.
    """
    controls: dict[str, ReplicaControl] = {}
    for entry in status.replica_status if status else []:
        if entry.target is None:
            continue
        lifecycle = entry.reason in DRAIN_REASONS
        controls[entry.name] = ReplicaControl(
            target=entry.target,
            changed_at=_timestamp(entry.target_changed_at),
            quarantined=entry.quarantined and not lifecycle,
            reason=_current_spelling(
                entry.target_reason if entry.target_reason is not None else (None if lifecycle else entry.reason)
            ),
        )
    return controls


def plan_controls(
    *,
    spec: RolloutPoolSpec,
    replicas: Sequence[str],
    signals: Mapping[str, ReplicaSignals | None],
    previous: Mapping[str, ReplicaControl],
    health: MetricsHealth,
    now: float,
) -> dict[str, ReplicaControl]:
    """One step of the slow loop: every replica's working-set target and quarantine (pure).

    - Autoscaling disabled: no target (``ReplicaControl.target`` None), never quarantined: the routers keep
      ``concurrency.workingSetTarget``.
    - Prometheus unreachable or stale, or a replica without signals of its own (a new pod): no target either,
      the routers' own applies (their working set is safe without the law: it only tunes how full it runs).
    - Otherwise the law decides each replica from its own signals.
    """
    blind = health.reason in ("PrometheusUnreachable", "MetricsStale")
    params = law_params(spec=spec)
    controls: dict[str, ReplicaControl] = {}
    for name in replicas:
        if not spec.autoscaling.enabled:
            controls[name] = ReplicaControl(target=None)  # the same every pass: no status churn
            continue
        observed = None if blind else signals.get(name)
        controls[name] = decide_replica(previous=previous.get(name), signals=observed, params=params, now=now)
    return controls
