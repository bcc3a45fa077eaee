"""Admission by projected KV tokens: projections, the cap they give, and the ledger keeping it current."""

from __future__ import annotations

import pytest

from rolloutpool.capacity import oversubscribed_cap
from rolloutpool.routing.admission_kv import KvAdmissionConfig, KvProjection
from rolloutpool.routing.caps import CapRule, effective_cap
from rolloutpool.routing.events import Bound, Queued
from rolloutpool.routing.ledger import Ledger, LedgerConfig, Usage
from rolloutpool.routing.policies import Placement, SessionAware

MAX_LEN = 32768
CAPACITY = 380_000


def _ledger(**rule: object) -> Ledger:
    ledger = Ledger(
        LedgerConfig(caps=CapRule(max_model_len=MAX_LEN, **rule), quarantine=None),  # type: ignore[arg-type]
        policy=SessionAware(),
    )
    ledger.add_replica("a", now=0.0, capacity_tokens=CAPACITY)
    return ledger


def _rollout(ledger: Ledger, sid: str, contexts: list[int], *, now: float) -> None:
    """A whole session: placed, one turn per context, finished."""
    arrival = ledger.arrive(Placement(sid), now=now)
    assert isinstance(arrival, Bound)
    session = arrival.session
    for i, context in enumerate(contexts):
        ledger.turn_started(session)
        ledger.finish_turn(session, now=now + i, usage=Usage(context - 100, 100, None))
        ledger.turn_ended(session, now=now + i)
    ledger.release(sid, how="finished", now=now + len(contexts))
    ledger.refresh_kv(now=now + len(contexts))  # a scrape round: caps take up the fleet-wide estimates


def test_a_cold_router_admits_what_the_residency_cap_would() -> None:
    ledger = _ledger()
    expected = oversubscribed_cap(capacity_tokens=CAPACITY, max_model_len=MAX_LEN, expected_residency=0.5, headroom=0.1)
    assert ledger.cap_of("a") == expected == 20


def test_short_contexts_raise_the_cap_far_above_the_residency_guess_up_to_the_ceiling() -> None:
    ledger = _ledger()
    for i in range(300):
        _rollout(ledger, f"s{i}", [1200, 1800, 2400], now=float(i))
    cap = ledger.cap_of("a")
    assert cap is not None
    assert cap > 100  # ~2.4k-token rollouts: the 20 of the residency guess would queue them
    assert _ledger(ceiling=64).cap_of("a") == 20  # cold: the guess, under the ceiling
    capped = _ledger(ceiling=64)
    for i in range(300):
        _rollout(capped, f"s{i}", [1200, 1800, 2400], now=float(i))
    assert capped.cap_of("a") == 64


def test_long_contexts_keep_the_cap_near_three_floors() -> None:
    ledger = _ledger()
    for i in range(300):
        _rollout(ledger, f"s{i}", [8000, 16000, 24000, 32000], now=float(i))
    # floor 11; a new 8k session projects 8k + a tenth of its ~24.5k growth: 342k / 10.45k = 32 (an oversubscription
    # that pays at 2x, where sticky least-loaded with no cap serves the most)
    assert ledger.cap_of("a") == 32


def test_a_session_that_outlived_the_short_mode_is_projected_towards_the_long_one() -> None:
    kv = KvProjection(KvAdmissionConfig(MAX_LEN))
    for i in range(400):  # 70 % end near 2k, 30 % near 30k
        sid = f"s{i}"
        kv.bound(sid, "a", context=1000)
        final = 30000 if i % 10 < 3 else 2000
        kv.turn_finished(sid, "a", context=final)
        kv.released(sid, finished=True)
    assert kv.final_estimate() < 12000
    assert kv.final_estimate(5000) > 28000
    assert kv.project(5000) == pytest.approx(5000 + 0.1 * (kv.final_estimate(5000) - 5000))
    assert kv.project(1000) < kv.project(5000) < 12000


def test_projections_follow_the_sessions_and_room_is_never_negative() -> None:
    kv = KvProjection(KvAdmissionConfig(MAX_LEN, headroom=0.1))
    kv.bound("x", "a", context=30000)
    kv.bound("y", "a", context=30000)
    assert kv.replicas["a"].tokens == pytest.approx(kv.project(30000) * 2)
    assert kv.room("a", capacity_tokens=40000) == 0
    kv.bound("x", "b", context=30000)  # moved: leaves a
    assert set(kv.replicas["a"].sessions) == {"y"}
    kv.released("y", finished=False)
    assert kv.replicas["a"].tokens == 0.0
    kv.replica_removed("b")
    assert "b" not in kv.replicas


@pytest.mark.parametrize(
    ("rule", "replica_cap", "operator", "expected"),
    [
        (CapRule(max_model_len=MAX_LEN), None, None, 7 + 40),
        (CapRule(max_model_len=MAX_LEN, ceiling=30), None, None, 30),
        (CapRule(max_model_len=MAX_LEN, kv_admission=False), None, None, 20),
        (CapRule(max_model_len=MAX_LEN), 5, None, 5),  # a fixed cap is the user's: no projection
        (CapRule(max_model_len=MAX_LEN), None, 25, 25),  # the operator's law has measurements
    ],
)
def test_effective_cap_uses_the_room_only_for_derived_caps(
    rule: CapRule, replica_cap: int | None, operator: int | None, expected: int
) -> None:
    cap = effective_cap(
        rule, replica_cap=replica_cap, capacity_tokens=CAPACITY, operator_cap=operator, live=7, kv_room=40
    )
    assert cap == expected


def test_a_queued_session_is_admitted_when_a_finish_frees_projected_tokens() -> None:
    ledger = _ledger()
    ledger.set_capacity("a", capacity_tokens=120_000, block_size=None, now=0.0)
    bound = []
    for i in range(10):
        arrival = ledger.arrive(Placement(f"s{i}", prompt_tokens=16000), now=0.0)
        if not isinstance(arrival, Bound):
            assert isinstance(arrival, Queued)
            break
        bound.append(arrival.session)
    assert 1 <= len(bound) < 10
    ledger.take_events()
    ledger.release(bound[0].session_id, how="finished", now=1.0)
    assert any(type(e).__name__ == "Admitted" for e in ledger.take_events())


def test_the_measured_floor_waits_until_the_finished_sessions_describe_the_live_ones() -> None:
    kv = KvProjection(KvAdmissionConfig(MAX_LEN))
    assert kv.measured_floor(capacity_tokens=CAPACITY) == int(CAPACITY * 0.9 // MAX_LEN)  # the prior: maxModelLen
    for i in range(200):  # short rollouts finish first
        kv.bound(f"s{i}", "a", context=1000)
        kv.turn_finished(f"s{i}", "a", context=3000)
        kv.released(f"s{i}", finished=True)
    floor = kv.measured_floor(capacity_tokens=CAPACITY)
    assert floor is not None
    assert floor > 60  # 342k over a ~3.5k 90th percentile
    for i in range(10):  # while long ones are still live and already past it
        kv.bound(f"long{i}", "a", context=12000)
    assert kv.measured_floor(capacity_tokens=CAPACITY) is None


def test_the_measured_floor_reads_the_first_finishers_while_the_live_sessions_stay_under_them() -> None:
    """The histogram's prior fades over ~115 finishes; the censored quantile needs 20 and the live sessions' word."""
    kv = KvProjection(KvAdmissionConfig(MAX_LEN))
    for i in range(30):  # sessions early in their rollouts
        kv.bound(f"live{i}", "a", context=1500)
    for i in range(19):
        kv.bound(f"s{i}", "a", context=1000)
        kv.turn_finished(f"s{i}", "a", context=3000)
        kv.released(f"s{i}", finished=True)
    prior = int(CAPACITY * 0.9 // MAX_LEN)
    assert kv.measured_floor(capacity_tokens=CAPACITY) == prior  # 19 finished: the histogram, still the prior
    kv.bound("s19", "a", context=1000)
    kv.turn_finished("s19", "a", context=3000)
    kv.released("s19", finished=True)
    assert kv.measured_floor(capacity_tokens=CAPACITY) == int(CAPACITY * 0.9 // 3000)


def test_the_measured_floor_does_not_read_short_finishers_while_live_sessions_outgrow_them() -> None:
    """A bimodal mix: the short rollouts finish first while the long ones are already as long and growing."""
    kv = KvProjection(KvAdmissionConfig(MAX_LEN))
    for i in range(15):
        kv.bound(f"long{i}", "a", context=3200)
    for i in range(40):
        kv.bound(f"s{i}", "a", context=1000)
        kv.turn_finished(f"s{i}", "a", context=3000)
        kv.released(f"s{i}", finished=True)
    assert kv.measured_floor(capacity_tokens=CAPACITY) == int(CAPACITY * 0.9 // MAX_LEN)  # still the prior


def test_the_ledger_gives_each_replica_its_measured_floor_over_its_own_capacity() -> None:
    ledger = _ledger()
    ledger.add_replica("half", now=0.0, capacity_tokens=CAPACITY // 2)
    ledger.add_replica("unknown", now=0.0)
    assert ledger.measured_floor("a") == int(CAPACITY * 0.9 // MAX_LEN)  # the prior: maxModelLen
    for i in range(200):
        _rollout(ledger, f"s{i}", [1500, 3000], now=float(i))
    floor = ledger.measured_floor("a")
    half = ledger.measured_floor("half")
    assert floor is not None
    assert half is not None
    assert floor > 60
    assert half == pytest.approx(floor / 2, abs=1)
    assert ledger.measured_floor("unknown") is None  # no capacity reported: no floor
    assert ledger.measured_floor("gone") is None
    assert _ledger(kv_admission=False).measured_floor("a") is None  # nothing projected


def test_the_measured_floor_is_worked_out_once_per_change_not_once_per_replica(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scrape asks for every replica's floor; the final context behind it is the fleet's, so one pass serves all."""
    import rolloutpool.routing.admission_kv as module  # noqa: PLC0415 - the name the projection looks up

    calls: list[int] = []
    real = module.censored_quantile

    def counted(**kwargs: object) -> float | None:
        calls.append(1)
        return real(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "censored_quantile", counted)
    kv = KvProjection(KvAdmissionConfig(MAX_LEN))
    for i in range(25):
        kv.bound(f"s{i}", "a", context=1000)
        kv.turn_finished(f"s{i}", "a", context=3000)
        kv.released(f"s{i}", finished=True)
    kv.bound("live", "a", context=1500)
    floors = {kv.measured_floor(capacity_tokens=CAPACITY // k) for k in range(1, 50)}
    assert len(calls) == 1
    assert len(floors) > 1  # each replica's own capacity
    kv.turn_finished("live", "a", context=2500)
    kv.measured_floor(capacity_tokens=CAPACITY)
    assert len(calls) == 2  # a context moved: worked out again


def test_a_larger_growth_share_projects_more_and_admits_fewer() -> None:
    lean, wide = _ledger(), _ledger(growth_share=0.5)
    assert wide.kv is not None
    assert wide.kv.config.growth_share == 0.5
    for ledger in (lean, wide):
        for i in range(60):
            _rollout(ledger, f"s{i}", [2000, 8000, 20000], now=float(i))
        for i in range(8):  # young live sessions: most of their growth is ahead of them
            arrival = ledger.arrive(Placement(f"live{i}"), now=100.0)
            assert isinstance(arrival, Bound)
            ledger.turn_started(arrival.session)
            ledger.finish_turn(arrival.session, now=100.0, usage=Usage(1900, 100, None))
            ledger.turn_ended(arrival.session, now=100.0)
        ledger.refresh_kv(now=101.0)
    assert (lean.cap_of("a") or 0) > (wide.cap_of("a") or 0) > 8
