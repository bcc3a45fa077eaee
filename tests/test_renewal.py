"""Prefix renewal: the pure clock, and what a renewal does to vLLM's LRU in the engine model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rolloutpool.engine.model.core import Engine, EngineConfig, Request
from rolloutpool.engine.model.hashing import hash_token_blocks
from rolloutpool.routing.renewal import RenewalClock, RenewalConfig
from rolloutpool.sim.fleet import FleetConfig, simulate_policy
from rolloutpool.sim.renewal import SimRenewals
from rolloutpool.sim.runner import fleet_floor
from rolloutpool.sim.workload import scenario

BS = 16


def test_an_idle_session_is_due_after_the_interval_and_again_after_each_renewal() -> None:
    clock = RenewalClock(RenewalConfig(every_seconds=4.0))
    clock.idle("a", now=10.0)
    assert clock.due(now=13.9) == []
    assert clock.due(now=14.0) == ["a"]
    assert clock.due(now=20.0) == []  # its renewal is in flight: not due again until it answers
    clock.idle("a", now=14.5)
    assert clock.due(now=18.5) == ["a"]
    assert clock.renewals == 2


def test_a_busy_or_forgotten_session_is_not_renewed_and_stale_entries_are_skipped() -> None:
    clock = RenewalClock(RenewalConfig(every_seconds=2.0))
    clock.idle("a", now=0.0)
    clock.idle("b", now=0.5)
    clock.idle("c", now=1.0)
    clock.busy("a")  # its next turn arrived
    clock.forget("b")  # it finished
    clock.idle("c", now=1.5)  # answered again: the older entry is stale
    assert clock.idle_sessions == 1
    assert clock.due(now=3.2) == []
    assert clock.due(now=3.5) == ["c"]
    assert clock.renewals == 1


def test_due_sessions_come_oldest_first() -> None:
    clock = RenewalClock(RenewalConfig(every_seconds=1.0))
    for i, name in enumerate(["x", "y", "z"]):
        clock.idle(name, now=3.0 - i)
    assert clock.due(now=10.0) == ["z", "y", "x"]


@pytest.mark.parametrize("every", [0.0, -1.0])
def test_the_interval_must_be_positive(every: float) -> None:
    with pytest.raises(ValueError, match="every_seconds must be positive"):
        RenewalConfig(every_seconds=every)


# -- against the engine model ---------------------------------------------------------------


def _engine(blocks: int) -> Engine:
    return Engine(EngineConfig(num_gpu_blocks=blocks, block_size=BS, max_model_len=4096))


def _run(engine: Engine) -> list[Request]:
    done: list[Request] = []
    while engine.has_work:
        done += engine.step().finished
    return done


def _context(seed: int, n: int) -> list[int]:
    return [seed * 1_000_000 + i for i in range(n)]


def _turn(rid: int, tokens: list[int], max_tokens: int) -> Request:
    """A request over ``tokens`` whose planned output is the next ``max_tokens`` of the same sequence."""
    return Request(rid, prompt_len=len(tokens) - max_tokens, max_tokens=max_tokens, hashes=hash_token_blocks(tokens))


def _idle_session_then_churn(*, renew: bool) -> tuple[Request, Engine, SimRenewals]:
    """Session A finishes a turn and waits; finished sessions churn the cache; A returns (its prefix survived?)."""
    engine = _engine(blocks=41)  # 40 usable: A's 10 blocks fit many times over next to one churning session
    renewals = SimRenewals(RenewalConfig(every_seconds=1.0))
    a = _context(1, 160 + 16 + 64)  # 160-token prompt, 16-token action, then a 64-token observation
    engine.add(_turn(1, a[:176], 16))
    _run(engine)
    rid = 100
    for other in range(2, 8):  # six finished sessions of 8 blocks each pass through the free queue
        engine.add(_turn(other, _context(other, 128), 8))
        _run(engine)
        if renew:
            rid += 1
            renewal = renewals.request(rid, chain_hashes=hash_token_blocks(a), context_tokens=176, tag="a")
            engine.add(renewal)
            finished = _run(engine)
            assert [renewals.finished(r) for r in finished] == [True]
    engine.add(_turn(999, a, 16))
    engine.step()
    return engine.running[0] if engine.running else engine.waiting[0], engine, renewals


def test_without_renewal_lru_evicts_the_idle_live_prefix_before_newer_finished_blocks() -> None:
    returning, _, _ = _idle_session_then_churn(renew=False)
    assert returning.cached_tokens < 160  # stock vLLM: the idle session's context went first


def test_renewal_keeps_the_idle_prefix_and_its_cost_is_accounted_apart() -> None:
    returning, engine, renewals = _idle_session_then_churn(renew=True)
    # the whole old context: its 10 blocks, plus the block the first renewal completed (the action's last token
    # was sampled, never computed, until the renewal's prefill computed it)
    assert returning.cached_tokens == 176
    totals = renewals.totals()
    assert totals.generated == 6  # one sampled token per renewal, left out of the rollouts' figures
    assert totals.prefix_queries == 6 * 176
    assert totals.prefix_hits == 6 * 160  # (176 - 1) // 16 whole blocks hit each time
    # the rollouts' own tokens: A's action (16), six actions of 8, the returning turn's first token
    assert engine.counters.generation_tokens - totals.generated == 16 + 6 * 8 + 1


def test_a_renewal_never_caches_its_sampled_token_under_the_chain_hash() -> None:
    engine = _engine(blocks=41)
    a = _context(1, 176 + 64)
    engine.add(_turn(1, a[:176], 16))
    _run(engine)
    renewals = SimRenewals(RenewalConfig())
    chain = hash_token_blocks(a)  # includes the observation's blocks, which the renewal must not claim
    renewal = renewals.request(7, chain_hashes=chain, context_tokens=175, tag="a")  # 175 + 1 sampled = 11 blocks
    assert renewal.hashes == chain[:10]
    engine.add(renewal)
    _run(engine)
    assert not engine.pool.is_cached(chain[10])


# -- in the fleet simulator ------------------------------------------------------------------


def _fleet(renew: float | None) -> FleetConfig:
    base = FleetConfig(scenario=scenario("agentic-grpo"), in_flight=22, replicas=2, duration_s=600)
    return replace(base, renew_every_s=renew, fixed_cap=fleet_floor(base) // 2)  # the floor as a count cap


def test_at_residency_one_lru_evicts_live_prefixes_and_renewal_stops_it() -> None:
    stock = simulate_policy(_fleet(None), "rolloutpool")
    renewed = simulate_policy(_fleet(4.0), "rolloutpool")
    assert stock.cap == renewed.cap == fleet_floor(_fleet(None)) // 2  # every live context fits the cache
    assert stock.evicted_reprefill_tokens > 0  # ...yet idle live prefixes go before finished sessions' blocks
    assert stock.renewals is None
    assert renewed.evicted_reprefill_tokens == 0
    assert renewed.quarantines == 0
    assert renewed.renewals is not None
    assert renewed.renewals > 0
    assert renewed.generated_tokens >= 0.99 * stock.generated_tokens  # renewals' own tokens are not counted
    assert "renewals" not in stock.row()
    assert renewed.row()["renewals"] == renewed.renewals


def test_renewal_is_ours_alone_and_deterministic() -> None:
    config = _fleet(4.0)
    assert simulate_policy(config, "sticky-least-loaded").renewals is None
    assert simulate_policy(config, "rolloutpool").row() == simulate_policy(config, "rolloutpool").row()


def test_under_turn_scheduling_only_kept_prefixes_still_cached_are_renewed(monkeypatch: pytest.MonkeyPatch) -> None:
    from rolloutpool.routing.workingset import Phase  # noqa: PLC0415
    from rolloutpool.sim.fleet import _Fleet  # noqa: PLC0415 -- its enqueue is watched

    phases: list[Phase | None] = []
    enqueue = _Fleet._enqueue

    def watched(self: _Fleet, replica: str, request: Request) -> None:
        if isinstance(request.tag, str):  # a renewal (a turn's tag is its trajectory's index)
            phases.append(self.ledger.work.phase(request.tag) if self.ledger.work is not None else None)
        enqueue(self, replica, request)

    monkeypatch.setattr(_Fleet, "_enqueue", watched)
    base = FleetConfig(scenario=scenario("agentic-grpo"), in_flight=1, replicas=2, duration_s=600.0)
    config = replace(base, in_flight=3 * fleet_floor(base), renew_every_s=2.0)  # pressure: prefixes are let go
    result = simulate_policy(config, "rolloutpool")
    assert result.renewals is not None
    assert result.renewals > 20
    assert len(phases) >= result.renewals
    assert set(phases) == {Phase.IDLE}  # never a prefix let go, held or generating


def test_a_skipped_renewal_is_not_counted_and_comes_due_again_an_interval_later() -> None:
    clock = RenewalClock(RenewalConfig(every_seconds=2.0))
    clock.idle("a", now=0.0)
    assert clock.due(now=2.0) == ["a"]
    clock.skipped("a", now=2.0)
    assert clock.renewals == 0
    assert clock.due(now=3.9) == []
    assert clock.due(now=4.0) == ["a"]
    assert clock.renewals == 1
