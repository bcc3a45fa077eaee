"""The free-restore bound: context computed before costs nothing again, on the same KV pool (EngineConfig)."""

from __future__ import annotations

from rolloutpool.engine.model.core import Engine, EngineConfig, Request
from rolloutpool.engine.model.cost import CostModel
from rolloutpool.engine.model.hashing import hash_token_blocks
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.fleet import simulate_policy
from rolloutpool.sim.workload import scenario

BS = 16


def _request(rid: int, prompt: int, max_tokens: int, *, free: int = 0) -> Request:
    tokens = [rid * 1_000_000 + i for i in range(prompt + max_tokens)]
    request = Request(rid, prompt_len=prompt, max_tokens=max_tokens, hashes=hash_token_blocks(tokens, BS))
    request.free_tokens = free
    return request


def _engine(blocks: int, *, free_restore: bool, **kw: int) -> Engine:
    return Engine(EngineConfig(num_gpu_blocks=blocks, block_size=BS, free_restore=free_restore, **kw))


def test_a_restored_prefix_costs_only_the_tail_but_takes_its_blocks() -> None:
    paid, free = _engine(200, free_restore=False), _engine(200, free_restore=True)
    paid.add(_request(1, 1024, 4, free=1000))  # free_tokens is ignored unless the engine restores for free
    free.add(_request(1, 1024, 4, free=1000))
    cost = CostModel()
    assert paid.step().duration == cost.step_seconds(
        prefill_tokens=1024, decode_tokens=0, kv_tokens_read=0, attention_pairs=1024 * 512
    )
    assert free.step().duration == cost.step_seconds(
        prefill_tokens=24, decode_tokens=0, kv_tokens_read=0, attention_pairs=24 * (1000 + 12)
    )
    assert free.pool.num_free == paid.pool.num_free  # the same blocks: only the compute is free
    assert free.running[0].num_computed == paid.running[0].num_computed == 1024


def test_a_preempted_request_recomputes_its_progress_for_free() -> None:
    def run(free_restore: bool) -> Engine:
        engine = _engine(9, free_restore=free_restore, max_num_seqs=8)  # 8 usable blocks
        engine.add(_request(1, 40, 60))
        engine.add(_request(2, 40, 60))
        while engine.has_work:
            engine.step()
        return engine

    paid, free = run(False), run(True)
    assert paid.counters.preemptions == free.counters.preemptions >= 1
    assert paid.counters.generation_tokens == free.counters.generation_tokens == 120
    assert free.counters.busy_seconds < paid.counters.busy_seconds


def _fleet(in_flight: int, *, free_restore: bool) -> FleetConfig:
    return FleetConfig(
        scenario=scenario("agentic-grpo"),
        in_flight=in_flight,
        replicas=2,
        duration_s=300.0,
        num_gpu_blocks=8192,
        free_restore=free_restore,
    )


def test_the_bound_changes_nothing_where_nothing_is_evicted_and_gains_where_it_is() -> None:
    calm = [simulate_policy(_fleet(4, free_restore=f), "sticky-least-loaded") for f in (False, True)]
    assert calm[0].reprefilled_tokens == 0
    assert calm[1].generated_tokens == calm[0].generated_tokens
    pressed = [simulate_policy(_fleet(40, free_restore=f), "sticky-least-loaded") for f in (False, True)]
    assert pressed[0].reprefilled_tokens > 0
    assert pressed[1].generated_tokens > pressed[0].generated_tokens
