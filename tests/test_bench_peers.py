"""``rolloutpool bench`` with the peers' turn schedulers: their command lines, and a tiny bench end to end."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from rolloutpool.dev.bench.config import BenchConfig, scaled_scenario
from rolloutpool.dev.bench.peers import (
    PEER_ROUTERS,
    ROUTER_NAMES,
    RouterLaunch,
    our_router_argv,
    turn_scheduler_config,
    uses_vllm_router,
    vllm_router_argv,
)
from rolloutpool.dev.bench.runner import run_bench
from rolloutpool.dev.processes import pid_alive
from rolloutpool.routing.peers.registry import make_scheduler
from rolloutpool.sim.workload import scenario

VLLM_ROUTER = shutil.which("vllm-router") or shutil.which("vllm-router", path=str(Path(sys.executable).parent))
LAUNCH = RouterLaunch(
    replica_urls=("http://127.0.0.1:1", "http://127.0.0.1:2"), port=9, kv_capacity_tokens=65536, max_model_len=8192,
    time_scale=10.0, scrape_interval_s=0.5, queue_timeout_s=60.0,
)  # fmt: skip


def test_every_peer_is_a_bench_router_and_its_time_constants_are_scaled_to_wall_seconds() -> None:
    assert set(PEER_ROUTERS) <= set(ROUTER_NAMES)
    ta = turn_scheduler_config("thunderagent", LAUNCH)
    assert ta == {"interval_s": 0.5, "resume_timeout_s": 180.0}
    pt = turn_scheduler_config("progress-ttl", LAUNCH)
    assert pt["max_acting_ttl_s"] == 1.0
    assert pt["force_resume_timeout_s"] == 30.0
    assert pt["interval_s"] == 0.5
    assert pt["bucket_bounds_s"][0] == 0.025
    for name in ("thunderagent", "progress-ttl"):  # the router accepts what the bench passes
        make_scheduler(name, json.loads(json.dumps(turn_scheduler_config(name, LAUNCH))))
        argv = our_router_argv(LAUNCH, prefix=["rolloutpool"], turn_scheduler=name)
        assert argv[argv.index("--turn-scheduler") + 1] == name
        assert not uses_vllm_router(name)
    with pytest.raises(ValueError, match="turn scheduler"):
        turn_scheduler_config("continuum", LAUNCH)
    argv = vllm_router_argv("continuum", LAUNCH, binary="vllm-router")
    assert argv[argv.index("--policy") + 1] == "sticky_least_loaded"
    assert uses_vllm_router("continuum-fixed")
    overhead = our_router_argv(RouterLaunch(**{**LAUNCH.__dict__, "max_model_len": None}), prefix=["r"],
                               turn_scheduler="thunderagent")  # fmt: skip
    assert "--turn-scheduler" not in overhead  # the overhead measurement: placement only


def test_tiny_bench_runs_the_peers_end_to_end_and_leaves_no_process(tmp_path: Path) -> None:
    routers = ("thunderagent", "progress-ttl", *(("continuum",) if VLLM_ROUTER else ()))
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
        overhead=None,
        vllm_router_bin=VLLM_ROUTER or "vllm-router",
    )
    result = run_bench(config, lambda _m: None)
    assert [r.router for r in result.runs] == list(routers)
    for run in result.runs:
        assert run.generated_tokens > 0
        assert run.completed > 0
        assert run.errors == 0
        assert run.leftover_pids == []
        assert not any(pid_alive(pid) for pid in run.pids)
    if VLLM_ROUTER:
        logs = list((tmp_path / "logs" / "continuum").glob("*"))
        assert logs  # the engines and vllm-router ran under the continuum configuration
    else:
        pytest.skip("vllm-router binary not installed: continuum was not measured")
