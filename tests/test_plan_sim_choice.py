"""``plan --simulate``'s pure decisions: the caps tried per fleet size, the recommended fleet and cap, the spec."""

from __future__ import annotations

import pytest

from rolloutpool.capacity import oversubscribed_cap
from rolloutpool.planner import residency_for_cap
from rolloutpool.sim.plan_choice import FleetPoint, choose_fleet, coarse_caps, fleet_point, refine_caps
from rolloutpool.sim.plan_sim import replica_counts


def test_coarse_caps_run_from_the_floor_to_past_the_rollouts_per_replica() -> None:
    caps = coarse_caps(floor=11, in_flight=352, replicas=4, points=5)
    assert caps[0] == 11
    assert caps[-1] == 90  # 88 per replica + 2: the cap no longer binds
    assert caps == [11, 19, 31, 53, 90]  # geometric: as many caps near the floor as near the top
    assert coarse_caps(floor=11, in_flight=256, replicas=1, points=5) == [11, 24, 53, 117, 258]
    assert coarse_caps(floor=11, in_flight=8, replicas=4, points=5) == [11, 12]  # under the floor: nothing binds


def test_refine_fills_halfway_to_the_best_caps_neighbours() -> None:
    fixed = {11: 100.0, 31: 180.0, 51: 200.0, 71: 150.0, 90: 150.0}
    assert refine_caps(fixed, floor=11) == [41, 61]
    assert refine_caps({11: 5.0, 12: 9.0}, floor=11) == []  # neighbours already adjacent
    assert refine_caps({}, floor=11) == []


def test_fleet_point_takes_the_best_cap_and_its_plateau() -> None:
    p = fleet_point(replicas=2, in_flight=100, floor=10, fixed={10: 50.0, 30: 99.5, 52: 100.0, 40: 100.0},
                    adaptive=(98.0, 0.88), uncapped=90.0)  # fmt: skip
    assert (p.best_cap, p.tokens_per_s, p.plateau_cap) == (40, 100.0, 30)  # a tie goes to the smaller cap
    assert p.tokens_per_s_per_replica == 50.0
    assert (p.adaptive_tokens_per_s, p.adaptive_mean_target, p.uncapped_tokens_per_s) == (98.0, 0.88, 90.0)
    assert list(p.fixed) == [10, 30, 40, 52]
    with pytest.raises(ValueError, match="no fixed-cap run"):
        fleet_point(replicas=2, in_flight=100, floor=10, fixed={})


def _point(replicas: int, tokens_per_s: float, cap: int = 20) -> FleetPoint:
    return fleet_point(replicas=replicas, in_flight=64, floor=10, fixed={cap: tokens_per_s})


def test_the_fewest_replicas_reaching_the_target_win() -> None:
    points = [_point(8, 1000.0, 12), _point(1, 300.0, 66), _point(2, 560.0, 34), _point(4, 920.0, 18)]
    knee = choose_fleet(points, target_tokens_per_s=None, knee=0.9)
    assert (knee.replicas, knee.cap, knee.met, knee.target_tokens_per_s) == (4, 18, True, 900.0)
    assert "0.9 x the best fleet's 1,000 tok/s (8 replicas)" in knee.target
    asked = choose_fleet(points, target_tokens_per_s=500.0, knee=0.9)
    assert (asked.replicas, asked.cap, asked.met) == (2, 34, True)
    assert choose_fleet(points, target_tokens_per_s=300.0, knee=0.9).replicas == 1


def test_an_unreachable_target_returns_the_fastest_fleet_as_missed() -> None:
    points = [_point(1, 300.0), _point(2, 560.0)]
    choice = choose_fleet(points, target_tokens_per_s=5000.0, knee=0.9)
    assert (choice.replicas, choice.met, choice.tokens_per_s) == (2, False, 560.0)
    with pytest.raises(ValueError, match="no fleet"):
        choose_fleet([], target_tokens_per_s=None, knee=0.9)


def test_replica_counts_double_up_to_the_maximum() -> None:
    assert replica_counts(8) == (1, 2, 4, 8)
    assert replica_counts(6) == (1, 2, 4, 6)
    assert replica_counts(1) == (1,)


@pytest.mark.parametrize("cap", [11, 12, 20, 47, 90, 200, 345])
@pytest.mark.parametrize("headroom", [0.0, 0.1, 0.3])
def test_residency_for_cap_gives_a_pool_cap_of_at_least_the_cap(cap: int, headroom: float) -> None:
    capacity = 378_368
    residency = residency_for_cap(cap=cap, capacity_tokens=capacity, max_model_len=32768, headroom=headroom)
    assert 0.01 <= residency <= 1.0
    assert oversubscribed_cap(capacity_tokens=capacity, max_model_len=32768, expected_residency=residency,
                              headroom=headroom) >= cap  # fmt: skip
    if residency < 1.0:  # the largest such residency: 0.01 more gives a smaller cap
        assert oversubscribed_cap(capacity_tokens=capacity, max_model_len=32768,
                                  expected_residency=round(residency + 0.01, 2), headroom=headroom) < cap  # fmt: skip


def test_residency_for_cap_refuses_a_cap_below_the_floor_or_beyond_reach() -> None:
    with pytest.raises(ValueError, match="below the conservative floor of 11"):
        residency_for_cap(cap=10, capacity_tokens=378_368, max_model_len=32768, headroom=0.1)
    with pytest.raises(ValueError, match=r"below 0\.01"):
        residency_for_cap(cap=5000, capacity_tokens=378_368, max_model_len=32768, headroom=0.1)
