"""Per-replica caps from the spec and the control law's inputs and state (pure).

The operator checks a spec it was given (``parse_spec``), derives each replica's
conservative floor and starting cap from KV capacity (``replica_caps``), turns the spec
into the law's knobs (``law_params``), recovers the law's state from the status after a
restart (``controls_from_status``) and runs one control step for every replica
(``plan_controls``). Nothing here does I/O; ``now`` is passed in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from rolloutpool.api.spec import RolloutPoolSpec, SimulatorSpec
from rolloutpool.api.status import RolloutPoolStatus
from rolloutpool.autoscale.law import (
    LawParams,
    MetricsHealth,
    ReplicaControl,
    ReplicaSignals,
    decide_replica,
    decide_unobserved,
)
from rolloutpool.capacity import (
    MODEL_PRESETS,
    SessionCaps,
    estimate_kv_capacity_tokens,
    kv_bytes_per_token,
    session_caps,
)
from rolloutpool.engine.model.cost import CostModel, hardware_preset
from rolloutpool.reconcile.labels import MAX_POOL_NAME_LENGTH
from rolloutpool.routing.pressure import pressure_reason_named

__all__ = [
    "DEFAULT_CEILING",
    "DRAIN_REASONS",
    "controls_from_status",
    "estimated_kv_capacity_tokens",
    "law_params",
    "parse_spec",
    "plan_controls",
    "replica_caps",
    "simulated_cost",
]

DEFAULT_CEILING = 100_000
"""Ceiling of the law when ``maxSessionsPerReplica`` is unset (the schema's own maximum)."""

DRAIN_REASONS = frozenset({"Draining", "Drained", "DrainTimeout", "Terminating"})
"""Replica-status reasons of the operator's lifecycle quarantine, not of the control law."""


_NAMED_VALUE_ERROR = re.compile(r"^Value error, (?P<message>(?P<path>[a-z][A-Za-z0-9]*(?:\.[A-Za-z0-9]+)+) .*)$")


def _error_path(loc: tuple[int | str, ...]) -> str:
    return "spec" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def simulated_cost(spec: RolloutPoolSpec) -> CostModel | None:
    """The engine-sims' step-time model (their hardware preset's); None for vLLM, whose costs are unknown (pure)."""
    engine = spec.engine
    if engine.kind != "simulated":
        return None
    return hardware_preset((engine.simulator or SimulatorSpec()).hardware).cost


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
    """Floor, initial cap and ceiling of one replica; None when its capacity is unknown (pure).

    ``kv_capacity_tokens`` is what the engine reported; without it the spec's estimate is used.
    Raises ``ValueError`` naming the spec field when the spec cannot be served.
    """
    capacity = kv_capacity_tokens if kv_capacity_tokens is not None else estimated_kv_capacity_tokens(spec)
    if capacity is None:
        return None
    return session_caps(
        capacity_tokens=capacity,
        max_model_len=spec.engine.max_model_len,
        expected_residency=spec.concurrency.expected_residency,
        headroom=spec.concurrency.headroom,
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


def law_params(*, spec: RolloutPoolSpec, kv_capacity_tokens: int) -> LawParams:
    """The control law's knobs for one replica of ``kv_capacity_tokens`` (pure).

    Raises ``ValueError`` naming the spec field when the floor is below one session or above the ceiling.
    """
    caps = replica_caps(spec=spec, kv_capacity_tokens=kv_capacity_tokens)
    assert caps is not None  # noqa: S101 -- a capacity was given
    autoscaling = spec.autoscaling
    cost = simulated_cost(spec)  # the step floor and a whole cache's read: known for engine-sims only
    return LawParams(
        step_floor_seconds=None if cost is None else cost.fixed_step_seconds,
        cache_read_seconds=None if cost is None else cost.kv_read_seconds(kv_capacity_tokens),
        floor=caps.floor,
        ceiling=caps.ceiling if caps.ceiling is not None else max(DEFAULT_CEILING, caps.floor),
        initial=caps.initial,
        target_kv_usage=autoscaling.target_kv_usage,
        cooldown_seconds=float(autoscaling.cooldown_seconds),
        decrease_factor=autoscaling.decrease_factor,
        increase_step=autoscaling.increase_step,
    )


def _timestamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _current_spelling(reason: str | None) -> str | None:
    """A reason in its canonical spelling (a stored status may spell it ``LivePrefixEviction``)."""
    named = pressure_reason_named(reason)
    return named.value if named is not None else reason


def controls_from_status(status: RolloutPoolStatus | None) -> dict[str, ReplicaControl]:
    """The law's state per replica as the last status recorded it, so it survives a restart (pure).

    Cap, cooldown (``capChangedAt``), the reason the cap last moved (``capReason``) and the learned
    limit (``capLimit``, ``capLimitAt``). Replicas without a cap are left out; a drain or
    termination is the operator's lifecycle, not the law's quarantine, and is not carried over.
    """
    controls: dict[str, ReplicaControl] = {}
    for entry in status.replica_status if status else []:
        if entry.cap is None:
            continue
        lifecycle = entry.reason in DRAIN_REASONS
        controls[entry.name] = ReplicaControl(
            cap=entry.cap,
            changed_at=_timestamp(entry.cap_changed_at),
            quarantined=entry.quarantined and not lifecycle,
            reason=_current_spelling(
                entry.cap_reason if entry.cap_reason is not None else (None if lifecycle else entry.reason)
            ),
            limit=entry.cap_limit,
            limit_at=_timestamp(entry.cap_limit_at),
        )
    return controls


def plan_controls(
    *,
    spec: RolloutPoolSpec,
    replicas: Sequence[str],
    signals: Mapping[str, ReplicaSignals | None],
    previous: Mapping[str, ReplicaControl],
    kv_capacity_tokens: Mapping[str, int],
    health: MetricsHealth,
    now: float,
) -> dict[str, ReplicaControl]:
    """One step of the slow loop: every replica's cap and quarantine (pure).

    - Autoscaling disabled: no cap (``ReplicaControl.cap`` None), never quarantined: the router admits by
      projected KV tokens of its live sessions under ``maxSessionsPerReplica`` (its measured contexts, with
      ``expectedResidency`` only as the prior before any session finished), not a fixed residency cap.
    - Prometheus unreachable or stale: every replica falls back to its conservative floor.
    - Otherwise the law decides each replica from its own signals; a replica without
      signals of its own (a new pod not scraped yet) starts at, or drops to, the law's
      initial cap (the spec's ``expectedResidency`` cap).

    A replica's capacity is the one its engine reported (signals), else ``kv_capacity_tokens``
    (e.g. from the previous status), else the spec's estimate; a replica whose capacity stays
    unknown gets no control. Raises ``ValueError`` naming the field when the spec cannot be served.
    """
    blind = health.reason in ("PrometheusUnreachable", "MetricsStale")
    controls: dict[str, ReplicaControl] = {}
    for name in replicas:
        if not spec.autoscaling.enabled:
            controls[name] = ReplicaControl(cap=None)  # the same every pass: no status churn
            continue
        observed = None if blind else signals.get(name)
        capacity = (observed.kv_capacity_tokens if observed else None) or kv_capacity_tokens.get(name)
        capacity = capacity if capacity is not None else estimated_kv_capacity_tokens(spec)
        if capacity is None:
            continue
        params = law_params(spec=spec, kv_capacity_tokens=capacity)
        if observed is None and not blind:
            controls[name] = decide_unobserved(previous=previous.get(name), params=params, now=now)
        else:
            controls[name] = decide_replica(previous=previous.get(name), signals=observed, params=params, now=now)
    return controls
