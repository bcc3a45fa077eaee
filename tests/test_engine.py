"""The engine model pins vLLM's KV-cache and scheduler behaviours (DESIGN section 5)."""

from __future__ import annotations

import math

import pytest

from rolloutpool.engine.model.blocks import BlockPool
from rolloutpool.engine.model.core import Engine, EngineConfig, Request
from rolloutpool.engine.model.cost import CostModel
from rolloutpool.engine.model.hashing import SegmentChain, hash_token_blocks

BS = 16


def _request(rid: int, tokens: list[int], max_tokens: int, out_seed: int = 10_000) -> Request:
    """A request whose planned output tokens are deterministic, with hashes over prompt + output."""
    output = [out_seed + rid * 100_000 + i for i in range(max_tokens)]
    return Request(rid, prompt_len=len(tokens), max_tokens=max_tokens, hashes=hash_token_blocks(tokens + output, BS))


def _run(engine: Engine, max_steps: int = 10_000) -> list[Request]:
    done: list[Request] = []
    for _ in range(max_steps):
        if not engine.has_work:
            break
        done += engine.step().finished
    return done


def _engine(blocks: int, **kw) -> Engine:
    return Engine(EngineConfig(num_gpu_blocks=blocks, block_size=BS, **kw))


def test_prefix_hit_is_whole_blocks_of_prompt_minus_last_token() -> None:
    engine = _engine(100)
    prompt = list(range(100))
    engine.add(_request(1, prompt, 5))
    _run(engine)
    engine.add(_request(2, [*prompt, 7, 7, 7], 5))
    engine.step()
    second = engine.running[0]
    assert second.cached_tokens == 96  # (103 - 1) // 16 * 16
    # a prompt of exactly two blocks can hit only one: the last token is always computed
    engine2 = _engine(100)
    engine2.add(_request(1, list(range(32)), 3))
    _run(engine2)
    engine2.add(_request(2, list(range(32)), 3))
    engine2.step()
    assert engine2.running[0].cached_tokens == 16


def test_usage_does_not_count_cached_free_blocks() -> None:
    engine = _engine(100)
    prompt = list(range(160))
    engine.add(_request(1, prompt, 4))
    engine.step()
    assert engine.pool.usage > 0
    _run(engine)
    assert engine.pool.usage == 0.0
    assert all(engine.pool.is_cached(h) for h in hash_token_blocks(prompt, BS))
    assert engine.counters.prefix_queries == engine.counters.prompt_tokens == 160


def test_idle_prefix_survives_until_pressure_then_lru_evicts_oldest_first() -> None:
    pool = BlockPool(21, BS)  # 20 usable blocks
    a = hash_token_blocks(list(range(80)), BS)  # 5 blocks
    b = hash_token_blocks(list(range(1000, 1080)), BS)  # 5 blocks
    for hashes in (a, b):
        assert pool.take_new(len(hashes))
        pool.seal(hashes, 0, len(hashes))
    pool.release(a, len(a), 0)  # a finishes first
    pool.release(b, len(b), 0)
    assert pool.usage == 0.0
    assert all(pool.is_cached(h) for h in a + b)
    assert pool.take_new(10)  # the 10 never-used blocks go first
    assert pool.evictions == 0
    assert pool.take_new(1)  # pressure: a's tail goes first (released in reverse order)
    assert pool.evictions == 1
    assert not pool.is_cached(a[-1])
    assert pool.is_cached(a[0])
    assert all(pool.is_cached(h) for h in b)
    assert pool.take_new(4)
    assert not any(pool.is_cached(h) for h in a)
    assert all(pool.is_cached(h) for h in b)
    assert not pool.take_new(6)  # only b's five remain
    assert pool.num_free == 5


def test_shared_prefix_blocks_are_shared_not_copied() -> None:
    engine = _engine(200)
    prompt = list(range(320))  # 20 full blocks
    engine.add(_request(1, prompt, 50))
    engine.step()
    used_one = engine.pool.num_used
    engine.add(_request(2, [*prompt, 1], 50))
    engine.step()
    assert engine.running[1].cached_tokens == 320
    assert engine.pool.num_used - used_one <= 3  # only its own tail, not 20 more blocks


def test_requests_admitted_in_one_step_share_the_blocks_allocated_before_them() -> None:
    # vLLM caches a step's blocks when it allocates them: n choices of one prompt (one parent request)
    # admitted together hit the first choice's blocks (vLLM 0.32: cached_tokens 96 of 100 for choices 2 and 3)
    engine = _engine(200)
    prompt = list(range(100))
    for rid in range(3):
        engine.add(_request(rid, prompt, 4))
    outcome = engine.step()
    assert outcome.steps == 1
    assert [r.cached_tokens for r in engine.running] == [0, 96, 96]
    assert (engine.counters.prefix_queries, engine.counters.prefix_hits) == (300, 192)
    assert engine.pool.num_used == 7 + 2  # seven shared blocks (six full, one partial), two more partial tails
    _run(engine)
    assert engine.counters.prompt_tokens_cached == 192


def test_a_request_that_skips_the_lookup_finds_nothing_but_leaves_its_blocks() -> None:
    # vLLM's prompt_logprobs: no prefix-cache lookup, no query counted; the blocks it fills are cached for others
    engine = _engine(200)
    prompt = list(range(100))
    engine.add(_request(1, prompt, 4))
    _run(engine)
    skipping = _request(2, prompt, 4)
    skipping.skip_cache_read = True
    engine.add(skipping)
    _run(engine)
    assert skipping.cached_tokens == 0
    assert (engine.counters.prefix_queries, engine.counters.prefix_hits, engine.counters.prompt_tokens) == (100, 0, 200)
    engine.add(_request(3, prompt, 4))
    _run(engine)
    assert engine.counters.prefix_hits == 96


def test_decode_preempts_newest_and_admits_nothing_that_step() -> None:
    engine = _engine(9, max_num_seqs=8)  # 8 usable blocks
    engine.add(_request(1, list(range(40)), 60))  # 3 blocks now, grows
    engine.add(_request(2, list(range(500, 540)), 60))
    engine.step()  # both admitted: 6 blocks
    engine.add(_request(3, list(range(900, 910)), 2))
    preempted_seen = False
    for _ in range(200):
        out = engine.step()
        if out.preempted:
            preempted_seen = True
            assert [r.rid for r in out.preempted] == [2]  # the newest running request
            assert engine.waiting[0].rid == 2  # back at the head of the queue
            assert all(r.rid != 3 for r in engine.running)  # nothing admitted in that step
            break
    assert preempted_seen
    assert engine.counters.preemptions == 1
    _run(engine)
    assert engine.counters.finished_stop == 3


def test_head_of_line_blocking() -> None:
    engine = _engine(11)  # 10 usable blocks
    engine.add(_request(1, list(range(100)), 100))  # 7 blocks, grows
    engine.step()
    engine.add(_request(2, list(range(2000, 2100)), 5))  # needs 7 blocks: cannot fit
    engine.add(_request(3, [5, 6], 2))  # would fit, but waits behind the head
    engine.step()
    assert [r.rid for r in engine.waiting] == [2, 3]


def test_max_num_seqs_and_chunked_prefill() -> None:
    engine = _engine(4000, max_num_seqs=2, max_num_batched_tokens=8192)
    engine.add(_request(1, list(range(20_000)), 50))
    steps = 0
    while not engine.running or engine.running[0].num_output == 0:
        engine.step()
        steps += 1
    assert steps == math.ceil(20_000 / 8192)
    for rid in (2, 3, 4):
        engine.add(_request(rid, [rid] * 10, 50))
    engine.step()
    assert [r.rid for r in engine.running] == [1, 2]
    assert [r.rid for r in engine.waiting] == [3, 4]


def test_context_limit_finishes_with_length() -> None:
    engine = _engine(100, max_model_len=64)
    engine.add(_request(1, list(range(60)), 100))
    done = _run(engine)
    assert done[0].finish_reason == "length"
    assert done[0].seq_len == 64


def test_prompt_over_context_is_rejected() -> None:
    engine = _engine(100, max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add(_request(1, list(range(64)), 1))


def test_decode_run_equals_single_steps() -> None:
    def fresh() -> Engine:
        e = _engine(300)
        for rid in range(5):
            e.add(_request(rid, list(range(rid * 1000, rid * 1000 + 50 + rid * 7)), 40 + 13 * rid))
        e.step()  # prefill all
        return e

    stepped, batched = fresh(), fresh()
    t_step = 0.0
    k = batched.decode_run_length(10_000)
    assert k == 39  # until the first request (rid 0: 40 tokens, 1 already sampled) finishes
    for _ in range(k):
        t_step += stepped.step().duration
    out = batched.decode_run(k)
    assert out.duration == pytest.approx(t_step, rel=1e-9)
    assert [r.rid for r in out.finished] == [0]
    assert batched.pool.num_used == stepped.pool.num_used
    assert batched.counters.generation_tokens == stepped.counters.generation_tokens
    # every token counts its step's duration (vLLM's inter-token latency), in a run as step by step
    assert batched.counters.token_step_seconds == pytest.approx(stepped.counters.token_step_seconds, rel=1e-9)
    decode_tokens = 5 * k
    first = fresh()
    assert batched.counters.token_step_seconds - first.counters.token_step_seconds == pytest.approx(
        out.duration * decode_tokens / k, rel=1e-9
    )  # five sequences in each of the k steps: five tokens of each step's duration
    assert [(r.num_computed, r.num_output, r.n_hashed) for r in batched.running] == [
        (r.num_computed, r.num_output, r.n_hashed) for r in stepped.running
    ]


def test_decode_run_stops_before_block_shortage() -> None:
    engine = _engine(12)  # 11 usable
    engine.add(_request(1, list(range(30)), 500))
    engine.add(_request(2, list(range(100, 130)), 500))
    engine.step()
    k = engine.decode_run_length(10_000)
    assert engine.pool.num_free - engine._blocks_needed(k) >= 0
    assert engine._blocks_needed(k + 1) > engine.pool.num_free


def test_segment_chain_matches_token_hash_structure() -> None:
    chain = SegmentChain(BS)
    chain.extend(7, 40)
    shared = chain.copy()
    chain.extend(8, 30)
    shared.extend(9, 30)
    assert chain.hashes[:2] == shared.hashes[:2]  # the first two full blocks are segment 7 only
    assert chain.hashes[2] != shared.hashes[2]  # block 3 mixes segment 7 with 8 vs 9
    assert chain.length == 70
    assert len(chain.hashes) == 4


def test_segment_chain_blocks_are_equal_exactly_when_their_prefixes_are() -> None:
    def chain(*segments: tuple[int, int]) -> list[int]:
        c = SegmentChain(BS)
        for segment, n in segments:
            c.extend(segment, n)
        return c.hashes

    a = chain((7, 100), (8, 50))
    assert a == chain((7, 100), (8, 50))  # reproducible
    assert len(set(a)) == len(a)
    b = chain((7, 100), (9, 50))
    assert a[:6] == b[:6]  # 6 whole blocks of segment 7, then the block mixing 7 with 8 or 9
    assert not set(a[6:]) & set(b[6:])
    c = chain((7, 96), (8, 54))  # the same segment 8 after a different prefix: nothing shared from there
    assert c[:6] == a[:6]
    assert not set(c[6:]) & set(a)
    d = chain((5, 100), (8, 50))  # a different first segment: nothing shared at all
    assert not set(d) & set(a)
    many = [chain((g, 40 + g), (1000 + g, 500)) for g in range(200)]
    flat = [h for m in many for h in m]
    assert len(set(flat)) == len(flat)


def test_decode_steps_within_equals_a_binary_search() -> None:
    import random  # noqa: PLC0415

    cost = CostModel()
    rng = random.Random(3)
    for _ in range(3000):
        batch = rng.randint(1, 256)
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


def _assert_caches_fresh(engine: Engine) -> None:
    """The engine's running sums and decode cache equal a recomputation from the requests."""
    running = engine.running
    assert engine._kv == sum(r.num_computed for r in running)
    for req in running:
        assert req.held_blocks == -(-req.num_computed // BS)
        assert req.n_hashed == min(req.num_computed // BS, len(req.hashes))  # every full block sealed
    if engine._fins is not None:
        clock = engine._clock
        left = [min(r.max_tokens - r.num_output, engine.config.max_model_len - r.seq_len) for r in running]
        assert [fin for fin, _, _ in engine._fins] == sorted(clock + n for n in left)
        counts = [0] * BS
        for req in running:
            counts[(req.num_computed - 1 - clock) % BS] += 1
        assert engine._phase_counts == counts


def test_binary_searched_hits_equal_a_linear_scan_under_churn() -> None:
    """Residency stays prefix-closed along chains through admission, decode, preemption, eviction."""
    import random  # noqa: PLC0415

    rng = random.Random(3)
    engine = _engine(60, max_num_seqs=6, max_num_batched_tokens=256)
    chains: list[list[int]] = []
    rid = 0
    for _ in range(600):
        if rng.random() < 0.3:
            base = rng.choice(chains) if chains and rng.random() < 0.6 else []
            shared = base[: rng.randint(0, min(len(base), 10))] if base else []
            rid += 1
            tokens = [rid * 7919 + i for i in range(rng.randint(5, 150))]
            req = Request(rid, prompt_len=16 * len(shared) + len(tokens), max_tokens=rng.randint(1, 300), hashes=[])
            req.hashes = shared + hash_token_blocks(tokens, BS, parent=shared[-1] if shared else 0)
            if req.prompt_len < engine.config.max_model_len:
                engine.add(req)
                chains.append(req.hashes)
        if engine.has_work:
            engine.step()
        for chain in rng.sample(chains, min(5, len(chains))):
            linear = 0
            for h in chain:
                if not engine.pool.is_cached(h):
                    break
                linear += 1
            assert engine.pool.count_hits(chain, len(chain)) == linear
            held = 0
            for h in chain:
                if not engine.pool.is_held(h):
                    break
                held += 1
            assert engine.pool.count_held(chain, len(chain)) == held
            limit = rng.randint(0, len(chain) + 1)
            hits_in = min(linear, limit)
            assert engine.pool.count_hits_held(chain, limit) == (hits_in, min(held, hits_in))
    assert engine.counters.preemptions > 0  # the churn did exercise preemption
    assert engine.pool.evictions > 0  # and eviction


class _BlockByBlockPool:
    """Reference model: the pool's semantics kept block by block (a ref dict, a free dict, runs of hashes)."""

    def __init__(self, num_gpu_blocks: int) -> None:
        self.capacity = num_gpu_blocks - 1
        self.ref: dict[int, int] = {}
        self.free: dict[int, list] = {}  # cached free block -> its run [hashes, next index to evict]
        self.order: list[list] = [[None, self.capacity]]  # [None, count] or [hashes, hi]
        self.uncached = self.capacity
        self.evictions = 0
        self.events = None  # records no cache events (tests/test_engine_cache_events.py checks those)

    @property
    def num_free(self) -> int:
        return self.uncached + len(self.free)

    def count_hits(self, hashes: list[int], limit: int) -> int:
        n = 0
        while n < min(limit, len(hashes)) and (hashes[n] in self.ref or hashes[n] in self.free):
            n += 1
        return n

    def count_held(self, hashes: list[int], limit: int) -> int:
        n = 0
        while n < min(limit, len(hashes)) and hashes[n] in self.ref:
            n += 1
        return n

    def count_hits_held(self, hashes: list[int], limit: int) -> tuple[int, int]:
        hits = self.count_hits(hashes, limit)
        return hits, self.count_held(hashes, hits)

    def take_cached(self, hashes: list[int], n: int) -> None:
        for h in hashes[:n]:
            if h in self.free:
                del self.free[h]
            self.ref[h] = self.ref.get(h, 0) + 1

    def take_new(self, n: int) -> bool:
        if n > self.num_free:
            return False
        while n:
            run = self.order[0]
            if run[0] is None:
                take = min(n, run[1])
                run[1] -= take
                self.uncached -= take
                n -= take
            elif run[1] > 0:
                run[1] -= 1
                h = run[0][run[1]]
                if self.free.get(h) is run:
                    del self.free[h]
                    self.evictions += 1
                    n -= 1
            if run[1] == 0:
                self.order.pop(0)
        return True

    def seal(self, hashes: list[int], start: int, end: int, hint: object = None) -> None:
        for h in hashes[start:end]:
            if h in self.ref or h in self.free:
                self.free.pop(h, None)
                self.ref[h] = self.ref.get(h, 0) + 1
                self.uncached += 1
                self.order.insert(0, [None, 1])  # uncached blocks are reused first
            else:
                self.ref[h] = 1

    def release(self, hashes: list[int], n_hashed: int, n_private: int) -> None:
        if n_private:
            self.uncached += n_private
            self.order.insert(0, [None, n_private])
        freed = []
        for h in hashes[:n_hashed]:
            self.ref[h] -= 1
            if not self.ref[h]:
                del self.ref[h]
                freed.append(h)
        if freed:
            run = [freed, len(freed)]
            for h in freed:
                self.free[h] = run
            self.order.append(run)


def _run_length_by_bisection(engine: Engine, max_steps: int) -> int:
    """decode_run_length as first written: a binary search over _blocks_needed."""
    running = engine.running
    if not running or len(running) > engine.config.max_num_batched_tokens:
        return 0
    remaining = max_steps
    for req in running:
        if req.seq_len - req.num_computed != 1 or req.num_output == 0:
            return 0
        remaining = min(remaining, req.max_tokens - req.num_output, engine.config.max_model_len - req.seq_len)
    free = engine.pool.num_free
    if remaining < 1 or engine._admissible() or engine._blocks_needed(1) > free:
        return 0
    lo, hi = 1, remaining
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if engine._blocks_needed(mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_pool_matches_a_block_by_block_reference_under_churn(seed: int) -> None:
    """Segments, splits and runs of segments evict, hit and share exactly like per-block bookkeeping."""
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    real = _engine(80, max_num_seqs=8, max_num_batched_tokens=200)
    ref = _engine(80, max_num_seqs=8, max_num_batched_tokens=200)
    ref.pool = _BlockByBlockPool(80)  # type: ignore[assignment]
    chains: list[list[int]] = []
    rid = 0
    for _ in range(1500):
        if rng.random() < 0.35:
            rid += 1
            base = rng.choice(chains) if chains and rng.random() < 0.8 else []
            shared = base[: rng.randint(0, len(base))]  # continue or branch off a known chain
            tokens = [rid * 7919 + i for i in range(rng.randint(1, 120))]
            hashes = shared + hash_token_blocks(tokens, BS, parent=shared[-1] if shared else 0)
            prompt_len = 16 * len(shared) + len(tokens)
            if prompt_len < real.config.max_model_len:
                max_tokens = rng.randint(1, 200)
                out = hash_token_blocks([rid] * max_tokens, BS, parent=hashes[-1] if hashes else 0)
                for engine in (real, ref):
                    engine.add(Request(rid, prompt_len=prompt_len, max_tokens=max_tokens, hashes=hashes + out))
                chains.append(hashes + out)
        if not real.has_work:
            continue
        max_steps = rng.randint(1, 40)
        k = real.decode_run_length(max_steps)
        assert k == _run_length_by_bisection(real, max_steps)
        if k:
            a, b = real.decode_run(k), ref.decode_run(k)
        else:
            a, b = real.step(), ref.step()
        _assert_caches_fresh(real)
        if rng.random() < 0.02 and real.running:  # an abort drops the decode cache and the request's KV
            victim = rng.choice(real.running)
            twin = next(r for r in ref.running if r.rid == victim.rid)
            assert real.abort(victim)
            assert ref.abort(twin)
            _assert_caches_fresh(real)
        assert [r.rid for r in a.finished] == [r.rid for r in b.finished]
        assert [r.rid for r in a.preempted] == [r.rid for r in b.preempted]
        assert a.duration == b.duration
        assert real.pool.num_free == ref.pool.num_free
        assert real.pool.evictions == ref.pool.evictions
        for chain in rng.sample(chains, min(6, len(chains))):
            assert real.pool.count_hits(chain, len(chain)) == ref.pool.count_hits(chain, len(chain))
            assert real.pool.count_held(chain, len(chain)) == ref.pool.count_held(chain, len(chain))
    assert real.counters == ref.counters
    assert real.counters.preemptions > 0
    assert real.pool.evictions > 0
