"""The capacity planner behind ``rolloutpool plan``: presets in, one row per residency out (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rolloutpool.capacity import (
    DEFAULT_ACTIVATION_RESERVE_GIB,
    GIB,
    GPU_PRESETS,
    MODEL_PRESETS,
    conservative_cap,
    estimate_kv_capacity_tokens,
    kv_bytes_per_token,
    oversubscribed_cap,
    session_caps,
)

__all__ = ["PlanInputs", "PlanRow", "plan_rows", "residency_for_cap"]


@dataclass(frozen=True)
class PlanInputs:
    """What the user tells the planner."""

    model: str
    gpu: str
    max_model_len: int
    residencies: tuple[float, ...]
    headroom: float = 0.1
    gpu_memory_utilization: float = 0.9
    num_gpus: int = 1
    kv_dtype: str = "bfloat16"
    activation_reserve_gib: float = DEFAULT_ACTIVATION_RESERVE_GIB
    replicas: int = 1
    ceiling: int | None = None


@dataclass(frozen=True)
class PlanRow:
    """One line of the plan."""

    residency: float
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    kv_capacity_gib: float
    floor: int
    cap: int
    fleet_sessions: int


def plan_rows(inputs: PlanInputs) -> list[PlanRow]:
    """Capacity and caps for each residency (pure). Raises ``ValueError`` for unknown presets."""
    try:
        model = MODEL_PRESETS[inputs.model]
    except KeyError:
        raise ValueError(f"unknown model preset {inputs.model!r}; choose from {sorted(MODEL_PRESETS)}") from None
    try:
        gpu = GPU_PRESETS[inputs.gpu]
    except KeyError:
        raise ValueError(f"unknown GPU preset {inputs.gpu!r}; choose from {sorted(GPU_PRESETS)}") from None
    per_token = kv_bytes_per_token(
        layers=model.layers, kv_heads=model.kv_heads, head_dim=model.head_dim, kv_dtype=inputs.kv_dtype
    )
    capacity = estimate_kv_capacity_tokens(
        gpu_memory_gib=gpu.memory_gib,
        gpu_memory_utilization=inputs.gpu_memory_utilization,
        weight_gib=model.weight_gib,
        bytes_per_token=per_token,
        num_gpus=inputs.num_gpus,
        activation_reserve_gib=inputs.activation_reserve_gib,
    )
    rows = []
    for residency in inputs.residencies:
        caps = session_caps(
            capacity_tokens=capacity,
            max_model_len=inputs.max_model_len,
            expected_residency=residency,
            headroom=inputs.headroom,
            ceiling=inputs.ceiling,
        )
        rows.append(
            PlanRow(
                residency=residency,
                kv_bytes_per_token=per_token,
                kv_capacity_tokens=capacity,
                kv_capacity_gib=capacity * per_token / GIB,
                floor=caps.floor,
                cap=caps.initial,
                fleet_sessions=caps.initial * inputs.replicas,
            )
        )
    return rows


def residency_for_cap(*, cap: int, capacity_tokens: int, max_model_len: int, headroom: float) -> float:
    """The largest ``expectedResidency`` (two decimals) whose cap is at least ``cap`` (pure).

    With it and ``maxSessionsPerReplica: cap`` a pool's cap is exactly ``cap``. ``ValueError`` when no
    residency from 0.01 reaches it, or ``cap`` is below the conservative floor.
    """
    floor = conservative_cap(capacity_tokens=capacity_tokens, max_model_len=max_model_len)
    if cap < floor:
        raise ValueError(f"cap {cap} is below the conservative floor of {floor} sessions per replica")
    if cap == floor:
        return 1.0
    residency = min(1.0, math.floor(capacity_tokens * (1 - headroom) / (max_model_len * cap) * 100) / 100)
    if residency < 0.01:
        raise ValueError(f"cap {cap} needs an expected residency below 0.01")
    while (
        residency > 0.01
        and oversubscribed_cap(
            capacity_tokens=capacity_tokens,
            max_model_len=max_model_len,
            expected_residency=residency,
            headroom=headroom,
        )
        < cap
    ):  # float rounding at the boundary
        residency = round(residency - 0.01, 2)
    return residency
