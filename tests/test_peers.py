"""The peers' program schedulers (routing/peers/): ThunderAgent and Progress-TTL, alone and in the ledger (pure)."""

from __future__ import annotations

import pytest

from rolloutpool.routing.events import Bound, Held, Placed, Resumed
from rolloutpool.routing.ledger import Ledger, LedgerConfig, Usage
from rolloutpool.routing.peers.progress_ttl import ProgressTTL, ProgressTTLConfig
from rolloutpool.routing.peers.progress_ttl_math import ReturnTimes, fitted_ttl
from rolloutpool.routing.peers.registry import LeastPrograms, make_scheduler, placement_for
from rolloutpool.routing.peers.thunderagent import LeastWorkingSet, ThunderAgent, ThunderAgentConfig
from rolloutpool.routing.policies import Placement
from rolloutpool.routing.workingset import Phase, WorkingSet


def _acting(ws: WorkingSet, sid: str, context: int, *, now: float, replica: str = "r0") -> None:
    ws.bound(sid, replica, now=now, first_context=context)
    ws.turn_finished(sid, context=context, now=now)


# -- ThunderAgent ---------------------------------------------------------------------------


def _ta(*capacities: int) -> ThunderAgent:
    ta = ThunderAgent()
    for i, capacity in enumerate(capacities):
        ta.add_replica(f"r{i}", capacity=capacity)
    return ta


def test_thunderagent_pauses_the_smallest_acting_programs_past_its_threshold_down_to_its_target() -> None:
    ta = _ta(10_000)
    _acting(ta, "a", 4000, now=0.0)
    _acting(ta, "b", 3000, now=0.0)
    _acting(ta, "c", 2800, now=0.0)  # 0.98 of the pool
    ta.bound("d", "r0", now=0.0, first_context=100)  # reasoning: never paused
    assert ta.resume("r0", now=10.0) == []
    assert ta.phase("c") is Phase.LET_GO  # the smallest ACTING program: 7,100 left, under 0.80
    assert ta.phase("b") is Phase.IDLE
    assert ta.phase("a") is Phase.IDLE
    assert ta.phase("d") is Phase.GENERATING
    assert ta.pauses == 1


def test_thunderagent_holds_a_paused_turn_and_resumes_it_under_the_hysteresis_at_its_tick() -> None:
    ta = _ta(10_000)
    _acting(ta, "a", 4000, now=0.0)
    _acting(ta, "b", 3000, now=0.0)
    _acting(ta, "c", 2800, now=0.0)
    ta.resume("r0", now=10.0)  # c paused
    assert not ta.arrive("c", now=11.0)
    assert ta.phase("c") is Phase.HELD
    assert ta.held("r0") == 1
    assert ta.resume("r0", now=12.0) == []  # between ticks: nothing happens
    assert ta.resume("r0", now=15.0) == []  # 7,000 + 3,824 over 0.85 of the pool
    ta.released("a")
    assert ta.resume("r0", now=20.0) == ["c"]
    assert ta.phase("c") is Phase.GENERATING
    assert ta.lapsed("c")


def test_thunderagent_resumes_a_paused_program_still_in_its_tool_when_there_is_room() -> None:
    ta = _ta(10_000)
    _acting(ta, "a", 6000, now=0.0)
    _acting(ta, "b", 3800, now=0.0)
    ta.resume("r0", now=5.0)  # b paused (smallest), 6,000 left
    assert ta.phase("b") is Phase.LET_GO
    ta.released("a")
    ta.resume("r0", now=10.0)
    assert ta.phase("b") is Phase.IDLE  # ACTIVE again, counted
    assert ta.replicas["r0"].counted == 3800


def test_thunderagent_forces_a_turn_held_past_its_resume_timeout() -> None:
    ta = ThunderAgent(ThunderAgentConfig(resume_timeout_s=100.0))
    ta.add_replica("r0", capacity=10_000)
    _acting(ta, "a", 4000, now=0.0)
    _acting(ta, "c", 5800, now=0.0)
    ta.resume("r0", now=5.0)  # a paused
    assert not ta.arrive("a", now=6.0)
    ta.bound("x", "r0", now=6.0, first_context=4000)  # generating, never paused: no room for a
    assert ta.resume("r0", now=100.0) == []
    assert ta.resume("r0", now=110.0) == ["a"]
    assert ta.replicas["r0"].forced == 1


def test_thunderagent_resumes_a_held_turn_on_the_least_loaded_replica_where_it_fits() -> None:
    ta = _ta(10_000, 10_000, 10_000)
    _acting(ta, "a", 9800, now=0.0)
    ta.resume("r0", now=5.0)
    assert not ta.arrive("a", now=6.0)
    ta.bound("x", "r0", now=6.0, first_context=9000)
    _acting(ta, "y", 3000, now=6.0, replica="r1")
    # a needs 10,824: fits nowhere under 0.85 of 10,000
    assert ta.resume("r0", now=10.0) == []
    ta2 = _ta(10_000, 20_000, 20_000)
    _acting(ta2, "a", 9800, now=0.0)
    ta2.resume("r0", now=5.0)
    ta2.arrive("a", now=6.0)
    ta2.bound("x", "r0", now=6.0, first_context=9000)
    _acting(ta2, "y", 3000, now=6.0, replica="r1")
    assert ta2.resume("r0", now=10.0) == ["a"]
    assert ta2.destination("a") == "r2"  # the least loaded where it fits
    assert ta2.destination("a") is None  # told once
    assert ta2.replicas["r2"].counted == 9800 + 1024
    assert ta2.replicas["r0"].counted == 9000


def test_thunderagent_admits_new_programs_under_its_threshold_and_none_while_a_turn_waits() -> None:
    ta = _ta(10_000)
    assert ta.room_for_new("r0", now=0.0) == 9500 // 2048
    _acting(ta, "a", 9800, now=0.0)
    ta.resume("r0", now=5.0)
    ta.arrive("a", now=6.0)
    assert ta.room_for_new("r0", now=6.0) == 0


def test_thunderagent_in_the_ledger_moves_a_resumed_session_to_its_new_replica() -> None:
    ta = ThunderAgent()
    ledger = Ledger(LedgerConfig(quarantine=None, scheduler=lambda: ta), policy=LeastWorkingSet(ta))
    ledger.add_replica("r0", now=0.0, capacity_tokens=10_000)
    ledger.add_replica("r1", now=0.0, capacity_tokens=40_000)
    first = ledger.arrive(Placement("a"), now=0.0)
    assert isinstance(first, Bound)
    assert first.session.replica == "r0"
    other = ledger.arrive(Placement("b"), now=0.0)  # the smaller working set
    assert isinstance(other, Bound)
    assert other.session.replica == "r1"
    ledger.turn_started(first.session)
    ledger.finish_turn(first.session, now=1.0, usage=Usage(8700, 1000, 0))
    ledger.turn_ended(first.session, now=1.0)  # r0's first tick: at 0.97, a is paused
    assert ta.phase("a") is Phase.LET_GO
    held = ledger.arrive(Placement("a"), now=11.0)
    assert isinstance(held, Held)
    ledger.take_events()
    ledger.tick(now=15.0)  # a needs 10,724: not under 0.85 of r0, under it on r1
    events = ledger.take_events()
    resumed = [e for e in events if isinstance(e, Resumed)]
    assert [e.session.replica for e in resumed] == ["r1"]
    assert any(isinstance(e, Placed) and e.kind == "moved" for e in events)
    session = ledger.lookup("a")
    assert session is not None
    assert session.replica == "r1"
    assert session.context_tokens == 9700
    assert ledger.table.replicas["r0"].live == 0
    assert ledger.table.replicas["r1"].live == 2


# -- Progress-TTL ----------------------------------------------------------------------------


def _pt(*capacities: int, **config: float) -> ProgressTTL:
    pt = ProgressTTL(ProgressTTLConfig(**config))  # type: ignore[arg-type]
    for i, capacity in enumerate(capacities):
        pt.add_replica(f"r{i}", capacity=capacity)
    return pt


def test_the_ttl_is_where_the_return_hazard_falls_below_gamma() -> None:
    times = ReturnTimes()
    for _ in range(90):
        times.observe(0.1)
    for _ in range(5):
        times.observe(1.5)
    for _ in range(5):
        times.observe(500.0)
    assert fitted_ttl(times, gamma=0.1, max_ttl_s=10.0, min_samples=32) == 0.25  # nobody returns in (0.25, 0.5]
    assert fitted_ttl(times, gamma=0.1, max_ttl_s=10.0, min_samples=200) == 10.0  # too few seen: the cap
    assert fitted_ttl(ReturnTimes(), gamma=0.1, max_ttl_s=10.0, min_samples=0) == 0.0
    steady = ReturnTimes()
    for seconds in (0.1, 0.3, 0.7, 1.5, 3.0, 6.0, 12.0):
        for _ in range(10):
            steady.observe(seconds)
    assert fitted_ttl(steady, gamma=0.01, max_ttl_s=10.0, min_samples=1) == 10.0  # the hazard stays up: the cap


def test_progress_ttl_pauses_an_acting_program_when_its_ttl_ends() -> None:
    pt = _pt(10_000)
    _acting(pt, "a", 3000, now=0.0)  # TTL: the 10 s cap (nothing seen yet)
    pt.resume("r0", now=9.0)
    assert pt.phase("a") is Phase.IDLE
    pt.resume("r0", now=10.0)
    assert pt.phase("a") is Phase.LET_GO
    assert pt.replicas["r0"].counted == 0


def test_progress_ttl_serves_a_paused_programs_turn_where_it_fits_else_on_another_rank_else_retains_it() -> None:
    pt = _pt(10_000, 10_000)
    _acting(pt, "a", 3000, now=0.0)
    pt.resume("r0", now=10.0)  # a paused
    assert pt.arrive("a", now=11.0)  # fits its rank
    assert pt.lapsed("a")
    assert pt.destination("a") is None
    pt.turn_finished("a", context=3200, now=12.0)
    pt.resume("r0", now=22.0)  # paused again
    pt.bound("x", "r0", now=22.0, first_context=8000)
    assert pt.arrive("a", now=23.0)  # 8,000 + 4,224 over 0.95 here: the other rank has room
    assert pt.destination("a") == "r1"
    pt.bound("y", "r1", now=23.0, first_context=6000)
    pt.turn_finished("a", context=3300, now=24.0)
    pt.resume("r1", now=40.0)  # a's TTL over: paused on r1
    pt.bound("z", "r0", now=40.0, first_context=1000)
    assert not pt.arrive("a", now=41.0)  # neither rank has room: retained
    assert pt.phase("a") is Phase.HELD
    pt.released("y")
    assert pt.resume("r1", now=42.0) == ["a"]


def test_progress_ttl_under_pressure_pauses_the_programs_with_the_least_ttl_left() -> None:
    pt = _pt(10_000)
    _acting(pt, "old", 3000, now=0.0)
    _acting(pt, "mid", 3000, now=2.0)
    _acting(pt, "new", 3000, now=4.0)
    pt.bound("x", "r0", now=5.0, first_context=1000)  # 1.0 of the pool
    pt.resume("r0", now=5.0)
    assert pt.phase("old") is Phase.LET_GO  # the least TTL left: 7,000 left, under 0.85
    assert pt.phase("mid") is Phase.IDLE
    assert pt.phase("new") is Phase.IDLE


def test_progress_ttl_forces_a_retained_request_after_its_timeout() -> None:
    pt = _pt(10_000, force_resume_timeout_s=50.0)
    _acting(pt, "a", 3000, now=0.0)
    pt.resume("r0", now=10.0)
    pt.bound("x", "r0", now=10.0, first_context=9000)
    assert not pt.arrive("a", now=11.0)
    assert pt.resume("r0", now=60.0) == []
    assert pt.resume("r0", now=61.0) == ["a"]
    assert pt.replicas["r0"].forced == 1


# -- the registry --------------------------------------------------------------------------------


def test_the_registry_builds_each_peer_with_its_placement_and_refuses_unknown_names() -> None:
    ta = make_scheduler("thunderagent", {"pause_threshold": 0.9})
    assert isinstance(ta, ThunderAgent)
    assert ta.ta.pause_threshold == 0.9
    assert isinstance(placement_for(ta), LeastWorkingSet)
    pt = make_scheduler("progress-ttl")
    assert isinstance(placement_for(pt), LeastPrograms)
    with pytest.raises(ValueError, match="unknown turn scheduler"):
        make_scheduler("nope")
    with pytest.raises(ValueError, match="thunderagent"):
        make_scheduler("thunderagent", {"bogus": 1})
    with pytest.raises(ValueError, match="pause_target"):
        ThunderAgentConfig(pause_target=0.99)
