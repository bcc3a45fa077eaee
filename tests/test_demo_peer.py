"""The demo's sticky least-loaded side, for real: engine-sims with the pool's flags behind vllm-router."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

from rolloutpool.dev.bench.client import ClientConfig, run_client
from rolloutpool.dev.demo import demo_pool
from rolloutpool.dev.demo.peer import StickyPeer, peer_engine_args
from rolloutpool.dev.demo.scrape import engine_totals
from rolloutpool.dev.processes import pid_alive
from rolloutpool.sim.workload import scenario


def test_peer_engines_take_the_pool_pods_flags_on_their_own_port() -> None:
    args = peer_engine_args(demo_pool(prometheus_url="http://prom"), 2, port=4321)
    assert args[:2] == ["--host=127.0.0.1", "--port=4321"]
    assert {
        "--kv-capacity-tokens=262144",
        "--max-model-len=32768",
        "--hardware=h100-80gb",
        "--time-scale=5",
        "--seed=2",
    } <= set(args)
    assert not [a for a in args if "POD_IP" in a]


def test_sticky_side_serves_rollouts_its_engines_count_them_and_it_stops(tmp_path: Path) -> None:
    pool = demo_pool(prometheus_url="http://prom", replicas=2, time_scale=50.0)
    with StickyPeer(pool, tmp_path / "peer") as peer:
        pids = peer.procs.pids
        assert len(pids) == 3
        assert "sticky_least_loaded" in " ".join(peer.procs.processes[-1].argv)
        before = engine_totals(peer.engine_urls)
        config = ClientConfig(
            base_url=peer.router_url,
            scenario=scenario("tool-chat").with_(max_model_len=8192),
            seed=0,
            in_flight=4,
            duration_s=4.0,
            time_scale=50.0,
        )
        result = asyncio.run(run_client(config))
        after = engine_totals(peer.engine_urls)
        with urllib.request.urlopen(f"{peer.router_url}/health", timeout=5) as response:  # noqa: S310 - loopback
            assert response.status == 200
    assert result.turns
    assert result.errors == 0
    assert after.generated - before.generated >= sum(t.completion_tokens for t in result.turns)
    assert after.prompt - before.prompt >= sum(t.prompt_tokens for t in result.turns)
    assert all(t.at >= result.window_start for t in result.turns)
    assert not [pid for pid in pids if pid_alive(pid)]
