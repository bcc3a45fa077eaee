"""``rolloutpool bench --simulate``: the simulator on a bench run's fleet, and the command around it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from rolloutpool.cli.bench import bench_command
from rolloutpool.dev.bench.config import BenchConfig, describe, scaled_scenario
from rolloutpool.dev.bench.peers import RouterLaunch, our_router_argv
from rolloutpool.dev.bench.simulated import fleet_config, simulate_bench
from rolloutpool.sim.fleet import simulate_policy
from rolloutpool.sim.workload import scenario


def _config(**kw: object) -> BenchConfig:
    base = scaled_scenario(scenario("agentic-grpo"), context_scale=0.25, max_model_len=8192)
    return BenchConfig(scenario=base, routers=(), **kw)  # type: ignore[arg-type]


def test_the_simulated_fleet_is_the_bench_fleet() -> None:
    config = _config(replicas=3, kv_capacity_tokens=32768, time_scale=4.0, duration_s=30.0, load=2.0, seed=7)
    fleet = fleet_config(config)
    assert fleet.replicas == 3
    assert fleet.num_gpu_blocks == 2048
    assert fleet.in_flight == 2 * 3 * (32768 // 8192) == config.resolved_in_flight
    assert fleet.duration_s == 120.0  # the wall window times the time scale
    assert fleet.seed == 7
    assert fleet.scenario is config.scenario
    assert fleet.scrape_interval_s == config.scrape_interval_s * 4.0  # the router's scrapes, in simulated seconds
    assert fleet.start_spread_s == 0.0  # the bench's client starts every trajectory at once
    assert not fleet.group_hint  # the bench's client sends session ids only, as vllm-router's clients
    assert fleet_config(_config(group_hint=True)).group_hint  # --group-hint: the simulated router is told too
    assert describe(_config(group_hint=True))["group_hint"] is True
    assert fleet.renew_every_s is None  # renewal off, as the router's default
    assert fleet_config(_config(renew_every_s=2.0)).renew_every_s == 2.0  # engine seconds, as the bench's option


def test_renewal_reaches_our_router_in_wall_seconds() -> None:
    launch = RouterLaunch(replica_urls=("http://127.0.0.1:1",), port=2, kv_capacity_tokens=8192, max_model_len=2048,
                          time_scale=4.0, scrape_interval_s=0.5, queue_timeout_s=60.0)  # fmt: skip
    assert "--renew-every" not in our_router_argv(launch, prefix=["rolloutpool"])
    argv = our_router_argv(replace(launch, renew_every_s=0.5), prefix=["rolloutpool"])
    assert argv[argv.index("--renew-every") + 1] == "0.5"


def test_routers_without_a_model_are_named_and_the_baseline_always_runs() -> None:
    config = _config(time_scale=4.0, duration_s=20.0, load=1.0)
    runs, missing = simulate_bench(config, ["rolloutpool", "vllm-program", "vllm-cache-aware"])
    assert [r.router for r in runs] == ["vllm-sticky-least-loaded", "rolloutpool", "no-eviction bound"]
    assert (runs[-1].evicted_share, runs[-1].policy) == (0.0, "sticky-least-loaded")  # every session stays resident
    assert missing == ["vllm-program", "vllm-cache-aware"]
    baseline = simulate_policy(fleet_config(config), "sticky-least-loaded")  # deterministic: the same run again
    assert (runs[0].tokens_per_s, runs[0].completed, runs[0].vs_baseline) == (
        baseline.tokens_per_s,
        baseline.completed,
        1.0,
    )
    assert runs[0].evicted_share == baseline.reprefilled_tokens / baseline.prefilled_tokens  # every cause, as the bench
    ours = simulate_policy(fleet_config(config), "rolloutpool")
    assert runs[1].tokens_per_s == ours.tokens_per_s > 0
    assert runs[1].vs_baseline == pytest.approx(ours.tokens_per_s / baseline.tokens_per_s)


def test_bench_simulate_starts_no_process_and_writes_the_table(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        bench_command,
        [
            "--simulate", "--load", "1", "--duration", "20", "--router", "rolloutpool-adaptive",
            "--router", "vllm-program", "--vllm-router-bin", str(tmp_path / "absent"), "--out", str(tmp_path),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = (tmp_path / "simulated.md").read_text()
    assert "## agentic-grpo 1x: 32 in flight, seed 0" in text
    assert "| rolloutpool-adaptive | rolloutpool-adaptive |" in text
    assert "| vllm-sticky-least-loaded | sticky-least-loaded |" in text
    assert "Not modelled by the simulator: vllm-program." in text
    assert not (tmp_path / "bench.json").exists()


def test_the_simulators_law_starts_each_replica_at_the_routers_target() -> None:
    config = fleet_config(_config(time_scale=4.0, duration_s=60.0, load=3.0))
    result = simulate_policy(config, "rolloutpool-adaptive")
    first = [p for p in result.control if p.t == result.control[0].t]
    assert first
    assert all(0.5 <= p.target <= 1.0 for p in first)
    assert result.mean_target is not None
