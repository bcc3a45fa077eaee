"""KV-capacity arithmetic: bytes per token, tokens per replica, session caps (pure).

Nothing here does I/O; every function is a decision on its keyword arguments.
The sizing model follows vLLM: the engine takes ``gpu_memory_utilization`` of each
GPU's memory, subtracts the weights and an activation reserve, and splits the rest
into KV blocks of ``block_size`` tokens. A live session never needs more than
``max_model_len`` resident tokens, so ``capacity // max_model_len`` sessions always fit
together (the conservative floor). That they fit does not mean vLLM keeps them: its
LRU may evict a long-idle live prefix before newer blocks of finished sessions
(docs/benchmarks.md measures it). Sessions rarely fill their context: with
mean residency ``r`` the cap ``floor / r * (1 - headroom)`` oversubscribes on purpose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "DEFAULT_ACTIVATION_RESERVE_GIB",
    "DEFAULT_BLOCK_SIZE",
    "DTYPE_BYTES",
    "GIB",
    "GPU_PRESETS",
    "MODEL_PRESETS",
    "GpuPreset",
    "ModelPreset",
    "SessionCaps",
    "capacity_from_engine",
    "conservative_cap",
    "estimate_kv_capacity_tokens",
    "kv_bytes_per_token",
    "oversubscribed_cap",
    "session_caps",
]

GIB = 1024**3
DEFAULT_BLOCK_SIZE = 16
DEFAULT_ACTIVATION_RESERVE_GIB = 4.0
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelPreset:
    """Attention shape and weight size of a well-known model."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    weight_gib: float
    query_heads: int
    """Attention (query) heads: with ``head_dim`` and ``layers``, what prefill attention computes per token pair."""


@dataclass(frozen=True)
class GpuPreset:
    """Memory of a well-known GPU as the driver reports it."""

    name: str
    memory_gib: float


MODEL_PRESETS: dict[str, ModelPreset] = {
    # 8.03e9 parameters in bfloat16
    "llama-3.1-8b": ModelPreset("llama-3.1-8b", layers=32, kv_heads=8, head_dim=128, weight_gib=14.96, query_heads=32),
    # 8.19e9 parameters in bfloat16
    "qwen3-8b": ModelPreset("qwen3-8b", layers=36, kv_heads=8, head_dim=128, weight_gib=15.26, query_heads=32),
}

GPU_PRESETS: dict[str, GpuPreset] = {
    # total_memory as torch.cuda reports it on an H100 SXM 80 GB and an H200 141 GB
    "h100-80gb": GpuPreset("h100-80gb", memory_gib=79.19),
    "h200-141gb": GpuPreset("h200-141gb", memory_gib=140.40),
}


def kv_bytes_per_token(*, layers: int, kv_heads: int, head_dim: int, kv_dtype: str = "bfloat16") -> int:
    """Bytes of K and V one token occupies over all layers (pure).

    ``2 * layers * kv_heads * head_dim * dtype_bytes``: 128 KiB for Llama-3.1-8B and
    144 KiB for Qwen3-8B in bfloat16.
    """
    if min(layers, kv_heads, head_dim) < 1:
        raise ValueError("layers, kv_heads and head_dim must all be at least 1")
    try:
        width = DTYPE_BYTES[kv_dtype]
    except KeyError:
        raise ValueError(f"unknown kv dtype {kv_dtype!r}; expected one of {sorted(DTYPE_BYTES)}") from None
    return 2 * layers * kv_heads * head_dim * width


def estimate_kv_capacity_tokens(
    *,
    gpu_memory_gib: float,
    gpu_memory_utilization: float,
    weight_gib: float,
    bytes_per_token: int,
    num_gpus: int = 1,
    activation_reserve_gib: float = DEFAULT_ACTIVATION_RESERVE_GIB,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> int:
    """KV capacity of one replica in tokens, a whole number of blocks (pure).

    With tensor parallelism over ``num_gpus`` the memory and the activation reserve
    scale with the GPU count while the weights and the per-token KV bytes are split.
    Returns 0 when the weights and reserve leave no room.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError("gpu_memory_utilization must be in (0, 1]")
    if bytes_per_token < 1 or block_size < 1 or num_gpus < 1:
        raise ValueError("bytes_per_token, block_size and num_gpus must be positive")
    free_gib = num_gpus * (gpu_memory_gib * gpu_memory_utilization - activation_reserve_gib) - weight_gib
    if free_gib <= 0:
        return 0
    blocks = math.floor(free_gib * GIB / (bytes_per_token * block_size))
    return blocks * block_size


def capacity_from_engine(*, num_gpu_blocks: int, block_size: int) -> int:
    """KV capacity in tokens as a running engine reports it: ``num_gpu_blocks * block_size`` (pure)."""
    if num_gpu_blocks < 0 or block_size < 1:
        raise ValueError("num_gpu_blocks must be >= 0 and block_size >= 1")
    return num_gpu_blocks * block_size


def conservative_cap(*, capacity_tokens: int, max_model_len: int) -> int:
    """Live sessions that fit together even at full context: ``capacity // max_model_len`` (pure)."""
    if capacity_tokens < 0 or max_model_len < 1:
        raise ValueError("capacity_tokens must be >= 0 and max_model_len >= 1")
    return capacity_tokens // max_model_len


def oversubscribed_cap(
    *,
    capacity_tokens: int,
    max_model_len: int,
    expected_residency: float,
    headroom: float,
    ceiling: int | None = None,
) -> int:
    """The cap from an expected residency, never below the conservative floor (pure).

    ``floor(capacity / (max_model_len * residency) * (1 - headroom))``, raised to the
    floor when headroom would push it below, and limited by ``ceiling`` when given
    (the ceiling wins over the floor: a user's hard limit is a hard limit).
    """
    if not 0 < expected_residency <= 1:
        raise ValueError("expected_residency must be in (0, 1]")
    if not 0 <= headroom < 1:
        raise ValueError("headroom must be in [0, 1)")
    floor = conservative_cap(capacity_tokens=capacity_tokens, max_model_len=max_model_len)
    raw = math.floor(capacity_tokens / (max_model_len * expected_residency) * (1 - headroom) + 1e-9)
    cap = max(floor, raw)
    return cap if ceiling is None else min(cap, ceiling)


@dataclass(frozen=True)
class SessionCaps:
    """The caps one replica starts from."""

    capacity_tokens: int
    """KV capacity in tokens."""
    floor: int
    """Conservative cap: no eviction ever."""
    initial: int
    """Cap from the expected residency and headroom."""
    ceiling: int | None
    """User's hard ceiling, if any."""


def session_caps(
    *,
    capacity_tokens: int,
    max_model_len: int,
    expected_residency: float,
    headroom: float,
    ceiling: int | None = None,
) -> SessionCaps:
    """Floor, initial cap and ceiling for one replica (pure).

    Raises ``ValueError`` naming the field when the spec cannot be served: KV capacity
    below one full context, or a ceiling below the conservative floor.
    """
    floor = conservative_cap(capacity_tokens=capacity_tokens, max_model_len=max_model_len)
    if floor < 1:
        raise ValueError(
            f"spec.engine.maxModelLen: {max_model_len} tokens exceed the KV capacity of "
            f"{capacity_tokens} tokens per replica; vLLM would refuse to start"
        )
    if ceiling is not None and ceiling < floor:
        raise ValueError(
            f"spec.concurrency.maxSessionsPerReplica: {ceiling} is below the conservative floor "
            f"of {floor} sessions per replica"
        )
    initial = oversubscribed_cap(
        capacity_tokens=capacity_tokens,
        max_model_len=max_model_len,
        expected_residency=expected_residency,
        headroom=headroom,
        ceiling=ceiling,
    )
    return SessionCaps(capacity_tokens=capacity_tokens, floor=floor, initial=initial, ceiling=ceiling)
