"""Lazy decode (``EngineConfig.lazy_decode``, the fleet simulator's) gives exactly what an eager engine gives."""

from __future__ import annotations

import random

import pytest

from rolloutpool.engine.model.core import Engine, EngineConfig, Request
from rolloutpool.engine.model.hashing import hash_token_blocks

BS = 16


def _pair(blocks: int, **kw: int) -> tuple[Engine, Engine]:
    lazy = Engine(EngineConfig(num_gpu_blocks=blocks, block_size=BS, lazy_decode=True, **kw))
    eager = Engine(EngineConfig(num_gpu_blocks=blocks, block_size=BS, **kw))
    return lazy, eager


def _state(req: Request) -> tuple[object, ...]:
    return (req.rid, req.num_computed, req.num_output, req.n_hashed, req.n_private, req.cached_tokens,
            req.preemptions, req.finish_reason)  # fmt: skip


def _assert_same_batches(lazy: Engine, eager: Engine) -> None:
    lazy.settle()
    assert [_state(r) for r in lazy.running] == [_state(r) for r in eager.running]
    assert [_state(r) for r in lazy.waiting] == [_state(r) for r in eager.waiting]
    assert lazy._kv == eager._kv


def _lockstep(seed: int, *, steps: int = 2500, blocks: int = 120) -> tuple[Engine, Engine]:
    """Drive a lazy and an eager engine with one stream of multi-turn rollouts, as the fleet simulator does.

    A rollout's next turn continues its own chain once its last turn has finished (nothing looks up a running
    request's output blocks: the precondition of lazy decode); new rollouts branch off earlier prompts (shared
    prefixes). Decode runs are cut short at random, as arrivals cut them in the simulator.
    """
    rng = random.Random(seed)
    lazy, eager = _pair(blocks, max_num_seqs=10, max_num_batched_tokens=256)
    idle: list[list[int]] = []  # chains whose last request has finished: a next turn may continue them
    prompts: list[list[int]] = []
    twins: dict[int, Request] = {}
    rid = 0
    for _ in range(steps):
        if rng.random() < 0.3:
            rid += 1
            if idle and rng.random() < 0.6:
                base = idle.pop(rng.randrange(len(idle)))
            else:
                prompt = rng.choice(prompts) if prompts and rng.random() < 0.7 else []
                base = prompt[: rng.randint(0, len(prompt))]
            tokens = [rid * 7919 + i for i in range(rng.randint(1, 100))]
            hashes = base + hash_token_blocks(tokens, BS, parent=base[-1] if base else 0)
            prompt_len = BS * len(base) + len(tokens)
            if prompt_len < lazy.config.max_model_len - 1:
                prompts.append(hashes)
                max_tokens = rng.randint(1, 300) if rng.random() < 0.8 else rng.randint(1, 2)  # some finish at once
                out = hash_token_blocks([-rid] * max_tokens, BS, parent=hashes[-1] if hashes else 0)
                a = Request(rid, prompt_len=prompt_len, max_tokens=max_tokens, hashes=hashes + out)
                b = Request(rid, prompt_len=prompt_len, max_tokens=max_tokens, hashes=hashes + out)
                twins[rid] = a
                lazy.add(a)
                eager.add(b)
        if not lazy.has_work:
            continue
        max_steps = rng.choice([1, 3, 40, 1000])
        k = lazy.decode_run_length(max_steps)
        assert k == eager.decode_run_length(max_steps)
        if k:
            k = rng.randint(1, k)  # an arrival cuts the run short
            x, y = lazy.decode_run(k), eager.decode_run(k)
        else:
            x, y = lazy.step(), eager.step()
        assert [_state(r) for r in x.finished] == [_state(r) for r in y.finished]
        assert [r.rid for r in x.preempted] == [r.rid for r in y.preempted]
        assert [r.rid for r in x.first_tokens] == [r.rid for r in y.first_tokens]
        assert (x.duration, x.steps, x.generated) == (y.duration, y.steps, y.generated)
        assert lazy.pool.num_free == eager.pool.num_free
        assert lazy.pool.evictions == eager.pool.evictions
        for req in x.finished:
            n = (req.seq_len - 1) // BS
            idle.append(req.hashes[: max(n, 0)] if rng.random() < 0.5 else req.hashes[:n])
        for chain in rng.sample(idle, min(4, len(idle))):
            assert lazy.pool.count_hits(chain, len(chain)) == eager.pool.count_hits(chain, len(chain))
        if rng.random() < 0.05:
            _assert_same_batches(lazy, eager)
    _assert_same_batches(lazy, eager)
    assert lazy.counters == eager.counters
    return lazy, eager


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_lazy_decode_equals_eager_in_lockstep(seed: int) -> None:
    lazy, _ = _lockstep(seed)
    assert lazy.counters.preemptions > 0  # the run exercised preemption, eviction and long decode runs
    assert lazy.pool.evictions > 0
    assert lazy._lazy_clock > 0


def test_settle_brings_a_decoding_batch_up_to_date() -> None:
    lazy, eager = _pair(400, max_num_seqs=8)
    for engine in (lazy, eager):
        for rid in range(3):
            engine.add(Request(rid, prompt_len=20, max_tokens=200, hashes=hash_token_blocks(list(range(220)), BS)))
        while not engine.decode_run_length(1000):
            engine.step()
        engine.decode_run(50)
    assert lazy.running[0].num_output < eager.running[0].num_output  # behind until settled
    _assert_same_batches(lazy, eager)
