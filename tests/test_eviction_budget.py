"""The eviction budget: admission past the KV projection while measured eviction is cheap (pure, and in the ledger)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rolloutpool.routing.caps import CapRule
from rolloutpool.routing.discovery import OperatorLimit
from rolloutpool.routing.events import Admitted, Bound, Queued
from rolloutpool.routing.eviction_budget import EvictionBudget, EvictionBudgetConfig
from rolloutpool.routing.ledger import Ledger, LedgerConfig, Usage
from rolloutpool.routing.policies import Placement, SessionAware
from rolloutpool.routing.quarantine import QuarantineConfig
from rolloutpool.routing.table import Session

WINDOW = 60.0
BUDGET = 2000.0


def _budget() -> EvictionBudget:
    return EvictionBudget(EvictionBudgetConfig(reprefill_tokens_per_s=BUDGET, window_seconds=WINDOW))


def test_the_rate_is_the_evicted_tokens_of_the_window_per_second() -> None:
    budget = _budget()
    assert budget.rate("a", 0.0) == 0.0  # nothing returned yet
    budget.observe("a", now=0.0, tokens=0)
    budget.observe("a", now=30.0, tokens=60_000)
    assert budget.rate("a", 30.0) == pytest.approx(60_000 / 30.0)  # the first window: over the time seen
    assert budget.rate("a", 60.0) == pytest.approx(1000.0)
    assert budget.rate("a", 91.0) == 0.0  # the eviction left the window
    assert budget.rate("b", 60.0) == 0.0


def test_the_factor_rises_once_a_window_while_sessions_wait_and_eviction_is_cheap() -> None:
    budget = _budget()
    budget.observe("a", now=0.0, tokens=0)
    assert not budget.step(["a"], now=30.0, waiting=True)  # not in the first window
    assert budget.step(["a"], now=60.0, waiting=True)
    assert budget.scale == pytest.approx(1.1)
    assert not budget.step(["a"], now=80.0, waiting=True)  # at most once a window
    assert budget.step(["a"], now=120.0, waiting=True)
    assert budget.scale == pytest.approx(1.21)
    assert not budget.step(["a"], now=200.0, waiting=False)  # nobody waits: it holds
    assert budget.scale == pytest.approx(1.21)
    assert budget.rises == 2


def test_eviction_of_idle_prefixes_lets_the_factor_rise_every_step() -> None:
    budget = _budget()
    step = WINDOW / 6
    budget.observe("a", now=0.0, tokens=0)
    for t in range(0, 51, 10):  # the running sessions hold a fifth of the cache, on average over the window
        budget.observe_usage("a", now=float(t), usage=0.1 if t % 20 else 0.3)
    budget.observe("a", now=50.0, tokens=12_000)  # some eviction: 200 tokens/s, far under the budget
    assert not budget.step(["a"], now=50.0, waiting=True)  # still not in the first window
    budget.observe_usage("a", now=60.0, usage=0.3)
    assert budget.step(["a"], now=60.0, waiting=True)
    assert budget.step(["a"], now=60.0 + step, waiting=True)  # a step later, not a window
    assert budget.scale == pytest.approx(1.21)
    # the cache fills (the window's mean passes a quarter): once a window again
    for t in range(75, 121, 5):
        budget.observe_usage("a", now=float(t), usage=0.5)
    budget.observe("a", now=100.0, tokens=12_000)
    assert not budget.step(["a"], now=120.0, waiting=True)  # 50 s after the last rise
    for t in range(125, 131, 5):
        budget.observe_usage("a", now=float(t), usage=0.5)
    assert budget.step(["a"], now=70.0 + WINDOW, waiting=True)
    assert budget.rises == 3


def test_without_eviction_or_usage_the_factor_rises_once_a_window() -> None:
    for name, usage in (("no eviction yet", 0.1), ("no usage scraped", None)):
        budget = _budget()
        budget.observe("a", now=0.0, tokens=0)
        if usage is not None:
            budget.observe_usage("a", now=55.0, usage=usage)
        if name == "no usage scraped":
            budget.observe("a", now=50.0, tokens=12_000)
        assert budget.step(["a"], now=60.0, waiting=True), name
        assert not budget.step(["a"], now=70.0, waiting=True), name


def test_eviction_near_the_budget_holds_and_over_it_the_factor_falls_to_one() -> None:
    budget = _budget()
    budget.observe("a", now=0.0, tokens=0)
    budget.step(["a"], now=60.0, waiting=True)
    budget.step(["a"], now=120.0, waiting=True)
    budget.observe("a", now=125.0, tokens=int(0.9 * BUDGET * WINDOW))  # 0.9 of the budget: between the marks
    assert not budget.step(["a"], now=130.0, waiting=True)
    budget.observe("a", now=131.0, tokens=int(0.5 * BUDGET * WINDOW))  # now over it
    assert budget.step(["a"], now=140.0, waiting=True)
    assert budget.scale == pytest.approx(1.1)
    assert budget.step(["a"], now=150.0, waiting=True)
    assert budget.scale == 1.0
    assert not budget.step(["a"], now=160.0, waiting=True)  # never under the projection
    assert budget.scale == 1.0
    assert budget.falls == 2


FLOOR = 0.01  # a step's fixed cost, engine seconds


def _itl(budget: EvictionBudget, replica: str, *, until: float, step_seconds: float, start: float = 0.0) -> None:
    """Scrapes every 10 s from ``start`` to ``until`` of an engine whose tokens each took ``step_seconds``."""
    for i, t in enumerate(range(int(start), int(until) + 1, 10)):
        count = 1000.0 * (i + 1) + start * 100
        budget.observe_itl(replica, now=float(t), seconds_total=count * step_seconds, count_total=count)


def test_engines_with_room_to_compute_keep_the_factor_rising_over_the_budget() -> None:
    over = int(1.5 * BUDGET * WINDOW)  # eviction at 1.5 times the budget
    cases = {  # step floor, the engines' mean step -> whether the factor keeps rising
        "small batches: steps near the floor": (FLOOR, 1.6 * FLOOR, True),
        "steps past twice the floor": (FLOOR, 2.4 * FLOOR, False),
        "no floor known": (None, 1.1 * FLOOR, False),
    }
    for name, (floor, step_seconds, rises) in cases.items():
        config = EvictionBudgetConfig(reprefill_tokens_per_s=BUDGET, window_seconds=WINDOW, step_floor_seconds=floor)
        budget = EvictionBudget(config)
        budget.observe("a", now=0.0, tokens=0)
        _itl(budget, "a", until=60.0, step_seconds=step_seconds)
        assert budget.step(["a"], now=60.0, waiting=True), name  # no eviction yet: the once-a-window rise
        budget.observe("a", now=100.0, tokens=over)
        _itl(budget, "a", start=70.0, until=130.0, step_seconds=step_seconds)
        assert budget.headroom(["a"], 130.0) is rises, name
        assert budget.step(["a"], now=130.0, waiting=True), name  # it moves either way ...
        assert (budget.scale > 1.1) is rises, name  # ... up with room to compute, down to the projection without
        assert budget.falls == (0 if rises else 1), name


def test_the_mean_inter_token_latency_is_over_the_window_and_survives_a_restart() -> None:
    budget = _budget()
    assert budget.mean_itl("a", 0.0) is None  # no scrape
    budget.observe_itl("a", now=0.0, seconds_total=0.0, count_total=0.0)
    assert budget.mean_itl("a", 0.0) is None  # one scrape: no delta
    budget.observe_itl("a", now=10.0, seconds_total=0.0, count_total=0.0)
    assert budget.mean_itl("a", 10.0) is None  # no token in the window
    budget.observe_itl("a", now=20.0, seconds_total=3.0, count_total=100.0)
    assert budget.mean_itl("a", 20.0) == pytest.approx(0.03)
    budget.observe_itl("a", now=50.0, seconds_total=3.5, count_total=150.0)
    budget.observe_itl("a", now=100.0, seconds_total=4.0, count_total=200.0)
    assert budget.mean_itl("a", 100.0) == pytest.approx(0.01)  # the scrapes older than the window are gone
    budget.observe_itl("a", now=110.0, seconds_total=0.5, count_total=10.0)  # the engine restarted
    assert budget.mean_itl("a", 110.0) is None
    assert not budget.headroom(["a"], 110.0)  # a replica without a mean: no room claimed
    budget.forget("a")
    assert budget.mean_itl("a", 120.0) is None


def test_the_mean_over_replicas_decides_and_max_scale_bounds_the_factor() -> None:
    budget = EvictionBudget(EvictionBudgetConfig(window_seconds=WINDOW, max_scale=1.15))
    budget.observe("a", now=0.0, tokens=0)
    budget.observe("b", now=59.0, tokens=int(1.5 * BUDGET * WINDOW))  # b alone at 1.5x: a mean of 0.75x
    assert budget.step(["a", "b"], now=60.0, waiting=True)
    assert budget.step(["a", "b"], now=130.0, waiting=True)  # 1.1 * 1.1 would pass max_scale ...
    assert budget.scale == pytest.approx(1.15)  # ... which it stops at
    assert not budget.step(["a", "b"], now=200.0, waiting=True)
    assert not budget.step([], now=300.0, waiting=True)


def test_a_faster_engine_takes_a_scaled_budget_and_bad_settings_are_refused() -> None:
    scaled = EvictionBudgetConfig().scaled(10.0)
    assert scaled.reprefill_tokens_per_s == 20_000.0
    assert scaled.window_seconds == 6.0
    assert scaled.step_seconds == 1.0
    bads = (
        {"reprefill_tokens_per_s": 0.0}, {"window_seconds": -1.0}, {"grow_below": 1.5}, {"step_factor": 1.0},
        {"step_floor_seconds": 0.0}, {"headroom_ratio": 1.0}, {"kv_read_seconds_per_token": 0.0},
    )  # fmt: skip
    for bad in (*bads, {"idle_usage": -0.1}, {"idle_usage": 1.5}):
        with pytest.raises(ValueError, match="eviction budget"):
            EvictionBudgetConfig(**bad)  # type: ignore[arg-type]


# -- in the ledger -------------------------------------------------------------------------------------------------

MAX_LEN = 8192
CAPACITY = 65_536
CONTEXT = 6000  # turn 1 ends here; a fresh session's projection is about its first context


def _ledger(*, budget: EvictionBudgetConfig | None = None, quarantine: QuarantineConfig | None = None) -> Ledger:
    config = LedgerConfig(caps=CapRule(max_model_len=MAX_LEN), quarantine=quarantine, eviction_budget=budget)
    ledger = Ledger(config, policy=SessionAware())
    ledger.add_replica("a", now=0.0, capacity_tokens=CAPACITY)
    return ledger


def _first(ledger: Ledger, session: Session) -> None:
    ledger.turn_started(session)
    ledger.finish_turn(session, now=0.0, usage=Usage(CONTEXT - 500, 500, 0))
    ledger.turn_ended(session, now=0.0)


def _back(ledger: Ledger, session: Session, *, now: float, evicted: bool) -> None:
    """A returning turn at the same context (no growth), its prefix cached or evicted whole."""
    context = session.context_tokens
    ledger.turn_started(session)
    ledger.finish_turn(session, now=now, usage=Usage(context, 0, 0 if evicted else (context - 1) // 16 * 16))
    ledger.turn_ended(session, now=now)


def _fill(ledger: Ledger) -> list[Session]:
    """Place sessions until one queues; each runs its first turn to CONTEXT tokens."""
    sessions: list[Session] = []
    for i in range(64):
        arrival = ledger.arrive(Placement(f"s{i}"), now=0.0)
        if isinstance(arrival, Queued):
            return sessions
        assert isinstance(arrival, Bound)
        sessions.append(arrival.session)
        _first(ledger, arrival.session)
    raise AssertionError("the projection never filled")


def test_cheap_eviction_lets_queued_sessions_in_and_costly_eviction_takes_the_room_back() -> None:
    ledger = _ledger(budget=EvictionBudgetConfig(window_seconds=WINDOW))
    sessions = _fill(ledger)
    projected = ledger.cap_of("a")
    assert projected == len(sessions)
    for t in (10.0, 30.0, 50.0, 70.0):  # returning turns fully cached: no eviction measured (first at 10 s)
        for s in sessions:
            _back(ledger, s, now=t, evicted=False)
        ledger.refresh_kv(now=t)
    assert ledger.budget is not None
    assert ledger.budget.scale > 1.0
    assert any(isinstance(e, Admitted) for e in ledger.take_events())  # the queued session got in
    assert (ledger.cap_of("a") or 0) > len(sessions)
    for t in (75.0, 76.0, 77.0):  # every returning turn re-prefills its whole context: over the budget
        for s in sessions:
            _back(ledger, s, now=t, evicted=True)
    for t in (80.0, 90.0, 100.0):
        ledger.refresh_kv(now=t)
    assert ledger.budget.scale == 1.0


def test_a_replica_that_reads_its_whole_cache_cheaply_admits_up_to_the_ceiling_not_by_projection() -> None:
    per_token = 0.01 / CAPACITY  # a whole read of the 65,536-token cache: 10 ms
    cheap = EvictionBudgetConfig(window_seconds=WINDOW, step_floor_seconds=0.0125, kv_read_seconds_per_token=per_token)
    assert cheap.reads_cheaply(CAPACITY)  # 12.5 + 10 ms under 2 x 12.5 ms
    assert not cheap.reads_cheaply(2 * CAPACITY)  # 12.5 + 20 ms: the cache's reads can double a step
    assert not replace(cheap, kv_read_seconds_per_token=None).reads_cheaply(CAPACITY)  # unknown: no
    assert not replace(cheap, step_floor_seconds=None).reads_cheaply(CAPACITY)
    config = LedgerConfig(caps=CapRule(max_model_len=MAX_LEN, ceiling=40), eviction_budget=cheap)

    def ledger_of(capacity: int) -> Ledger:
        ledger = Ledger(config, policy=SessionAware())
        ledger.add_replica("a", now=0.0, capacity_tokens=capacity)
        return ledger

    ledger = ledger_of(CAPACITY)
    assert ledger.cap_of("a") == 40  # the ceiling, where the projection holds a handful of 8k sessions
    for i in range(40):
        arrival = ledger.arrive(Placement(f"s{i}"), now=0.0)
        assert isinstance(arrival, Bound)
        _first(ledger, arrival.session)
    assert isinstance(ledger.arrive(Placement("s40"), now=0.0), Queued)  # the ceiling binds
    assert (ledger_of(2 * CAPACITY).cap_of("a") or 0) < 40  # dear reads: the projection still decides
    ledger.set_operator_limit("a", OperatorLimit(cap=4, quarantined=False, reason=None), now=0.0)
    assert ledger.cap_of("a") == 4  # an operator cap still wins


def test_the_budget_stays_out_of_a_replica_the_operator_caps() -> None:
    ledger = _ledger(budget=EvictionBudgetConfig(window_seconds=WINDOW))
    ledger.set_operator_limit("a", OperatorLimit(cap=4, quarantined=False, reason=None), now=0.0)
    sessions = _fill(ledger)
    assert len(sessions) == 4
    for t in (10.0, 60.0, 120.0):
        for s in sessions:
            _back(ledger, s, now=t, evicted=False)
        ledger.refresh_kv(now=t)
    assert ledger.budget is not None
    assert ledger.budget.scale == 1.0
    assert ledger.cap_of("a") == 4


def test_under_a_budget_eviction_within_it_is_no_quarantine() -> None:
    def evict_one_context(ledger: Ledger) -> bool:
        sessions = _fill(ledger)
        for s in sessions[:2]:  # 2 x 6000 tokens in 10 s: over 4,096, under the budget's 20,000
            _back(ledger, s, now=5.0, evicted=True)
        return ledger.table.replicas["a"].quarantined

    assert evict_one_context(_ledger(quarantine=QuarantineConfig()))  # the projection alone: pressure
    assert not evict_one_context(_ledger(quarantine=QuarantineConfig(), budget=EvictionBudgetConfig()))


def test_the_ledger_feeds_scraped_kv_usage_to_the_budget_except_just_after_a_flush() -> None:
    ledger = _ledger(budget=EvictionBudgetConfig(window_seconds=2 * WINDOW))  # outlasts the 60 s grace
    ledger.add_replica("b", now=0.0, capacity_tokens=CAPACITY)
    assert ledger.budget is not None
    ledger.observe_scrape("a", now=1.0, preemptions_total=0.0, waiting=0.0, kv_usage=0.6)
    ledger.observe_scrape("b", now=1.0, preemptions_total=0.0, waiting=0.0, kv_usage=0.2)
    assert ledger.budget.mean_usage(["a", "b"], 1.0) == pytest.approx(0.4)
    # a weight update flushed b: a drained, reloaded engine reads empty, which says nothing about idle prefixes
    ledger.weights.flushed("b", now=2.0)
    ledger.observe_scrape("b", now=3.0, preemptions_total=0.0, waiting=0.0, kv_usage=0.0)
    assert ledger.budget.mean_usage(["b"], 3.0) == pytest.approx(0.2)
    later = 2.0 + ledger.weights.config.grace_s
    ledger.observe_scrape("b", now=later, preemptions_total=0.0, waiting=0.0, kv_usage=0.0)
    assert ledger.budget.mean_usage(["b"], later) == pytest.approx(0.1)
    ledger.observe_scrape("a", now=later, preemptions_total=0.0, waiting=0.0, kv_usage=None)  # no gauge: nothing
    assert ledger.budget.mean_usage(["a"], later) == pytest.approx(0.6)


def test_the_ledger_feeds_the_inter_token_latency_to_the_budget_except_just_after_a_flush() -> None:
    ledger = _ledger(budget=EvictionBudgetConfig(window_seconds=2 * WINDOW, step_floor_seconds=0.01))
    assert ledger.budget is not None
    ledger.observe_scrape("a", now=1.0, preemptions_total=0.0, waiting=0.0, itl=(0.0, 0.0))
    ledger.observe_scrape("a", now=11.0, preemptions_total=0.0, waiting=0.0, itl=(3.0, 100.0))
    assert ledger.budget.mean_itl("a", 11.0) == pytest.approx(0.03)
    ledger.weights.flushed("a", now=12.0)  # a reloaded engine steps fast with nothing to run: no sign of room
    ledger.observe_scrape("a", now=13.0, preemptions_total=0.0, waiting=0.0, itl=(3.1, 200.0))
    assert ledger.budget.mean_itl("a", 13.0) == pytest.approx(0.03)
    later = 12.0 + ledger.weights.config.grace_s
    ledger.observe_scrape("a", now=later, preemptions_total=0.0, waiting=0.0, itl=(4.0, 300.0))
    assert ledger.budget.mean_itl("a", later) == pytest.approx(4.0 / 300.0)
