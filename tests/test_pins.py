"""Continuum's pinning engine (engine/model/pins.py): pins hold a turn's KV for a TTL, and give way first (pure)."""

from __future__ import annotations

import pytest

from rolloutpool.engine.model.core import Engine, EngineConfig, Request
from rolloutpool.engine.model.hashing import hash_token_blocks
from rolloutpool.engine.model.pins import FIXED_TTL_S, PinConfig, PinningEngine, paper_ttl

BS = 16


def _request(rid: int, tokens: list[int], max_tokens: int, tag: object) -> Request:
    output = [10_000 + rid * 100_000 + i for i in range(max_tokens)]
    hashes = hash_token_blocks(tokens + output, BS)
    return Request(rid, prompt_len=len(tokens), max_tokens=max_tokens, hashes=hashes, tag=tag)


def _run(engine: Engine) -> list[Request]:
    done: list[Request] = []
    while engine.has_work:
        done += engine.step().finished
    return done


def _engine(blocks: int, rule: str = "fixed") -> PinningEngine:
    return PinningEngine(EngineConfig(num_gpu_blocks=blocks, block_size=BS), PinConfig(rule=rule))


def test_a_pinned_turn_keeps_its_blocks_until_its_ttl_ends() -> None:
    engine = _engine(100)
    prompt = list(range(160))
    engine.add(_request(1, prompt, 16, "a"))
    (done,) = _run(engine)
    assert engine.pool.num_used == 0  # finished: cached but evictable
    assert engine.pin("a", done) == FIXED_TTL_S
    assert engine.pool.num_used == 10  # its 175 computed tokens: 10 full blocks held
    engine.tick(1.9)
    assert engine.pool.num_used == 10
    engine.tick(2.0)
    assert engine.pool.num_used == 0
    assert not engine.pins


def test_the_next_request_unpins_and_hits_the_pinned_prefix_and_times_the_tool() -> None:
    engine = _engine(100)
    prompt = list(range(160))
    engine.add(_request(1, prompt, 16, "a"))
    (done,) = _run(engine)
    engine.tick(5.0)
    engine.pin("a", done)
    engine.tick(6.5)
    nxt = _request(2, [*prompt, *range(10_000 + 100_000, 10_000 + 100_016), 1, 2, 3], 4, "a")
    engine.add(nxt)
    assert not engine.pins
    assert engine.pin_hits == 1
    _run(engine)
    assert nxt.cached_tokens == 160  # the pinned full blocks
    assert list(engine._durations) == [1.5]


def test_pins_give_way_before_a_running_request_is_preempted() -> None:
    engine = _engine(30)  # 29 usable blocks
    engine.add(_request(1, list(range(320)), 16, "a"))
    (done,) = _run(engine)
    engine.pin("a", done)  # 21 blocks pinned
    engine.add(_request(2, [5_000 + i for i in range(200)], 100, "b"))  # needs 19 blocks in all
    _run(engine)
    assert engine.counters.preemptions == 0
    assert engine.pins_relieved == 1
    assert not engine.pins


def test_a_plain_engine_relieves_nothing() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=30, block_size=BS))
    assert not engine._relieve(5)
    assert engine._relievable() == 0


def test_the_paper_ttl_weighs_holding_against_reloading() -> None:
    durations = [0.5] * 8 + [100.0] * 2
    # reloading is dear: keep long enough for the short calls, not for the long ones
    assert paper_ttl(durations, hold_per_s=0.01, reload_s=1.0, max_ttl_s=60.0) == 0.5
    # reloading is cheap next to holding: pin nothing
    assert paper_ttl(durations, hold_per_s=10.0, reload_s=0.1, max_ttl_s=60.0) == 0.0
    # the cap bounds it
    assert paper_ttl([30.0] * 10, hold_per_s=0.001, reload_s=5.0, max_ttl_s=10.0) == 0.0


def test_the_paper_rule_uses_the_fixed_ttl_until_it_has_seen_enough_tools() -> None:
    engine = _engine(1000, rule="paper")
    assert engine.ttl(1000) == FIXED_TTL_S
    for _ in range(20):
        engine.returned(0.3)
    assert engine.ttl(1000) == 0.3


def test_a_bad_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="rule"):
        PinConfig(rule="forever")


async def test_engine_sim_with_continuum_pins_a_sessions_turn_and_its_next_turn_finds_it() -> None:
    import aiohttp  # noqa: PLC0415

    from rolloutpool.engine.server.app import _SERVICE, ServerConfig, build_app  # noqa: PLC0415
    from routerkit import ENGINE_DEFAULTS, MODEL, serve  # noqa: PLC0415

    app = build_app(ServerConfig(**{**ENGINE_DEFAULTS, "time_scale": 1.0}, continuum="fixed"))
    engine = app[_SERVICE].runner.engine
    assert isinstance(engine, PinningEngine)
    prompt = "tool call please " * 40
    async with serve(app) as (url, _), aiohttp.ClientSession() as http:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 16}
        async with http.post(f"{url}/v1/completions", json=body, headers={"X-Session-ID": "s"}) as resp:
            first = await resp.json()
        assert resp.status == 200
        assert "s" in engine.pins  # held for the fixed 2 s
        held = engine.pool.num_used
        assert held > 0
        body = {"model": MODEL, "prompt": prompt + first["choices"][0]["text"] + " result", "max_tokens": 4}
        async with http.post(f"{url}/v1/completions", json=body, headers={"X-Session-ID": "s"}) as resp:
            second = await resp.json()
        assert engine.pin_hits == 1
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= held * 16 - 16
        async with http.post(f"{url}/v1/completions", json={**body, "max_tokens": 2}) as resp:
            assert resp.status == 200  # no session: nothing pinned
        assert set(engine.pins) == {"s"}
