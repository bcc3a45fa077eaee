"""Placement policies, the session table and the quarantine state machine (pure)."""

from __future__ import annotations

from collections import Counter

import pytest

from rolloutpool.routing.policies import (
    POLICIES,
    Clairvoyant,
    ConsistentHash,
    LeastInflightSticky,
    Placement,
    RoundRobin,
    SessionAware,
    StickyLeastLoaded,
    make_policy,
)
from rolloutpool.routing.quarantine import PressureState, QuarantineConfig, expected_cached_tokens
from rolloutpool.routing.table import SessionTable


def _table(n: int = 4, cap: int | None = None, kv: int | None = None) -> SessionTable:
    table = SessionTable()
    for i in range(n):
        table.add_replica(f"r{i}", cap=cap, kv_capacity_tokens=kv)
    return table


def test_counts_are_derived_and_never_negative() -> None:
    table = _table(2)
    table.bind("a", "r0", now=0, group="g")
    table.bind("b", "r0", now=0, group="g")
    table.bind("a", "r1", now=1, group="g")  # moving a session does not double count
    assert (table.replicas["r0"].live, table.replicas["r1"].live) == (1, 1)
    assert table.group_replicas("g") == {"r0": 1, "r1": 1}
    assert table.release("a") is not None
    assert table.release("a") is None  # double release: no-op, not a negative count
    assert table.release("nope") is None
    assert (table.replicas["r0"].live, table.replicas["r1"].live) == (1, 0)
    assert table.group_replicas("g") == {"r0": 1}


def test_idle_expiry_and_replica_loss() -> None:
    table = _table(2)
    table.bind("a", "r0", now=0)
    table.bind("b", "r1", now=50)
    assert [s.session_id for s in table.expire(now=100, idle_timeout=60)] == ["a"]
    assert table.remove_replica("r1") == ["b"]
    assert table.lookup("b") is None
    assert table.remove_replica("r1") == []


def test_consistent_hash_is_stable_and_uses_every_replica() -> None:
    table = _table(8)
    policy = ConsistentHash()
    picks = {f"s{i}": policy.choose(Placement(f"s{i}"), table) for i in range(2000)}
    assert picks == {f"s{i}": policy.choose(Placement(f"s{i}"), table) for i in range(2000)}
    counts = Counter(picks.values())
    assert len(counts) == 8
    # uniform only in expectation: with 160 virtual nodes the skew is real but bounded
    assert max(counts.values()) / min(counts.values()) < 2.0
    # removing a replica only moves the sessions it held
    table.replicas["r3"].ready = False
    moved = [s for s, r in picks.items() if r != "r3" and policy.choose(Placement(s), table) != r]
    assert moved == []


def test_round_robin_ignores_sessions() -> None:
    table = _table(3)
    policy = RoundRobin()
    assert [policy.choose(Placement("same"), table) for _ in range(4)] == ["r0", "r1", "r2", "r0"]


def test_least_inflight_and_sticky_least_loaded() -> None:
    table = _table(3)
    table.replicas["r0"].inflight = 2
    table.replicas["r1"].inflight = 1
    table.replicas["r2"].inflight = 5
    assert LeastInflightSticky().choose(Placement("x"), table) == "r1"
    table.bind("a", "r0", now=0)
    table.bind("b", "r1", now=0)
    assert StickyLeastLoaded().choose(Placement("x"), table) == "r2"


def test_session_aware_respects_caps_quarantine_and_queues() -> None:
    table = _table(3, cap=2)
    policy = SessionAware(co_locate_groups=False)
    placed = []
    for i in range(6):
        replica = policy.choose(Placement(f"s{i}"), table)
        assert replica is not None
        table.bind(f"s{i}", replica, now=0)
        placed.append(replica)
    assert Counter(placed) == {"r0": 2, "r1": 2, "r2": 2}  # least-loaded spreads evenly
    assert policy.choose(Placement("s6"), table) is None  # every replica at its cap: queue
    table.release("s0")
    table.replicas["r0"].quarantined = True
    assert policy.choose(Placement("s6"), table) is None  # the free slot is quarantined
    table.replicas["r0"].quarantined = False
    assert policy.choose(Placement("s6"), table) == "r0"


def test_session_aware_co_locates_a_group_while_it_fits() -> None:
    table = _table(3, cap=3)
    policy = SessionAware()
    first = policy.choose(Placement("a", group="g"), table)
    assert first is not None
    table.bind("a", first, now=0, group="g")
    table.bind("other1", "r1", now=0)
    table.bind("other2", "r2", now=0)
    assert policy.choose(Placement("b", group="g"), table) == first
    table.bind("b", first, now=0, group="g")
    table.bind("c", first, now=0, group="g")
    # the group's replica is full: the next member goes elsewhere
    assert policy.choose(Placement("d", group="g"), table) != first


def test_co_location_yields_to_balance_beyond_the_slack() -> None:
    """A GRPO group of 16 on an underloaded fleet: packing it on one replica unbalances decode batches."""
    placed: dict[int | None, Counter[str]] = {}
    for slack in (2, None):
        table = _table(4, cap=100)
        policy = SessionAware(balance_slack=slack)
        for i in range(16):
            replica = policy.choose(Placement(f"m{i}", group="g"), table)
            assert replica is not None
            table.bind(f"m{i}", replica, now=0, group="g")
        placed[slack] = Counter(r.name for r in table.replicas.values() for _ in r.sessions)
    assert max(placed[2].values()) - min(placed[2].values()) <= 3  # within the slack (+1 for the member placed)
    assert max(placed[2].values()) >= 3  # ...but still in chunks that share the group's prompt
    assert placed[None] == {"r0": 16}  # without a slack the whole group packs onto one replica
    tie = _table(4, cap=100)
    default = SessionAware()  # slack 0: the group breaks ties among the least loaded
    for i in range(16):
        replica = default.choose(Placement(f"m{i}", group="g"), tie)
        assert replica is not None
        tie.bind(f"m{i}", replica, now=0, group="g")
    assert sorted(len(r.sessions) for r in tie.replicas.values()) == [4, 4, 4, 4]


def test_clairvoyant_packs_by_projected_tokens() -> None:
    table = _table(2, kv=10_000)
    policy = Clairvoyant(headroom=0.0)
    assert policy.choose(Placement("a", projected_tokens=8000, prompt_tokens=2000), table) == "r0"
    table.bind("a", "r0", now=0, projected_tokens=8000, prompt_tokens=2000)  # holds ~5000
    assert policy.choose(Placement("b", projected_tokens=8000, prompt_tokens=2000), table) == "r1"
    table.bind("b", "r1", now=0, projected_tokens=8000, prompt_tokens=2000)
    assert policy.choose(Placement("c", projected_tokens=6000, prompt_tokens=2000), table) == "r0"
    table.bind("c", "r0", now=0, projected_tokens=6000, prompt_tokens=2000)
    assert policy.choose(Placement("d", projected_tokens=9000, prompt_tokens=3000), table) is None


def test_make_policy() -> None:
    assert [make_policy(n).name for n in POLICIES] == list(POLICIES)
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("random")


def test_expected_cached_tokens_follows_vllm_rounding() -> None:
    assert expected_cached_tokens(previous_context=1000, prompt_tokens=1800) == 992
    assert expected_cached_tokens(previous_context=1000, prompt_tokens=1000) == 992  # prompt-1 limit
    assert expected_cached_tokens(previous_context=0, prompt_tokens=500) == 0


def test_quarantine_on_live_eviction_with_hysteresis_and_lift_on_finish() -> None:
    state = PressureState(QuarantineConfig(hold_seconds=10))
    assert state.observe_response(now=0, expected_cached=4000, cached=3990) == 10
    assert not state.quarantined  # a few tokens short is noise
    assert state.observe_response(now=1, expected_cached=8000, cached=512) == 7488
    assert state.quarantined  # one long context's worth within the window
    assert state.reason == "Evicting"
    state.observe_scrape(now=5, preemptions_total=0, waiting=0)
    assert state.quarantined  # held for 10 s after the last pressure
    state.observe_scrape(now=12, preemptions_total=0, waiting=0)
    assert not state.quarantined
    state.observe_scrape(now=13, preemptions_total=3, waiting=0)
    assert state.quarantined
    assert state.reason == "Preempting"
    state.session_finished()
    assert not state.quarantined
    assert state.quarantines == 2


def test_short_evictions_quarantine_only_when_they_add_up_within_the_window() -> None:
    state = PressureState(QuarantineConfig(min_window_tokens=4096, window_seconds=10))
    for t in range(0, 60, 6):  # a 1,000-token prefix lost every 6 s: LRU churn, not pressure
        assert state.observe_response(now=t, expected_cached=1024, cached=0) == 1024
    assert not state.quarantined
    for t in (60.0, 61.0, 62.0):  # four within 10 s: 4,096 tokens re-prefilled
        state.observe_response(now=t, expected_cached=1024, cached=0)
    assert state.quarantined
    assert state.reason == "Evicting"


def test_a_queue_with_free_kv_blocks_is_not_pressure() -> None:
    state = PressureState(QuarantineConfig(waiting_scrapes=3, queue_kv_usage=0.9))
    for t in range(6):  # requests wait for compute (or max_num_seqs) while blocks are free
        state.observe_scrape(now=t, preemptions_total=0, waiting=4, kv_usage=0.4)
    assert not state.quarantined
    for t in range(6, 9):
        state.observe_scrape(now=t, preemptions_total=0, waiting=4, kv_usage=0.97)
    assert state.quarantined
    assert state.reason == "Queueing"


def test_quarantine_on_persistent_queue_only() -> None:
    state = PressureState(QuarantineConfig(waiting_scrapes=3))
    for t, waiting in enumerate([1, 1, 0, 1, 1]):
        state.observe_scrape(now=t, preemptions_total=0, waiting=waiting)
    assert not state.quarantined
    state.observe_scrape(now=6, preemptions_total=0, waiting=2)
    assert state.quarantined
    assert state.reason == "Queueing"
