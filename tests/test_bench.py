"""``rolloutpool bench``: accounting (pure), peer configuration, a tiny end-to-end run, the RL example."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rolloutpool.dev.bench.client import observation_text, prompt_text, reprefilled_tokens
from rolloutpool.dev.bench.config import BenchConfig, BenchResult, scaled_scenario
from rolloutpool.dev.bench.overhead import DIRECT, OverheadConfig, percentile
from rolloutpool.dev.bench.peers import OURS, RouterLaunch, our_router_argv, program_scheduling_config, vllm_router_argv
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.bench.report import markdown, result_json
from rolloutpool.dev.bench.runner import metric_totals, run_bench
from rolloutpool.dev.net import free_port
from rolloutpool.dev.processes import pid_alive
from rolloutpool.engine.model.cost import CostModel
from rolloutpool.engine.model.tokenizer import render_chat, tokenize
from rolloutpool.sim.workload import scenario

ROOT = Path(__file__).resolve().parents[1]
VLLM_ROUTER = shutil.which("vllm-router") or shutil.which("vllm-router", path=str(Path(sys.executable).parent))


# -- accounting (pure) -------------------------------------------------------------------


def test_first_turn_never_counts_as_reprefill() -> None:
    assert reprefilled_tokens(previous_context=None, prompt_tokens=5000, cached_tokens=0) == 0


def test_full_hit_is_no_reprefill_and_the_last_partial_block_is_never_expected() -> None:
    # previous turn: prompt 1000 + completion 101 -> context 1100; whole blocks: 1088
    assert reprefilled_tokens(previous_context=1100, prompt_tokens=1500, cached_tokens=1088) == 0
    # a longer hit than expected (e.g. a shared group prompt) is never negative
    assert reprefilled_tokens(previous_context=100, prompt_tokens=1500, cached_tokens=1488) == 0


def test_shortfall_against_the_previous_context_is_reprefill() -> None:
    assert reprefilled_tokens(previous_context=1100, prompt_tokens=1500, cached_tokens=496) == 1088 - 496
    assert reprefilled_tokens(previous_context=1100, prompt_tokens=1500, cached_tokens=0) == 1088


def test_expected_cached_is_capped_by_what_vllm_can_report_for_the_prompt() -> None:
    # the prompt is shorter than the previous context: at most (prompt - 1) whole blocks
    assert reprefilled_tokens(previous_context=4000, prompt_tokens=100, cached_tokens=0) == 96
    assert reprefilled_tokens(previous_context=4000, prompt_tokens=100, cached_tokens=0, block_size=32) == 96


def test_synthetic_texts_have_the_drawn_token_counts() -> None:
    first = [{"role": "user", "content": prompt_text(3, 200)}]
    assert len(tokenize(render_chat(first))) == 200
    reply = " lopa sime"
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": observation_text(7, 0, 50)}]
    assert len(tokenize(render_chat(second))) == 200 + 2 + 50
    assert observation_text(7, 0, 50) != observation_text(8, 0, 50)


def test_metric_totals_sum_label_sets_and_ignore_other_series() -> None:
    text = "\n".join(
        [
            "# HELP vllm:generation_tokens_total x",
            'vllm:generation_tokens_total{engine="0",model_name="m"} 10.0',
            'vllm:generation_tokens_total{engine="1",model_name="m"} 5.0',
            'vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9',
            "vllm:num_preemptions_total 2",
        ]
    )
    totals = metric_totals(text)
    assert totals["vllm:generation_tokens_total"] == 15.0
    assert totals["vllm:num_preemptions_total"] == 2.0
    assert totals["vllm:prefix_cache_hits_total"] == 0.0


def test_percentile_nearest_rank() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile(list(map(float, range(1, 101))), 0.99) == 99.0
    assert percentile([], 0.5) != percentile([], 0.5)  # NaN


# -- peers ----------------------------------------------------------------------------------


def test_program_scheduling_is_calibrated_to_engine_sim_in_wall_seconds() -> None:
    cost = CostModel()
    slow = program_scheduling_config(
        kv_capacity_tokens=65536,
        time_scale=1.0,
        metrics_interval_s=0.5,
        queue_timeout_s=600,
        typical_prefill_tokens=1000,
    )
    fast = program_scheduling_config(
        kv_capacity_tokens=65536,
        time_scale=10.0,
        metrics_interval_s=0.5,
        queue_timeout_s=600,
        typical_prefill_tokens=1000,
    )
    assert slow["program_scheduling_enable_key"] == "auto"
    assert slow["token_capacity_per_target"] == 65536
    assert slow["binding_strategy"] == "least_program_count"
    assert slow["global_queue"] is True
    fixed = cost.fixed_step_seconds
    decode = slow["decode_throughput_model"]
    assert decode["fixed_step_seconds"] == pytest.approx(fixed)
    # one decode step of 4 requests with 4000 context tokens each: the model's step time
    modelled = decode["fixed_step_seconds"] + 4 * decode["batch_step_seconds_per_request"]
    modelled += 16000 * decode["context_step_seconds_per_token"]
    assert modelled == pytest.approx(cost.step_seconds(decode_tokens=4, kv_tokens_read=16000))
    prefill = slow["prefill_cost_model"]
    for n in (2000, 8000):  # a lone prompt in one chunk, attention included: vllm-router's quadratic
        k = n / 1000
        assert prefill["intercept_seconds"] + k * prefill["linear_seconds_per_1k_tokens"] + k * k * prefill[
            "quadratic_seconds_per_1k_tokens_squared"
        ] == pytest.approx(cost.prefill_seconds(n))
    doubled = program_scheduling_config(
        kv_capacity_tokens=65536, time_scale=1.0, metrics_interval_s=0.5, queue_timeout_s=600,
        typical_prefill_tokens=1000, cost=cost.with_prefill_cost_scale(2.0),
    )["prefill_cost_model"]  # fmt: skip
    assert doubled["linear_seconds_per_1k_tokens"] == pytest.approx(2 * prefill["linear_seconds_per_1k_tokens"])
    assert doubled["decode_throughput_alpha"] < prefill["decode_throughput_alpha"]
    assert 0 < prefill["decode_throughput_alpha"] < 1
    assert fast["decode_throughput_model"]["fixed_step_seconds"] == pytest.approx(fixed / 10)
    assert fast["max_acting_ttl_seconds"] == pytest.approx(slow["max_acting_ttl_seconds"] / 10)


def test_vllm_router_command_lines_bind_loopback_and_a_private_metrics_port() -> None:
    launch = RouterLaunch(
        replica_urls=("http://127.0.0.1:1", "http://127.0.0.1:2"),
        port=3,
        kv_capacity_tokens=65536,
        max_model_len=8192,
        time_scale=10,
        scrape_interval_s=0.5,
        queue_timeout_s=600,
        prometheus_port=4,
    )
    sll = vllm_router_argv("vllm-sticky-least-loaded", launch, binary="vllm-router")
    assert sll[sll.index("--policy") + 1] == "sticky_least_loaded"
    assert sll[sll.index("--host") + 1] == "127.0.0.1"
    assert sll[sll.index("--prometheus-port") + 1] == "4"
    assert "--enable-program-scheduling" not in sll
    program = vllm_router_argv("vllm-program", launch, binary="vllm-router")
    config = json.loads(program[program.index("--program-scheduling-config-json") + 1])
    assert config["token_capacity_per_target"] == 65536


# -- end to end ---------------------------------------------------------------------------


def test_tiny_bench_end_to_end_measures_every_router_and_leaves_no_process(tmp_path: Path) -> None:
    routers = (OURS, "vllm-sticky-least-loaded") if VLLM_ROUTER else (OURS,)
    config = BenchConfig(
        scenario=scaled_scenario(scenario("tool-chat"), context_scale=0.25, max_model_len=2048),
        routers=routers,
        replicas=2,
        kv_capacity_tokens=8192,
        time_scale=20.0,
        duration_s=6.0,
        load=2.0,
        scrape_interval_s=0.2,
        out_dir=tmp_path,
        overhead=OverheadConfig(concurrency=2, rounds=1, slice_s=0.5),
        vllm_router_bin=VLLM_ROUTER or "vllm-router",
    )
    assert config.resolved_in_flight == 16
    messages: list[str] = []
    result = run_bench(config, messages.append)
    assert [r.router for r in result.runs] == list(routers)
    for run in result.runs:
        assert run.generated_tokens > 0
        assert run.tokens_per_s > 0
        assert run.completed > 0
        assert run.started >= run.completed
        assert run.turns > 0
        assert run.prompt_tokens > run.cached_tokens > 0
        assert 0 < run.prefix_hit_ratio <= 1
        assert run.p50_trajectory_s is not None
        assert run.p90_trajectory_s is not None
        assert run.p50_trajectory_s <= run.p90_trajectory_s
        assert run.errors == 0
        assert 0.0 <= run.engine_lag_pct < 100.0
        assert len(run.pids) == 3
        assert run.leftover_pids == []
        assert not any(pid_alive(pid) for pid in run.pids)
    assert [row.target for row in result.overhead] == [DIRECT, *routers]
    assert all(row.requests > 0 and row.errors == 0 for row in result.overhead)
    data = json.loads(json.dumps(result_json(result)))
    assert data["config"]["in_flight"] == 16
    assert len(data["runs"]) == len(routers)
    assert "| router |" in markdown(result)
    assert any("ready" in m for m in messages)
    assert isinstance(result, BenchResult)
    if not VLLM_ROUTER:
        pytest.skip("vllm-router binary not installed (pip install vllm-router): only our router was measured")


@pytest.mark.parametrize("router", ["rolloutpool", "vllm-router"])
def test_rl_client_example_runs_against_our_router_and_vllm_router(tmp_path: Path, router: str) -> None:
    if router == "vllm-router" and VLLM_ROUTER is None:
        pytest.skip("vllm-router binary not installed (pip install vllm-router)")
    with ProcessSet(tmp_path) as procs:
        engine_port, router_port = free_port(), free_port()
        engine = f"http://127.0.0.1:{engine_port}"
        procs.start(
            "engine",
            rolloutpool_argv(
                "engine-sim",
                "--port",
                str(engine_port),
                "--time-scale",
                "200",
                "--max-model-len",
                "4096",
                "--kv-capacity-tokens",
                "65536",
            ),
            ready_url=f"{engine}/health",
        )
        url = f"http://127.0.0.1:{router_port}"
        if router == "rolloutpool":
            argv = rolloutpool_argv("router", "--replica", f"e0={engine}", "--port", str(router_port))
            procs.start("router", argv, ready_url=f"{url}/readyz")
        else:
            launch = RouterLaunch(
                replica_urls=(engine,),
                port=router_port,
                kv_capacity_tokens=65536,
                max_model_len=None,
                time_scale=200,
                scrape_interval_s=0.5,
                queue_timeout_s=60,
                prometheus_port=free_port(),
            )
            argv = vllm_router_argv("vllm-sticky-least-loaded", launch, binary=str(VLLM_ROUTER))
            procs.start("router", argv, ready_url=f"{url}/health")
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "rl_client.py"), "--url", url, "--trajectories", "3"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONWARNINGS": "error"},
            check=False,
        )
        pids = procs.pids
    assert done.returncode == 0, done.stderr
    assert "finish_session: HTTP 200" in done.stdout
    assert "3 trajectories x 3 turns done" in done.stdout
    assert not any(pid_alive(pid) for pid in pids)


def test_bench_command_checks_its_inputs_before_starting_anything(tmp_path: Path) -> None:
    from click.testing import CliRunner  # noqa: PLC0415

    from rolloutpool.cli.bench import bench_command  # noqa: PLC0415

    runner = CliRunner()
    assert runner.invoke(bench_command, ["--help"]).exit_code == 0
    small = runner.invoke(
        bench_command, ["--kv-capacity-tokens", "4096", "--max-model-len", "8192", "--out", str(tmp_path)]
    )
    assert small.exit_code == 2
    assert "must hold at least one" in small.output
    missing = runner.invoke(bench_command, ["--vllm-router-bin", str(tmp_path / "nope"), "--out", str(tmp_path)])
    assert missing.exit_code == 2
    assert "not found" in missing.output


def test_with_kv_events_the_engines_publish_and_our_router_subscribes_to_each(tmp_path: Path) -> None:
    config = BenchConfig(
        scenario=scaled_scenario(scenario("tool-chat"), context_scale=0.25, max_model_len=2048),
        routers=(OURS,),
        replicas=2,
        kv_capacity_tokens=8192,
        time_scale=20.0,
        duration_s=4.0,
        load=2.0,
        scrape_interval_s=0.2,
        out_dir=tmp_path,
        overhead=None,
        kv_events=True,
    )
    result = run_bench(config, lambda _message: None)
    (run,) = result.runs
    assert run.completed > 0
    assert run.errors == 0
    assert run.leftover_pids == []
    logs = "".join(p.read_text() for p in (tmp_path / "logs" / OURS).glob("*.log"))
    assert "Subscribed to KV events replica=r0" in logs
    assert "Subscribed to KV events replica=r1" in logs
    assert "unreliable" not in logs
    plain = our_router_argv(
        RouterLaunch(replica_urls=("http://127.0.0.1:1",), port=2, kv_capacity_tokens=8192, max_model_len=2048,
                     time_scale=1.0, scrape_interval_s=0.5, queue_timeout_s=60.0),
        prefix=["rolloutpool"],
    )  # fmt: skip
    assert "--kv-events" not in plain  # a launch without subscriptions: our router presumes a prefix it let go is gone
    assert BenchConfig(scenario=scenario("tool-chat"), routers=(OURS,)).kv_events  # on by default, as deployed
    assert json.loads(json.dumps(result.config))["kv_events"] is True
