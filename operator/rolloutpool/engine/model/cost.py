"""Step-time cost model of one engine replica (pure).

A step costs a fixed overhead, plus its prefill tokens at the prefill rate, plus one
read of the weights and of the KV of every scheduled request over HBM bandwidth:

    t = overhead + prefill_tokens / prefill_rate + (weight_bytes + kv_tokens * kv_bytes) / bandwidth

The figures are estimates (DESIGN section 5) and every one is a parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rolloutpool.capacity import (
    GIB,
    GPU_PRESETS,
    MODEL_PRESETS,
    estimate_kv_capacity_tokens,
    kv_bytes_per_token,
)

__all__ = ["HARDWARE_PRESETS", "CostModel", "HardwarePreset", "hardware_preset"]


@dataclass(frozen=True)
class CostModel:
    """Parameters of the step-time model; defaults are Qwen3-8B on an H100 80 GB."""

    step_overhead_s: float = 0.004
    prefill_tokens_per_s: float = 20_000.0
    weight_bytes: float = 15.26 * GIB
    kv_bytes_per_token: int = 147_456
    hbm_bytes_per_s: float = 3.0e12

    @property
    def fixed_step_seconds(self) -> float:
        """What every step costs whatever it holds: the overhead and one read of the weights (the floor of a step)."""
        return self.step_overhead_s + self.weight_bytes / self.hbm_bytes_per_s

    def kv_read_seconds(self, tokens: int) -> float:
        """One read of ``tokens`` tokens' KV over HBM (a step that reads a whole cache of ``tokens`` pays this)."""
        return tokens * self.kv_bytes_per_token / self.hbm_bytes_per_s

    def step_seconds(self, *, prefill_tokens: int, kv_tokens_read: int) -> float:
        """Duration of one step."""
        read = self.weight_bytes + kv_tokens_read * self.kv_bytes_per_token
        return self.step_overhead_s + prefill_tokens / self.prefill_tokens_per_s + read / self.hbm_bytes_per_s

    def decode_run_seconds(self, *, steps: int, batch: int, kv_tokens_read: int) -> float:
        """Duration of ``steps`` decode steps of ``batch`` requests whose KV grows one token a step.

        Closed form of the sum of :meth:`step_seconds` with no prefill, the KV read
        starting at ``kv_tokens_read`` and growing by ``batch`` each step.
        """
        per_step = self.step_overhead_s + self.weight_bytes / self.hbm_bytes_per_s
        kv_sum = steps * kv_tokens_read + batch * steps * (steps - 1) // 2
        return steps * per_step + kv_sum * self.kv_bytes_per_token / self.hbm_bytes_per_s

    def decode_steps_within(self, seconds: float, *, max_steps: int, batch: int, kv_tokens_read: int) -> int:
        """The most steps ``s`` in ``0..max_steps`` with ``decode_run_seconds(s) <= seconds`` (0 if none from 1).

        :meth:`decode_run_seconds` never decreases with ``steps`` (each rounded term is
        monotone), so that ``s`` is unique: a float estimate from the quadratic is
        corrected by exact comparisons, giving what a binary search would.
        """
        per_step = self.step_overhead_s + self.weight_bytes / self.hbm_bytes_per_s
        per_kv = self.kv_bytes_per_token / self.hbm_bytes_per_s
        # seconds ~ s * per_step + (s * kv + batch * s * (s - 1) / 2) * per_kv: solve for s
        a = batch * per_kv / 2
        b = per_step + (kv_tokens_read - batch / 2) * per_kv
        disc = b * b + 4 * a * seconds
        guess = (math.sqrt(disc) - b) / (2 * a) if a > 0 and disc >= 0 else seconds / b if b > 0 else 0.0
        s = max(0, min(max_steps, int(guess))) if math.isfinite(guess) else 0
        run_seconds = self.decode_run_seconds
        while s < max_steps and run_seconds(steps=s + 1, batch=batch, kv_tokens_read=kv_tokens_read) <= seconds:
            s += 1
        while s > 0 and run_seconds(steps=s, batch=batch, kv_tokens_read=kv_tokens_read) > seconds:
            s -= 1
        return s


@dataclass(frozen=True)
class HardwarePreset:
    """A named replica: GPU, model, KV capacity and cost model."""

    name: str
    num_gpu_blocks: int
    cost: CostModel

    @property
    def kv_capacity_tokens(self) -> int:
        """KV capacity in tokens (16-token blocks)."""
        return self.num_gpu_blocks * 16


def _preset(name: str, gpu: str, bandwidth: float) -> HardwarePreset:
    model = MODEL_PRESETS["qwen3-8b"]
    per_token = kv_bytes_per_token(layers=model.layers, kv_heads=model.kv_heads, head_dim=model.head_dim)
    tokens = estimate_kv_capacity_tokens(
        gpu_memory_gib=GPU_PRESETS[gpu].memory_gib,
        gpu_memory_utilization=0.9,
        weight_gib=model.weight_gib,
        bytes_per_token=per_token,
    )
    cost = CostModel(weight_bytes=model.weight_gib * GIB, kv_bytes_per_token=per_token, hbm_bytes_per_s=bandwidth)
    return HardwarePreset(name=name, num_gpu_blocks=tokens // 16, cost=cost)


HARDWARE_PRESETS: dict[str, HardwarePreset] = {
    "h100-80gb": _preset("h100-80gb", "h100-80gb", 3.0e12),
    "h200-141gb": _preset("h200-141gb", "h200-141gb", 4.5e12),
}


def hardware_preset(name: str) -> HardwarePreset:
    """Look up a preset by name; ``ValueError`` names the choices."""
    try:
        return HARDWARE_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown hardware preset {name!r}; choose from {sorted(HARDWARE_PRESETS)}") from None
