"""Workload generator and fleet simulator: determinism, invariants, and the known effects."""

from __future__ import annotations

import pytest

from rolloutpool.routing.policies import POLICIES
from rolloutpool.sim.fleet import FleetConfig, simulate_policy
from rolloutpool.sim.runner import fleet_floor, plan_jobs
from rolloutpool.sim.workload import SCENARIOS, Lognormal, TrajectorySource, scenario


def test_lognormal_matches_its_median_and_p90() -> None:
    import numpy as np  # noqa: PLC0415

    dist = Lognormal(2.0, 15.0)
    draws = dist.draw(np.random.default_rng(1), 200_000)
    assert np.median(draws) == pytest.approx(2.0, rel=0.02)
    assert np.percentile(draws, 90) == pytest.approx(15.0, rel=0.03)
    with pytest.raises(ValueError, match="median"):
        Lognormal(5, 1)


def test_trajectories_are_seeded_and_grouped() -> None:
    s = scenario("agentic-grpo")
    a, b = TrajectorySource(s, 7), TrajectorySource(s, 7)
    first = [a.next() for _ in range(40)]
    assert first == [b.next() for _ in range(40)]
    assert first != [TrajectorySource(s, 8).next() for _ in range(40)]
    assert {t.group for t in first[:16]} == {0}
    assert len({t.prompt_tokens for t in first[:16]}) == 1  # a group shares its prompt
    assert all(t.final_context(s.max_model_len) <= s.max_model_len for t in first)


def test_named_scenarios_and_unknown_name() -> None:
    assert {"agentic-grpo", "tool-chat", "high-pressure"} <= set(SCENARIOS)
    with pytest.raises(ValueError, match="unknown scenario"):
        scenario("nope")


def test_the_128k_agentic_scenario_runs_long_horizons_at_long_contexts() -> None:
    """Like vLLM's AgentX traces (DESIGN section 6): tens of turns, ~444-token outputs, contexts filling 128K."""
    import statistics  # noqa: PLC0415

    s = scenario("agentic-128k")
    assert s.max_model_len == 131_072
    source = TrajectorySource(s, 0)
    inputs, outputs, turns, at_limit = [], [], [], 0
    for _ in range(500):
        plan = source.next()
        context, served = plan.prompt_tokens, 0
        for i, action in enumerate(plan.actions):  # what the fleet sends: it ends a rollout at maxModelLen
            inputs.append(context)
            outputs.append(action)
            served += 1
            context += action
            if i + 1 == plan.turns or context + plan.observations[i] >= s.max_model_len - 1:
                break
            context += plan.observations[i]
        at_limit += plan.final_context(s.max_model_len) >= 100_000
        turns.append(served)
    assert statistics.median(turns) >= 30  # tens of turns (43 drawn; the window ends about half first)
    assert statistics.median(outputs) == pytest.approx(444, rel=0.05)
    assert statistics.median(inputs) > 70_000  # prefill attention dominates re-prefill there
    assert at_limit > 250
    # the H100 preset holds two such contexts per replica, no more: the conservative floor is tight
    one = FleetConfig(scenario=s, in_flight=1, replicas=1)
    assert fleet_floor(one) == 2
    result = simulate_policy(FleetConfig(scenario=s, in_flight=6, replicas=1, duration_s=600), "sticky-least-loaded")
    assert result.generated_tokens > 0


def _small(in_flight: int, **kw) -> FleetConfig:
    return FleetConfig(
        scenario=scenario("tool-chat"), in_flight=in_flight, replicas=2, num_gpu_blocks=4000,
        duration_s=300, sample_interval_s=10, **kw,
    )  # fmt: skip


def test_every_policy_runs_and_is_deterministic() -> None:
    config = _small(12)
    for policy in POLICIES:
        first = simulate_policy(config, policy)
        assert first.generated_tokens > 0
        assert first.completed > 0
        assert first.row() == simulate_policy(config, policy).row()


def test_a_fixed_cap_at_the_floor_bounds_live_sessions_and_never_evicts() -> None:
    floor = fleet_floor(_small(1)) // 2
    result = simulate_policy(_small(40, fixed_cap=floor), "rolloutpool")  # the session-count cap, no turn scheduling
    assert result.cap == floor
    assert result.max_live_per_replica <= floor
    assert result.evicted_reprefill_tokens == 0
    assert result.preemptions == 0


def test_uncapped_hashing_re_prefills_more_than_ours() -> None:
    config = _small(40)
    ours = simulate_policy(config, "rolloutpool")
    hashed = simulate_policy(config, "consistent-hash")
    assert hashed.reprefilled_tokens > ours.reprefilled_tokens


def test_turn_scheduling_serves_past_the_floor_cap_on_short_contexts_and_reports_no_single_cap() -> None:
    floor = fleet_floor(_small(1)) // 2
    fixed = simulate_policy(_small(40, fixed_cap=floor), "rolloutpool")
    turns = simulate_policy(_small(40), "rolloutpool")
    assert turns.cap is None  # the working set decides per turn, not a count
    assert fixed.cap == floor
    assert turns.max_live_per_replica > floor  # tool-chat's ~4k contexts fit far past the worst-case floor
    assert turns.generated_tokens > fixed.generated_tokens


def test_plan_jobs_scales_in_flight_with_the_floor() -> None:
    base = _small(1)
    jobs = plan_jobs(base, [0.5, 2.0], ["rolloutpool"])
    floor = fleet_floor(base)
    assert [j.config.in_flight for j in jobs] == [round(0.5 * floor), 2 * floor]
