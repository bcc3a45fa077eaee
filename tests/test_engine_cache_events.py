"""The engine model's cache events (vLLM's KV events before encoding) describe its prefix cache exactly.

A churn of requests (continuing and branching each other's chains, preempted, aborted,
evicting) runs on an engine that records events and on a twin that does not: the twin must
behave identically (recording changes nothing), and a residency index fed only the events must
know exactly which blocks the pool holds and, for every request, how much of its chain is cached.
"""

from __future__ import annotations

import random

import pytest

from rolloutpool.engine.model.cache_events import BlockRemoved, BlocksStored, CacheCleared, CacheEvent
from rolloutpool.engine.model.core import Engine, EngineConfig, Request
from rolloutpool.engine.model.hashing import hash_token_blocks
from rolloutpool.routing.residency import ResidencyIndex

BS = 16


def _engine() -> Engine:
    return Engine(EngineConfig(num_gpu_blocks=80, block_size=BS, max_num_seqs=8, max_num_batched_tokens=200))


def _feed(index: ResidencyIndex, events: list[CacheEvent]) -> None:
    for event in events:
        if isinstance(event, BlocksStored):
            hashes = event.request.hashes
            index.stored(
                block_hashes=hashes[event.start : event.end],
                parent_hash=hashes[event.start - 1] if event.start else None,
                session_id=f"r{event.request.rid}",
            )
        elif isinstance(event, BlockRemoved):
            index.removed(block_hashes=[event.block_hash])
        else:
            index.cleared()


def _cached(engine: Engine) -> set[int]:
    return {h for seg in engine.pool._segments() for h in seg.hashes}


def test_recording_is_off_by_default_and_costs_no_state() -> None:
    engine = _engine()
    engine.add(Request(1, prompt_len=40, max_tokens=30, hashes=hash_token_blocks(list(range(70)), BS)))
    while engine.has_work:
        engine.step()
    assert engine.pool.events is None
    assert engine.take_cache_events() == []


def test_a_request_s_blocks_are_stored_once_each_and_a_cached_copy_is_returned() -> None:
    engine = _engine()
    engine.record_cache_events()
    tokens = list(range(100))
    requests = [Request(rid, prompt_len=100, max_tokens=1, hashes=hash_token_blocks(tokens, BS)) for rid in (1, 2)]
    for request in requests:  # admitted in the same step: the first's blocks are cached when allocated (vLLM's
        engine.add(request)  # allocate_slots), so the second finds them and stores nothing of its own
    engine.step()
    events = engine.take_cache_events()
    stored = [(e.request.rid, e.start, e.end) for e in events if isinstance(e, BlocksStored)]
    assert stored == [(1, 0, 6)]
    assert [e for e in events if isinstance(e, BlockRemoved)] == []
    assert requests[1].cached_tokens == 96
    assert engine.take_cache_events() == []  # drained
    assert engine.pool.reset_prefix_cache()
    assert engine.take_cache_events() == [CacheCleared()]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_index_fed_the_events_knows_the_pool_exactly_under_churn(seed: int) -> None:
    rng = random.Random(seed)
    recorded, twin = _engine(), _engine()
    recorded.record_cache_events()
    index = ResidencyIndex(block_size=BS, forget_horizon=0)
    chains: list[list[int]] = []
    live: dict[int, Request] = {}
    rid = 0
    for _ in range(1200):
        if rng.random() < 0.35:
            rid += 1
            base = rng.choice(chains) if chains and rng.random() < 0.8 else []
            shared = base[: rng.randint(0, len(base))]
            tokens = [rid * 7919 + i for i in range(rng.randint(1, 120))]
            hashes = shared + hash_token_blocks(tokens, BS, parent=shared[-1] if shared else 0)
            prompt_len = BS * len(shared) + len(tokens)
            if prompt_len < recorded.config.max_model_len:
                max_tokens = rng.randint(1, 200)
                out = hash_token_blocks([rid] * max_tokens, BS, parent=hashes[-1] if hashes else 0)
                live[rid] = Request(rid, prompt_len=prompt_len, max_tokens=max_tokens, hashes=hashes + out)
                recorded.add(live[rid])
                twin.add(Request(rid, prompt_len=prompt_len, max_tokens=max_tokens, hashes=hashes + out))
                chains.append(hashes + out)
        if not recorded.has_work:
            if rng.random() < 0.05:
                assert recorded.pool.reset_prefix_cache() == twin.pool.reset_prefix_cache()
                _feed(index, recorded.take_cache_events())
            continue
        k = recorded.decode_run_length(rng.randint(1, 40))
        a, b = (recorded.decode_run(k), twin.decode_run(k)) if k else (recorded.step(), twin.step())
        if rng.random() < 0.02 and recorded.running:
            victim = rng.choice(recorded.running)
            assert recorded.abort(victim)
            assert twin.abort(next(r for r in twin.running if r.rid == victim.rid))
        assert [r.rid for r in a.finished] == [r.rid for r in b.finished]
        assert a.duration == b.duration
        assert recorded.pool.num_free == twin.pool.num_free
        _feed(index, recorded.take_cache_events())
        cached = _cached(recorded)
        assert index.stats.blocks == len(cached)
        assert all(index.is_resident(h) for h in cached)
        for req in rng.sample(list(live.values()), min(6, len(live))):
            session = f"r{req.rid}"
            blocks = index.context_blocks(session)
            if blocks is None:  # no block of its own stored yet
                continue
            assert index._chains[session].hashes == req.hashes[:blocks]
            assert index.resident_tokens(session) == recorded.pool.count_hits(req.hashes, blocks) * BS
    assert recorded.counters == twin.counters
    assert recorded.pool.evictions > 0
    assert recorded.counters.preemptions > 0
    assert index.stats.unknown_removals == 0
