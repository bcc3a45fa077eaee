"""The simulator's replica from the planner's presets: model x GPU -> KV capacity, step-time model, FleetConfig."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rolloutpool.capacity import GPU_PRESETS, MODEL_PRESETS
from rolloutpool.engine.model.cost import HARDWARE_PRESETS
from rolloutpool.planner import PlanInputs, plan_rows
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.fleet import simulate_policy
from rolloutpool.sim.hardware import replica_hardware, with_hardware
from rolloutpool.sim.runner import fleet_floor
from rolloutpool.sim.workload import scenario


@pytest.mark.parametrize("gpu", sorted(HARDWARE_PRESETS))
def test_qwen3_8b_on_one_gpu_is_the_engine_preset_of_that_name(gpu: str) -> None:
    replica = replica_hardware(model="qwen3-8b", gpu=gpu, max_model_len=32768)
    preset = HARDWARE_PRESETS[gpu]
    assert replica.num_gpu_blocks == preset.num_gpu_blocks
    assert replica.cost == preset.cost
    assert replica.kv_capacity_source == "estimated"


@pytest.mark.parametrize("model", sorted(MODEL_PRESETS))
@pytest.mark.parametrize("gpu", sorted(GPU_PRESETS))
@pytest.mark.parametrize(("gpus", "utilization", "dtype"), [(1, 0.9, "bfloat16"), (2, 0.8, "fp8")])
def test_kv_capacity_is_what_plan_prints(model: str, gpu: str, gpus: int, utilization: float, dtype: str) -> None:
    (row,) = plan_rows(
        PlanInputs(model=model, gpu=gpu, max_model_len=32768, residencies=(1.0,), gpu_memory_utilization=utilization,
                   num_gpus=gpus, kv_dtype=dtype)
    )  # fmt: skip
    replica = replica_hardware(
        model=model, gpu=gpu, max_model_len=32768, gpus_per_replica=gpus, gpu_memory_utilization=utilization,
        kv_dtype=dtype,
    )  # fmt: skip
    assert replica.kv_capacity_tokens == row.kv_capacity_tokens
    assert replica.cost.kv_bytes_per_token == row.kv_bytes_per_token


def test_every_gpu_preset_has_step_time_figures() -> None:
    assert set(GPU_PRESETS) <= set(HARDWARE_PRESETS)


def test_cost_scales_with_gpus_and_weights() -> None:
    one = replica_hardware(model="qwen3-8b", gpu="h100-80gb", max_model_len=32768)
    two = replica_hardware(model="qwen3-8b", gpu="h100-80gb", max_model_len=32768, gpus_per_replica=2)
    assert two.cost.weight_bytes_per_s == 2 * one.cost.weight_bytes_per_s
    assert two.cost.kv_bytes_per_s == 2 * one.cost.kv_bytes_per_s
    assert two.cost.linear_tokens_per_s == 2 * one.cost.linear_tokens_per_s
    assert two.cost.attention_pair_s == one.cost.attention_pair_s / 2
    assert (two.cost.weight_bytes, two.cost.knee_tokens) == (one.cost.weight_bytes, one.cost.knee_tokens)
    llama = replica_hardware(model="llama-3.1-8b", gpu="h100-80gb", max_model_len=32768)
    ratio = MODEL_PRESETS["qwen3-8b"].weight_gib / MODEL_PRESETS["llama-3.1-8b"].weight_gib
    assert llama.cost.linear_tokens_per_s == pytest.approx(one.cost.linear_tokens_per_s * ratio)
    assert llama.cost.attention_pair_s == pytest.approx(one.cost.attention_pair_s * 32 / 36)  # layers
    assert llama.cost.kv_bytes_per_token == 128 * 1024
    assert replica_hardware(model="qwen3-8b", gpu="h200-141gb", max_model_len=32768).cost.weight_bytes_per_s > (
        one.cost.weight_bytes_per_s
    )
    halved = replica_hardware(model="qwen3-8b", gpu="h100-80gb", max_model_len=32768, prefill_cost_scale=0.5)
    assert halved.cost == one.cost.with_prefill_cost_scale(0.5)
    assert halved.describe()["prefill_cost_scale"] == 0.5
    with pytest.raises(ValueError, match="prefill cost scale must be positive"):
        replica_hardware(model="qwen3-8b", gpu="h100-80gb", max_model_len=32768, prefill_cost_scale=0.0)


def test_explicit_capacity_is_whole_blocks_and_must_hold_one_context() -> None:
    replica = replica_hardware(model="qwen3-8b", gpu="h100-80gb", max_model_len=8192, kv_capacity_tokens=100_007)
    assert (replica.kv_capacity_tokens, replica.num_gpu_blocks, replica.kv_capacity_source) == (
        100_000,
        6250,
        "explicit",
    )
    with pytest.raises(ValueError, match=r"--kv-capacity-tokens: a KV capacity of 4,096 tokens"):
        replica_hardware(model="qwen3-8b", gpu="h100-80gb", max_model_len=8192, kv_capacity_tokens=4096)
    with pytest.raises(ValueError, match=r"qwen3-8b on 1x h100-80gb: .* does not hold one maxModelLen"):
        replica_hardware(model="qwen3-8b", gpu="h100-80gb", max_model_len=4_000_000)


@pytest.mark.parametrize(("model", "gpu", "message"), [("gpt-5", "h100-80gb", "unknown model preset 'gpt-5'"),
                                                        ("qwen3-8b", "tpu", "unknown GPU preset 'tpu'")])  # fmt: skip
def test_unknown_presets_name_the_choices(model: str, gpu: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replica_hardware(model=model, gpu=gpu, max_model_len=32768)


def test_the_fleet_runs_the_replicas_blocks_and_cost() -> None:
    base = FleetConfig(scenario=scenario("tool-chat"), in_flight=8, replicas=1, duration_s=60.0)
    small = replica_hardware(model="qwen3-8b", gpu="h100-80gb", max_model_len=32768, kv_capacity_tokens=65_536)
    config = with_hardware(base, small)
    assert (config.hardware, config.num_gpu_blocks, config.cost) == ("h100-80gb", 4096, small.cost)
    assert fleet_floor(config) == 2
    quarter = {"weight_bytes_per_s": small.cost.weight_bytes_per_s / 4, "kv_bytes_per_s": small.cost.kv_bytes_per_s / 4}
    slow = replace(small, cost=replace(small.cost, **quarter))
    fast_run = simulate_policy(config, "sticky-least-loaded")
    slow_run = simulate_policy(with_hardware(base, slow), "sticky-least-loaded")
    assert slow_run.tokens_per_s < 0.6 * fast_run.tokens_per_s  # decode is bandwidth-bound: the cost model is used
