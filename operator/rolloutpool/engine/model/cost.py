"""Step-time cost model of one engine replica (pure), calibrated against published vLLM figures.

A step of ``N`` tokens (prefill and decode together) costs:

    t = overhead
      + weight_bytes / weight_bandwidth                        # one read of the weights
      + max(0, N_eff - knee) / linear_rate                     # linear layers, once past the memory-bound knee
      + kv_tokens_read * kv_bytes / kv_bandwidth               # every scheduled request reads its cached KV
      + prefill_scale * a_pair * sum over prefill chunks of q * (p + q / 2)   # prefill attention

where a chunk computes ``q`` new tokens over ``p`` already computed ones, and ``N_eff = decode_tokens +
prefill_scale * prefill_tokens`` (``prefill_cost_scale``, 1.0 unless a run halves or doubles what prefill costs).
One ``n``-token prompt therefore costs about ``n / linear_rate + a_pair * n**2 / 2``: linear up to a few
thousand tokens, quadratic past ~50k (attention). A decode step costs the overhead, the weight read, its KV
read and, past ``knee`` sequences, their linear-layer compute.

The presets (:data:`HARDWARE_PRESETS`, Qwen3-8B) take their figures from ``gpu-calibration/README.md``
(section (c); rows named there) and ``docs/cost-model.md``:

- overhead 2.5 ms and weight bandwidth 3.0 / 4.0 TB/s: vLLM CI's batch-8 decode step of Llama-3.1-8B, 7.8 ms on an
  H100 and 6.5 ms on an H200 (row D1);
- KV read bandwidth 2.4 / 3.4 TB/s: decode attention at 62-81 % of peak HBM (D4), near peak for long sequences (D6);
- linear rate 43k / 44k tokens/s and attention 579 TFLOP/s (``a_pair`` 1.02e-9 s per query-key pair for Qwen3-8B):
  a least-squares fit of vLLM's single-request TTFT of Llama-3.1-8B on an H100 from 10k to 100k tokens
  (vLLM's KV offloading post, Figure 1: row P1), 44k tokens/s for 512-token prompts (Figure 2: P2), FlashAttention-3
  up to 740 TFLOP/s (P7); the H200 has the same compute die (P3: within 3 % of the H100);
- knee 128 tokens a step: kernel profiles of the linear layers, flat to 64-128 tokens, 1.6x at 256 (D3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from rolloutpool.capacity import (
    GIB,
    GPU_PRESETS,
    MODEL_PRESETS,
    ModelPreset,
    estimate_kv_capacity_tokens,
    kv_bytes_per_token,
)

__all__ = [
    "ATTENTION_FLOPS_PER_S",
    "HARDWARE_PRESETS",
    "CostModel",
    "HardwarePreset",
    "attention_pair_seconds",
    "hardware_preset",
]

ATTENTION_FLOPS_PER_S = 579e12
"""Effective prefill-attention rate of an H100 (and H200, the same die) in bf16: the quadratic term of the fit to
vLLM's measured TTFT (row P1-fit), between FlashAttention-2 (~35 % of 989 TFLOP/s) and FlashAttention-3 (up to 740)."""


def attention_pair_seconds(model: ModelPreset, *, flops_per_s: float = ATTENTION_FLOPS_PER_S) -> float:
    """Seconds per query-key pair of prefill attention (pure): ``4 * layers * query_heads * head_dim / rate``.

    Each pair costs a multiply-add for ``Q K^T`` and one for ``P V`` over every query dimension of every layer.
    Qwen3-8B: 1.02e-9 s on an H100; Llama-3.1-8B: 9.06e-10 s.
    """
    return 4 * model.layers * model.query_heads * model.head_dim / flops_per_s


@dataclass(frozen=True)
class CostModel:
    """Parameters of the step-time model; defaults are Qwen3-8B on an H100 80 GB (the ``h100-80gb`` preset)."""

    step_overhead_s: float = 0.0025
    """Fixed CPU and launch cost of every step."""
    weight_bytes: float = 15.26 * GIB
    weight_bytes_per_s: float = 3.0e12
    """Effective HBM bandwidth of the weight read."""
    kv_bytes_per_token: int = 147_456
    kv_bytes_per_s: float = 2.4e12
    """Effective HBM bandwidth of the KV read (decode attention, and a chunk's read of its cached prefix)."""
    linear_tokens_per_s: float = 43_000.0
    """Tokens per second through the linear layers once a step is compute-bound."""
    knee_tokens: int = 128
    """Tokens a step holds before its linear layers leave the memory-bound floor."""
    attention_pair_s: float = attention_pair_seconds(MODEL_PRESETS["qwen3-8b"])
    """Seconds per query-key pair of prefill attention (:func:`attention_pair_seconds`)."""
    prefill_cost_scale: float = 1.0
    """Multiplies what prefill tokens cost (their linear-layer compute and their attention): 0.5 halves, 2.0 doubles.
    The overhead, the weight and KV reads and decode tokens are unchanged."""

    def __post_init__(self) -> None:
        positive = ("weight_bytes_per_s", "kv_bytes_per_s", "linear_tokens_per_s", "prefill_cost_scale")
        non_negative = ("step_overhead_s", "weight_bytes", "attention_pair_s")
        bad = [name for name in positive if not getattr(self, name) > 0]
        bad += [name for name in non_negative if not getattr(self, name) >= 0]
        if bad or self.kv_bytes_per_token < 1 or self.knee_tokens < 0:
            raise ValueError(
                "cost model: weight/KV bandwidths, linear rate and prefill cost scale must be positive, overhead, "
                f"weight bytes and attention cost non-negative, kv_bytes_per_token >= 1, knee >= 0 (bad: {bad})"
            )

    def __reduce__(self) -> tuple[type[CostModel], tuple[float, ...]]:
        """Pickle through the constructor: a frozen dataclass compiled with mypyc (rolloutpool.sim.compiled) cannot
        be unpickled field by field, and the fleet simulator sends its cost model to worker processes."""
        return CostModel, tuple(getattr(self, f.name) for f in fields(self))

    def with_prefill_cost_scale(self, scale: float) -> CostModel:
        """This model with prefill ``scale`` times as dear (``ValueError`` unless positive)."""
        return replace(self, prefill_cost_scale=scale)

    @property
    def fixed_step_seconds(self) -> float:
        """What every step costs whatever it holds: the overhead and one read of the weights (the floor of a step)."""
        return self.step_overhead_s + self.weight_bytes / self.weight_bytes_per_s

    def kv_read_seconds(self, tokens: int) -> float:
        """One read of ``tokens`` tokens' KV (a step that reads a whole cache of ``tokens`` pays this)."""
        return tokens * self.kv_bytes_per_token / self.kv_bytes_per_s

    def step_seconds(
        self, *, prefill_tokens: int = 0, decode_tokens: int = 0, kv_tokens_read: int = 0, attention_pairs: float = 0.0
    ) -> float:
        """Duration of one step: ``attention_pairs`` is the sum of ``q * (p + q / 2)`` over its prefill chunks."""
        scale = self.prefill_cost_scale
        compute = decode_tokens + scale * prefill_tokens - self.knee_tokens
        return (
            self.step_overhead_s
            + self.weight_bytes / self.weight_bytes_per_s
            + (compute / self.linear_tokens_per_s if compute > 0 else 0.0)
            + kv_tokens_read * self.kv_bytes_per_token / self.kv_bytes_per_s
            + scale * self.attention_pair_s * attention_pairs
        )

    def prefill_seconds(self, tokens: int, *, cached: int = 0, chunk: int = 8192) -> float:
        """A lone prompt of ``tokens`` tokens, ``cached`` of them already in the cache, in chunks of ``chunk``.

        The sum of :meth:`step_seconds` over its chunks, as the engine schedules it when nothing else runs.
        """
        total, done = 0.0, cached
        while done < tokens:
            q = min(chunk, tokens - done)
            total += self.step_seconds(prefill_tokens=q, kv_tokens_read=done, attention_pairs=q * (done + q / 2))
            done += q
        return total

    def _decode_step_floor(self, batch: int) -> float:
        """A decode step's cost apart from its KV read: overhead, weights, and compute past the knee."""
        past_knee = batch - self.knee_tokens
        compute = past_knee / self.linear_tokens_per_s if past_knee > 0 else 0.0
        return self.step_overhead_s + self.weight_bytes / self.weight_bytes_per_s + compute

    def decode_run_seconds(self, *, steps: int, batch: int, kv_tokens_read: int) -> float:
        """Duration of ``steps`` decode steps of ``batch`` requests whose KV grows one token a step.

        Closed form of the sum of :meth:`step_seconds` with ``batch`` decode tokens and no prefill, the KV read
        starting at ``kv_tokens_read`` and growing by ``batch`` each step.
        """
        kv_sum = steps * kv_tokens_read + batch * steps * (steps - 1) // 2
        return steps * self._decode_step_floor(batch) + kv_sum * self.kv_bytes_per_token / self.kv_bytes_per_s

    def decode_steps_within(self, seconds: float, *, max_steps: int, batch: int, kv_tokens_read: int) -> int:
        """The most steps ``s`` in ``0..max_steps`` with ``decode_run_seconds(s) <= seconds`` (0 if none from 1).

        :meth:`decode_run_seconds` never decreases with ``steps`` (each rounded term is
        monotone), so that ``s`` is unique: a float estimate from the quadratic is
        corrected by exact comparisons, giving what a binary search would.
        """
        per_step = self._decode_step_floor(batch)
        per_kv = self.kv_bytes_per_token / self.kv_bytes_per_s
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


def _preset(
    name: str, *, weight_bytes_per_s: float, kv_bytes_per_s: float, linear_tokens_per_s: float
) -> HardwarePreset:
    model = MODEL_PRESETS["qwen3-8b"]
    per_token = kv_bytes_per_token(layers=model.layers, kv_heads=model.kv_heads, head_dim=model.head_dim)
    tokens = estimate_kv_capacity_tokens(
        gpu_memory_gib=GPU_PRESETS[name].memory_gib,
        gpu_memory_utilization=0.9,
        weight_gib=model.weight_gib,
        bytes_per_token=per_token,
    )
    cost = CostModel(
        step_overhead_s=0.0025,
        weight_bytes=model.weight_gib * GIB,
        weight_bytes_per_s=weight_bytes_per_s,
        kv_bytes_per_token=per_token,
        kv_bytes_per_s=kv_bytes_per_s,
        linear_tokens_per_s=linear_tokens_per_s,
        knee_tokens=128,
        attention_pair_s=attention_pair_seconds(model),
    )
    return HardwarePreset(name=name, num_gpu_blocks=tokens // 16, cost=cost)


HARDWARE_PRESETS: dict[str, HardwarePreset] = {
    # gpu-calibration/README.md section (c), "Parameter table per preset": H100 and H200 columns
    "h100-80gb": _preset("h100-80gb", weight_bytes_per_s=3.0e12, kv_bytes_per_s=2.4e12, linear_tokens_per_s=43_000.0),
    "h200-141gb": _preset("h200-141gb", weight_bytes_per_s=4.0e12, kv_bytes_per_s=3.4e12, linear_tokens_per_s=44_000.0),
}


def hardware_preset(name: str) -> HardwarePreset:
    """Look up a preset by name; ``ValueError`` names the choices."""
    try:
        return HARDWARE_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown hardware preset {name!r}; choose from {sorted(HARDWARE_PRESETS)}") from None
