"""The calibrated step-time model reproduces the published figures it was fitted to (gpu-calibration/README.md).

Every expected figure below is a row of that report: its prefill and decode tables for Qwen3-8B (section (c)),
and the measurements behind them (P1: vLLM's single-request TTFT of Llama-3.1-8B on an H100, digitized from the
KV offloading post's Figure 1; P2: its Figure 2; D1: vLLM CI's batch-8 decode step). The closed forms the
simulator runs on must equal the step-by-step sums.
"""

from __future__ import annotations

import math
import random

import pytest

from rolloutpool.engine.model.core import Engine, EngineConfig, Request
from rolloutpool.engine.model.cost import HARDWARE_PRESETS, CostModel
from rolloutpool.engine.model.hashing import SegmentChain
from rolloutpool.sim.hardware import replica_hardware

H100 = HARDWARE_PRESETS["h100-80gb"].cost
H200 = HARDWARE_PRESETS["h200-141gb"].cost
LLAMA_H100 = replica_hardware(model="llama-3.1-8b", gpu="h100-80gb", max_model_len=32768).cost
LLAMA_H200 = replica_hardware(model="llama-3.1-8b", gpu="h200-141gb", max_model_len=32768).cost

# the report's "Prefill of one n-token prompt" table, proposed columns (seconds), chunks of 8192
PREFILL_TABLE = {
    "h100-80gb": {1024: 0.029, 8192: 0.230, 32768: 1.33, 131072: 11.9},
    "h200-141gb": {1024: 0.027, 8192: 0.224, 32768: 1.31, 131072: 11.8},
}
# the report's "Decode step (ms)" table, proposed figures, by context then batch
DECODE_TABLE = {
    "h100-80gb": {
        1024: {1: 8.0, 8: 8.5, 32: 10.0, 64: 12.0, 128: 16.0, 256: 27.0},
        8192: {1: 8.5, 8: 12.0, 32: 24.1},
        32768: {1: 10.0, 8: 24.1},
    },
    "h200-141gb": {
        1024: {1: 6.6, 8: 7.0, 32: 8.0, 64: 9.4, 128: 12.3, 256: 20.9},
        8192: {1: 7.0, 8: 9.4, 32: 18.0, 64: 29.3},
        32768: {1: 8.0, 8: 18.0},
    },
}
# P1: single-request TTFT (ms) of Llama-3.1-8B-Instruct on an H100, digitized (offload_blog_fig1_digitized.csv)
P1_TTFT_MS = {10_000: 272, 20_000: 638, 30_000: 1097, 40_000: 1660, 50_000: 2288, 60_000: 3020, 70_000: 3845,
              80_000: 4792, 90_000: 5740, 100_000: 6846}  # fmt: skip


@pytest.mark.parametrize("gpu", sorted(PREFILL_TABLE))
def test_prefill_reproduces_the_reports_table(gpu: str) -> None:
    cost = HARDWARE_PRESETS[gpu].cost
    for tokens, seconds in PREFILL_TABLE[gpu].items():
        assert cost.prefill_seconds(tokens) == pytest.approx(seconds, rel=0.02), tokens


@pytest.mark.parametrize("gpu", sorted(DECODE_TABLE))
def test_decode_step_reproduces_the_reports_table(gpu: str) -> None:
    cost = HARDWARE_PRESETS[gpu].cost
    for context, row in DECODE_TABLE[gpu].items():
        for batch, ms in row.items():
            step = cost.step_seconds(decode_tokens=batch, kv_tokens_read=batch * context)
            assert 1e3 * step == pytest.approx(ms, abs=0.06), (context, batch)


def test_llama_prefill_matches_vllms_measured_ttft_on_an_h100() -> None:
    """P1: within 5 % from 10k to 100k tokens (the fit's residual is under 3 % from 20k)."""
    for tokens, ms in P1_TTFT_MS.items():
        assert 1e3 * LLAMA_H100.prefill_seconds(tokens) == pytest.approx(ms, rel=0.05), tokens
    # attention is most of the cost past ~50k tokens: the quadratic term, not the linear rate, makes 100k dear
    linear_only = LLAMA_H100.prefill_seconds(100_000) - LLAMA_H100.attention_pair_s * 100_000**2 / 2
    assert linear_only < 0.45 * LLAMA_H100.prefill_seconds(100_000)


def test_llama_prefill_throughput_of_short_prompts_matches_figure_2() -> None:
    """P2: 10,000 concurrent 512-token prefills ran at ~44k tokens/s (16 prompts fill an 8192-token step)."""
    step = LLAMA_H100.step_seconds(prefill_tokens=8192, attention_pairs=16 * 512 * (512 / 2))
    assert 8192 / step == pytest.approx(44_000, rel=0.06)


def test_llama_decode_matches_vllm_ci_at_batch_8() -> None:
    """D1: 32 in, 128 out, batch 8: 7.8 ms a step on an H100, 6.5 ms on an H200 (mean context ~96 tokens)."""
    assert 1e3 * LLAMA_H100.step_seconds(decode_tokens=8, kv_tokens_read=8 * 96) == pytest.approx(7.8, rel=0.03)
    assert 1e3 * LLAMA_H200.step_seconds(decode_tokens=8, kv_tokens_read=8 * 96) == pytest.approx(6.5, rel=0.03)


def test_prefill_cost_scale_multiplies_prefill_and_leaves_decode_alone() -> None:
    halved, doubled = H100.with_prefill_cost_scale(0.5), H100.with_prefill_cost_scale(2.0)
    floor = H100.fixed_step_seconds
    for tokens in (8192, 131072):  # the compute of a long prompt (its reads and floors aside) halves and doubles
        chunks = math.ceil(tokens / 8192)
        reads = sum(H100.kv_read_seconds(i * 8192) for i in range(chunks)) + chunks * floor
        knee = chunks * H100.knee_tokens / H100.linear_tokens_per_s
        base = H100.prefill_seconds(tokens) - reads + knee
        assert halved.prefill_seconds(tokens) - reads + knee == pytest.approx(base / 2)
        assert doubled.prefill_seconds(tokens) - reads + knee == pytest.approx(2 * base)
    for batch in (8, 512):
        step = H100.step_seconds(decode_tokens=batch, kv_tokens_read=batch * 4000)
        assert halved.step_seconds(decode_tokens=batch, kv_tokens_read=batch * 4000) == step
        assert doubled.decode_run_seconds(steps=7, batch=batch, kv_tokens_read=batch * 4000) == (
            H100.decode_run_seconds(steps=7, batch=batch, kv_tokens_read=batch * 4000)
        )
    with pytest.raises(ValueError, match="prefill cost scale"):
        H100.with_prefill_cost_scale(0.0)
    with pytest.raises(ValueError, match="linear rate"):
        CostModel(linear_tokens_per_s=-1.0)


@pytest.mark.parametrize("cost", [H100, H200, H100.with_prefill_cost_scale(2.0), LLAMA_H100])
def test_decode_run_closed_form_equals_the_step_by_step_sum(cost: CostModel) -> None:
    for batch in (1, 7, 128, 129, 300, 1024):  # below, at and past the knee
        for kv in (batch, batch * 3000):
            total = 0.0
            for step in range(40):
                assert cost.decode_run_seconds(steps=step, batch=batch, kv_tokens_read=kv) == pytest.approx(
                    total, rel=1e-12, abs=1e-15
                )
                total += cost.step_seconds(decode_tokens=batch, kv_tokens_read=kv + step * batch)


@pytest.mark.parametrize("cost", [H100, H200.with_prefill_cost_scale(0.5)])
def test_decode_steps_within_equals_a_binary_search_past_the_knee(cost: CostModel) -> None:
    rng = random.Random(5)
    for _ in range(2000):
        batch = rng.choice([1, 100, 128, 129, 700, 1024])
        kv = rng.randint(batch, 3_000_000)
        max_steps = rng.choice([0, 1, 2, 17, 5000])
        exact = cost.decode_run_seconds(steps=rng.randint(0, max_steps + 1), batch=batch, kv_tokens_read=kv)
        seconds = rng.choice([exact, math.nextafter(exact, 0.0), math.nextafter(exact, 1.0), rng.random() * 30])
        lo, hi = 0, max_steps
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cost.decode_run_seconds(steps=mid, batch=batch, kv_tokens_read=kv) <= seconds:
                lo = mid
            else:
                hi = mid - 1
        assert cost.decode_steps_within(seconds, max_steps=max_steps, batch=batch, kv_tokens_read=kv) == lo


def _request(rid: int, prompt: int, output: int) -> Request:
    chain = SegmentChain(16)
    chain.extend(rid, prompt + output)
    return Request(rid, prompt_len=prompt, max_tokens=output, hashes=chain.hashes)


def test_the_engine_charges_a_lone_prompt_what_prefill_seconds_says() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=20_000, max_model_len=131_072))
    engine.add(_request(1, 100_000, 1))
    total = 0.0
    while engine.has_work:
        total += engine.step().duration
    assert total == pytest.approx(H100.prefill_seconds(100_000), rel=1e-12)


def test_a_mixed_step_charges_decodes_chunk_attention_and_reads() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=4000))
    for rid in range(3):
        engine.add(_request(rid, 1000 + rid, 50))
    engine.step()  # three prompts in one step
    engine.add(_request(9, 20_000, 5))
    out = engine.step()  # three decodes, then the new prompt's first chunk of 8192 - 3 tokens
    kv = sum(1000 + rid for rid in range(3))
    chunk = 8192 - 3
    expected = H100.step_seconds(
        prefill_tokens=chunk, decode_tokens=3, kv_tokens_read=kv, attention_pairs=chunk * (0 + chunk / 2)
    )
    assert out.duration == pytest.approx(expected, rel=1e-12)
    nxt = engine.step()  # its second chunk runs over the first's 8189 computed tokens
    pairs = chunk * (chunk + chunk / 2)
    expected = H100.step_seconds(
        prefill_tokens=chunk, decode_tokens=3, kv_tokens_read=kv + 3 + chunk, attention_pairs=pairs
    )
    assert nxt.duration == pytest.approx(expected, rel=1e-12)
