"""The simulator's weight-update scenario: pause, flush, resume every N simulated minutes, and no false alarms."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rolloutpool.sim.config import ADAPTIVE, FleetConfig
from rolloutpool.sim.fleet import simulate_policy
from rolloutpool.sim.runner import fleet_floor
from rolloutpool.sim.weights import WeightUpdateConfig, law_cuts_after_flushes
from rolloutpool.sim.workload import scenario


def _config(load: float, updates: WeightUpdateConfig | None) -> FleetConfig:
    base = FleetConfig(scenario=scenario("agentic-grpo"), in_flight=1, replicas=2, duration_s=1500.0, seed=3)
    return replace(base, in_flight=round(load * fleet_floor(base)), weight_updates=updates)


@pytest.mark.parametrize("policy", ["rolloutpool", ADAPTIVE, "sticky-least-loaded"])
def test_announced_updates_flush_every_cache_and_raise_no_false_alarm(policy: str) -> None:
    result = simulate_policy(_config(2.0, WeightUpdateConfig(every_s=300.0, load_s=20.0)), policy)
    assert result.weight_updates == 5  # at 300, 600, ..., 1500 s
    assert result.update_reprefill_tokens is not None
    assert result.update_reprefill_tokens > 0  # every live session re-prefilled after each flush ...
    assert result.update_false_evicted_tokens == 0  # ... and none of it counted as eviction
    assert result.update_false_quarantines == 0
    if policy == ADAPTIVE:
        assert result.update_law_cuts == 0
    assert result.completed > 0


def test_unannounced_updates_show_what_they_would_cost() -> None:
    result = simulate_policy(_config(2.0, WeightUpdateConfig(every_s=300.0, load_s=20.0, excuse=False)), "rolloutpool")
    assert result.update_false_evicted_tokens is not None
    assert result.update_reprefill_tokens is not None
    # every flushed prefix the router still kept reads as eviction; those it had let go re-prefill as planned
    assert 0 < result.update_false_evicted_tokens <= result.update_reprefill_tokens
    assert result.update_false_quarantines is not None
    assert result.update_false_quarantines > 0


def test_without_the_scenario_nothing_changes() -> None:
    result = simulate_policy(_config(1.0, None), "rolloutpool")
    assert result.weight_updates is None
    assert result.update_reprefill_tokens is None


def test_bad_scenario_settings_are_errors() -> None:
    with pytest.raises(ValueError, match="every_s"):
        WeightUpdateConfig(every_s=0)


def test_law_cuts_after_flushes() -> None:
    points = [(0.0, "a", 10, None), (100.0, "a", 9, "Queueing"), (400.0, "a", 8, "Queueing"), (410.0, "a", 8, None)]
    assert law_cuts_after_flushes(points, [90.0], window_s=120.0) == 1
    eviction = [(0.0, "a", 10, None), (100.0, "a", 9, "LivePrefixEviction")]
    assert law_cuts_after_flushes(eviction, [90.0], window_s=120.0) == 0
    assert law_cuts_after_flushes(points, [], window_s=120.0) == 0
    held = [(0.0, "a", 10, None), (100.0, "a", 10, "WeightUpdate")]
    assert law_cuts_after_flushes(held, [90.0], window_s=120.0) == 0
