"""KV-capacity arithmetic: exact figures for the presets and properties for all inputs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rolloutpool.capacity import (
    GPU_PRESETS,
    MODEL_PRESETS,
    capacity_from_engine,
    conservative_cap,
    estimate_kv_capacity_tokens,
    kv_bytes_per_token,
    oversubscribed_cap,
    session_caps,
)


def test_bytes_per_token_of_known_models() -> None:
    assert kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128) == 128 * 1024  # Llama-3.1-8B
    assert kv_bytes_per_token(layers=36, kv_heads=8, head_dim=128) == 144 * 1024  # Qwen3-8B
    assert kv_bytes_per_token(layers=36, kv_heads=8, head_dim=128, kv_dtype="fp8") == 72 * 1024


@pytest.mark.parametrize(
    ("model", "gpu", "low", "high"),
    [
        ("llama-3.1-8b", "h100-80gb", 380_000, 440_000),
        ("qwen3-8b", "h100-80gb", 370_000, 440_000),
        ("llama-3.1-8b", "h200-141gb", 780_000, 880_000),
        ("qwen3-8b", "h200-141gb", 760_000, 880_000),
    ],
)
def test_presets_land_in_the_observed_range(model: str, gpu: str, low: int, high: int) -> None:
    m, g = MODEL_PRESETS[model], GPU_PRESETS[gpu]
    tokens = estimate_kv_capacity_tokens(
        gpu_memory_gib=g.memory_gib,
        gpu_memory_utilization=0.9,
        weight_gib=m.weight_gib,
        bytes_per_token=kv_bytes_per_token(layers=m.layers, kv_heads=m.kv_heads, head_dim=m.head_dim),
    )
    assert low <= tokens <= high
    assert tokens % 16 == 0


def test_engine_reported_capacity() -> None:
    assert capacity_from_engine(num_gpu_blocks=25_000, block_size=16) == 400_000
    with pytest.raises(ValueError, match="block_size"):
        capacity_from_engine(num_gpu_blocks=1, block_size=0)


def test_caps_of_a_known_pool() -> None:
    caps = session_caps(capacity_tokens=400_000, max_model_len=32768, expected_residency=0.5, headroom=0.1)
    assert caps.floor == 12  # 400000 // 32768
    assert caps.initial == 21  # floor(400000 / 16384 * 0.9) = floor(21.97)


def test_unservable_specs_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"spec\.concurrency\.maxSessionsPerReplica"):
        session_caps(capacity_tokens=400_000, max_model_len=32768, expected_residency=0.5, headroom=0.1, ceiling=5)
    with pytest.raises(ValueError, match=r"spec\.engine\.maxModelLen"):
        session_caps(capacity_tokens=10_000, max_model_len=32768, expected_residency=0.5, headroom=0.1)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="kv dtype"):
        kv_bytes_per_token(layers=1, kv_heads=1, head_dim=1, kv_dtype="int3")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        estimate_kv_capacity_tokens(gpu_memory_gib=80, gpu_memory_utilization=0, weight_gib=1, bytes_per_token=1)
    with pytest.raises(ValueError, match="residency"):
        oversubscribed_cap(capacity_tokens=1, max_model_len=1, expected_residency=0, headroom=0)


capacities = st.integers(min_value=0, max_value=10**9)
lengths = st.integers(min_value=1, max_value=10**7)
residencies = st.floats(min_value=0.01, max_value=1.0)
headrooms = st.floats(min_value=0.0, max_value=0.9)


@given(capacity=capacities, length=lengths)
def test_floor_never_oversubscribes(capacity: int, length: int) -> None:
    floor = conservative_cap(capacity_tokens=capacity, max_model_len=length)
    assert floor * length <= capacity < (floor + 1) * length


@given(capacity=capacities, length=lengths, residency=residencies, headroom=headrooms)
def test_cap_is_at_least_the_floor(capacity: int, length: int, residency: float, headroom: float) -> None:
    cap = oversubscribed_cap(
        capacity_tokens=capacity, max_model_len=length, expected_residency=residency, headroom=headroom
    )
    assert cap >= conservative_cap(capacity_tokens=capacity, max_model_len=length)
    # and never more than the residency alone would allow
    assert cap <= max(capacity // length, capacity / (length * residency) + 1e-6)


@given(capacity=capacities, length=lengths, r1=residencies, r2=residencies, headroom=headrooms)
def test_cap_grows_as_residency_falls(capacity: int, length: int, r1: float, r2: float, headroom: float) -> None:
    low, high = sorted((r1, r2))

    def cap(r: float) -> int:
        return oversubscribed_cap(
            capacity_tokens=capacity, max_model_len=length, expected_residency=r, headroom=headroom
        )

    assert cap(low) >= cap(high)


@given(capacity=capacities, length=lengths, residency=residencies, ceiling=st.integers(1, 10**6))
def test_ceiling_is_a_hard_limit(capacity: int, length: int, residency: float, ceiling: int) -> None:
    cap = oversubscribed_cap(
        capacity_tokens=capacity, max_model_len=length, expected_residency=residency, headroom=0.1, ceiling=ceiling
    )
    assert cap <= ceiling


@given(
    memory=st.floats(min_value=1, max_value=1000),
    extra=st.floats(min_value=0, max_value=1000),
    util=st.floats(min_value=0.05, max_value=1.0),
    weights=st.floats(min_value=0, max_value=500),
    per_token=st.integers(min_value=1, max_value=10**7),
    gpus=st.integers(min_value=1, max_value=8),
)
def test_capacity_is_whole_blocks_and_monotone_in_memory(
    memory: float, extra: float, util: float, weights: float, per_token: int, gpus: int
) -> None:
    def tokens(mem: float) -> int:
        return estimate_kv_capacity_tokens(
            gpu_memory_gib=mem,
            gpu_memory_utilization=util,
            weight_gib=weights,
            bytes_per_token=per_token,
            num_gpus=gpus,
        )

    small, large = tokens(memory), tokens(memory + extra)
    assert small % 16 == 0
    assert 0 <= small <= large
