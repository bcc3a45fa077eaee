"""The control law inside the simulator: signals as scraped, caps applied, churn is no pressure."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner

from rolloutpool.autoscale import LawParams
from rolloutpool.cli import main
from rolloutpool.sim.config import ADAPTIVE, FleetConfig
from rolloutpool.sim.fleet import simulate_policy
from rolloutpool.sim.sweep import cap_grid, run_key, run_sweep, sweep_points
from rolloutpool.sim.workload import TrajectorySource, scenario


def _churn_config(**kw: object) -> FleetConfig:
    """Few live sessions on roomy replicas, many short trajectories: the cache fills with finished sessions."""
    return FleetConfig(
        scenario=scenario("tool-chat").with_(max_model_len=8192), in_flight=8, replicas=2, num_gpu_blocks=6000,
        duration_s=1500, sample_interval_s=30, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_finished_session_churn_alone_triggers_no_quarantine_and_no_cut() -> None:
    for policy in ("rolloutpool", ADAPTIVE):
        result = simulate_policy(_churn_config(), policy)
        assert result.completed > 100
        assert result.cache_evicted_blocks > 10 * 6000  # finished sessions' blocks evicted, many pools' worth
        assert result.evicted_reprefill_tokens == 0  # no live session lost its prefix
        assert result.quarantines == 0
        if policy == ADAPTIVE:
            assert result.law_quarantines == 0
            assert result.law_cuts == 0


def test_live_prefix_eviction_cuts_the_adaptive_target() -> None:
    # oversubscribed: long contexts on small replicas, the working set allowed the whole cache, each group's prompt
    # counted once (the group hint): the law must cut
    config = FleetConfig(
        scenario=scenario("agentic-grpo").with_(max_model_len=8192), in_flight=40, replicas=2, num_gpu_blocks=2000,
        duration_s=1800, law=LawParams(initial=1.0, minimum=0.5, maximum=1.0, reprefill_tokens_per_s=200.0),
        group_hint=True,
    )  # fmt: skip
    result = simulate_policy(config, ADAPTIVE)
    assert result.evicted_reprefill_tokens > 0
    assert result.law_cuts is not None
    assert result.law_cuts > 0
    targets = [p.target for p in result.control]
    assert min(targets) >= 0.5
    assert max(targets) <= 1.0
    assert result.mean_target is not None
    assert 0.5 <= result.mean_target < 1.0


def test_adaptive_runs_are_deterministic_and_follow_the_control_interval() -> None:
    config = replace(_churn_config(), duration_s=300, control_interval_s=30.0)
    a, b = simulate_policy(config, ADAPTIVE), simulate_policy(config, ADAPTIVE)
    assert a.row() == b.row()
    assert a.control == b.control
    times = sorted({p.t for p in a.control})
    assert times == [30.0 * i for i in range(1, 11)]
    assert a.policy == ADAPTIVE
    assert a.cap is None  # no fixed cap


def test_policy_drift_grows_trajectories_only_after_its_start() -> None:
    drift = scenario("policy-drift")
    early, late = TrajectorySource(drift, 3), TrajectorySource(drift, 3)
    before = [early.next(now=0.0) for _ in range(20)]
    after = [late.next(now=drift.drift_start_s + drift.drift_duration_s) for _ in range(20)]
    plain = TrajectorySource(scenario("agentic-grpo"), 3)
    assert before == [plain.next() for _ in range(20)]
    ratio = sum(sum(t.actions) + sum(t.observations) for t in after) / sum(
        sum(t.actions) + sum(t.observations) for t in before
    )
    assert abs(ratio - 1.5) < 0.01
    assert drift.length_scale(drift.drift_start_s + drift.drift_duration_s / 2) == 1.25


def test_cap_grid_and_sweep_pick_the_best_fixed_cap() -> None:
    assert cap_grid(floor=11, per_replica=22, step=4) == [11, 15, 19, 23, 24]
    assert cap_grid(floor=11, per_replica=11, step=4) == [11, 15]
    base = FleetConfig(
        scenario=scenario("tool-chat"), in_flight=1, replicas=2, num_gpu_blocks=4000, duration_s=200,
        sample_interval_s=50,
    )  # fmt: skip
    done: list[object] = []
    runs = run_sweep(
        base=base, scenarios=["tool-chat"], loads=[2.0], step=2, workers=1, cache={}, durations={},
        on_done=lambda *a: done.append(a),
    )  # fmt: skip
    assert run_key("tool-chat", 2.0, None, 200, 0) in runs
    (point,) = sweep_points(runs)
    assert point.best_tokens_per_s == max(point.fixed.values())
    assert point.fixed[point.best_cap] == point.best_tokens_per_s
    assert point.ratio == point.adaptive_tokens_per_s / point.best_tokens_per_s
    assert len(done) == len(runs)
    again = run_sweep(
        base=base, scenarios=["tool-chat"], loads=[2.0], step=2, workers=1, cache=runs, durations={},
        on_done=lambda *a: done.append(a),
    )  # fmt: skip
    assert again == runs  # every run came from the cache
    assert len(done) == len(runs)


def test_simulate_caps_command_writes_outputs_and_reuses_its_cache(tmp_path: Path) -> None:
    args = ["simulate-caps", "--scenario", "tool-chat", "--load", "1.5", "--replicas", "2", "--duration", "60",
            "--step", "8", "--workers", "1", "--out", str(tmp_path)]  # fmt: skip
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "Finished tool-chat" in first.output
    data = json.loads((tmp_path / "sweep.json").read_text())
    (point,) = data["points"]
    assert point["ratio"] == point["adaptive_tokens_per_s"] / point["best_tokens_per_s"]
    assert (tmp_path / "sweep.md").read_text().startswith("| scenario |")
    assert (tmp_path / "caps_throughput_vs_cap.png").stat().st_size > 0
    assert (tmp_path / "target_over_time_tool-chat_1.5x.png").stat().st_size > 0
    again = CliRunner().invoke(main, [*args, "--no-plots"])
    assert again.exit_code == 0, again.output
    assert "Finished" not in again.output  # every run came from the cache
    assert json.loads((tmp_path / "sweep.json").read_text())["runs"] == data["runs"]
