"""One simulated replica from the planner's presets: model x GPU -> KV capacity and step-time model (pure).

The KV capacity is what ``rolloutpool plan`` computes (:mod:`rolloutpool.capacity`: the model's
KV bytes per token, the GPU's memory, ``gpu_memory_utilization``, the GPUs of one replica), or an
explicit figure. The step-time model (:class:`~rolloutpool.engine.model.cost.CostModel`) takes the GPU's
overhead, bandwidths, linear-layer rate, knee and attention cost from the engine's hardware preset of the same
name (:data:`~rolloutpool.engine.model.cost.HARDWARE_PRESETS`, calibrated for Qwen3-8B), and scales them to the
model and the GPU count:

- weights and KV bytes per token are the model's (KV in ``kv_dtype``);
- bandwidths, the linear-layer rate and the attention rate grow linearly with the GPUs of a replica (tensor
  parallelism with no communication cost: an optimistic bound); the knee, in tokens a step, does not move;
- the linear-layer rate is compute-bound, so it falls in proportion to the weights (2 FLOPs per
  parameter per token): a model twice the size prefills half as fast;
- the attention cost per query-key pair follows the model's layers x query heads x head dimension;
- ``prefill_cost_scale`` multiplies what prefill tokens cost (the halved / doubled runs).

So ``qwen3-8b`` on one ``h100-80gb`` is exactly the engine's ``h100-80gb`` preset.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rolloutpool.capacity import (
    DEFAULT_BLOCK_SIZE,
    GIB,
    GPU_PRESETS,
    MODEL_PRESETS,
    conservative_cap,
    estimate_kv_capacity_tokens,
    kv_bytes_per_token,
)
from rolloutpool.engine.model.cost import HARDWARE_PRESETS, CostModel, attention_pair_seconds
from rolloutpool.sim.config import FleetConfig

__all__ = ["DEFAULT_GPU", "DEFAULT_MODEL", "ReplicaHardware", "replica_hardware", "with_hardware"]

DEFAULT_MODEL = "qwen3-8b"
DEFAULT_GPU = "h100-80gb"
_REFERENCE_MODEL = "qwen3-8b"
"""The model the engine's hardware presets were figured for."""


@dataclass(frozen=True)
class ReplicaHardware:
    """One replica as the simulator runs it."""

    model: str
    gpu: str
    gpus: int
    kv_capacity_tokens: int
    """Whole 16-token blocks."""
    kv_capacity_source: str
    """``"estimated"`` (from the presets, as ``plan``) or ``"explicit"``."""
    cost: CostModel

    @property
    def num_gpu_blocks(self) -> int:
        """KV blocks of ``DEFAULT_BLOCK_SIZE`` tokens."""
        return self.kv_capacity_tokens // DEFAULT_BLOCK_SIZE

    @property
    def label(self) -> str:
        """``model on NxGPU`` for tables."""
        return f"{self.model} on {self.gpus}x {self.gpu}"

    def describe(self) -> dict[str, object]:
        """The figures a results file records."""
        return {
            "model": self.model,
            "gpu": self.gpu,
            "gpus_per_replica": self.gpus,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "kv_capacity_source": self.kv_capacity_source,
            "step_overhead_s": self.cost.step_overhead_s,
            "weight_bytes_per_s": self.cost.weight_bytes_per_s,
            "kv_bytes_per_s": self.cost.kv_bytes_per_s,
            "linear_tokens_per_s": self.cost.linear_tokens_per_s,
            "knee_tokens": self.cost.knee_tokens,
            "attention_pair_s": self.cost.attention_pair_s,
            "prefill_cost_scale": self.cost.prefill_cost_scale,
        }


def _cost(*, model: str, gpu: str, gpus: int, kv_dtype: str, prefill_cost_scale: float) -> CostModel:
    try:
        reference = HARDWARE_PRESETS[gpu].cost
    except KeyError:
        raise ValueError(
            f"GPU preset {gpu!r} has no step-time figures; the simulator knows {sorted(HARDWARE_PRESETS)}"
        ) from None
    shape, ref = MODEL_PRESETS[model], MODEL_PRESETS[_REFERENCE_MODEL]
    compute = ref.weight_gib / shape.weight_gib
    attention = attention_pair_seconds(shape) / attention_pair_seconds(ref)
    return replace(
        reference,
        weight_bytes=shape.weight_gib * GIB,
        weight_bytes_per_s=reference.weight_bytes_per_s * gpus,
        kv_bytes_per_token=kv_bytes_per_token(
            layers=shape.layers, kv_heads=shape.kv_heads, head_dim=shape.head_dim, kv_dtype=kv_dtype
        ),
        kv_bytes_per_s=reference.kv_bytes_per_s * gpus,
        linear_tokens_per_s=reference.linear_tokens_per_s * gpus * compute,
        attention_pair_s=reference.attention_pair_s * attention / gpus,
        prefill_cost_scale=prefill_cost_scale,
    )


def replica_hardware(
    *,
    model: str,
    gpu: str,
    max_model_len: int,
    gpus_per_replica: int = 1,
    gpu_memory_utilization: float = 0.9,
    kv_dtype: str = "bfloat16",
    kv_capacity_tokens: int | None = None,
    prefill_cost_scale: float = 1.0,
) -> ReplicaHardware:
    """The replica for these presets (pure); ``ValueError`` names the bad input.

    ``kv_capacity_tokens`` overrides the estimate (rounded down to whole blocks). Either way the
    capacity must hold one ``max_model_len`` context, as vLLM requires to start. ``prefill_cost_scale``
    multiplies what prefill costs (:class:`~rolloutpool.engine.model.cost.CostModel`).
    """
    if model not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {model!r}; choose from {sorted(MODEL_PRESETS)}")
    if gpu not in GPU_PRESETS:
        raise ValueError(f"unknown GPU preset {gpu!r}; choose from {sorted(GPU_PRESETS)}")
    if gpus_per_replica < 1:
        raise ValueError("gpus per replica must be at least 1")
    if not prefill_cost_scale > 0:
        raise ValueError(f"prefill cost scale must be positive, got {prefill_cost_scale}")
    cost = _cost(model=model, gpu=gpu, gpus=gpus_per_replica, kv_dtype=kv_dtype, prefill_cost_scale=prefill_cost_scale)
    if kv_capacity_tokens is None:
        shape = MODEL_PRESETS[model]
        tokens = estimate_kv_capacity_tokens(
            gpu_memory_gib=GPU_PRESETS[gpu].memory_gib,
            gpu_memory_utilization=gpu_memory_utilization,
            weight_gib=shape.weight_gib,
            bytes_per_token=cost.kv_bytes_per_token,
            num_gpus=gpus_per_replica,
        )
        source = "estimated"
    else:
        tokens = kv_capacity_tokens // DEFAULT_BLOCK_SIZE * DEFAULT_BLOCK_SIZE
        source = "explicit"
    if conservative_cap(capacity_tokens=tokens, max_model_len=max_model_len) < 1:
        where = "--kv-capacity-tokens" if source == "explicit" else f"{model} on {gpus_per_replica}x {gpu}"
        raise ValueError(
            f"{where}: a KV capacity of {tokens:,} tokens per replica does not hold one maxModelLen context "
            f"({max_model_len:,} tokens); vLLM would refuse to start (more GPUs per replica, a higher "
            "gpu-memory-utilization or a shorter maxModelLen)"
        )
    return ReplicaHardware(
        model=model, gpu=gpu, gpus=gpus_per_replica, kv_capacity_tokens=tokens, kv_capacity_source=source, cost=cost
    )


def with_hardware(config: FleetConfig, replica: ReplicaHardware) -> FleetConfig:
    """``config`` with the replica's KV blocks and step-time model (pure).

    ``hardware`` keeps naming the GPU's engine preset (a label; the blocks and the cost model given here win).
    """
    return replace(config, hardware=replica.gpu, num_gpu_blocks=replica.num_gpu_blocks, cost=replica.cost)
