"""The real-vLLM tier: engine-sim and the router against vLLM 0.32's CPU build (issue 14).

One tiny vLLM (the cached install and the locally made model, block size 32, 128 KV
blocks) serves the whole module. Skipped, with the reason, only when the vLLM cache is
absent and ``CI`` is unset; under ``CI=true`` (``.ci/dev test`` installs it) it runs.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator

import pytest

from rolloutpool.dev.bench.conformance import EVICT, SMALL, VLLM_ARGS, compare, observe_sim
from rolloutpool.dev.bench.conformance_probe import probe
from rolloutpool.dev.bench.vllm_acceptance import run_acceptance
from rolloutpool.dev.localcluster.vllm_env import vllm_env
from rolloutpool.dev.localcluster.vllm_model import SERVED_MODEL, VllmServer, VllmServerConfig
from rolloutpool.dev.net import free_port
from rolloutpool.router.scrape import parse_signals

if not vllm_env().ready() and os.environ.get("CI") != "true":
    pytest.skip(
        f"vLLM is not installed at {vllm_env().venv} (run 'bash .ci/dev vllm'; CI=true installs and runs it)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def vllm_url() -> Iterator[str]:
    server = VllmServer(VllmServerConfig(port=free_port(), num_gpu_blocks=128, extra_args=VLLM_ARGS))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


async def test_engine_sim_matches_vllm_on_everything_the_project_reads(vllm_url: str) -> None:
    # first on the fresh server: the eviction trace depends on what the cache held before
    real = await probe(vllm_url, model=SERVED_MODEL, shape=SMALL, evict=EVICT)
    sim = await observe_sim()
    rows = compare(real, sim)
    mismatches = [(r.section, r.item, r.vllm, r.sim) for r in rows if r.read and not r.match]
    assert mismatches == []
    assert 0 in [c for session in real.evict_turns for c in session[1:]]  # a returning turn found nothing: evicted


def test_router_reads_the_real_metrics(vllm_url: str) -> None:
    with urllib.request.urlopen(f"{vllm_url}/metrics", timeout=30) as resp:  # noqa: S310 - loopback
        signals = parse_signals(resp.read().decode())
    assert signals.block_size == 32
    assert signals.num_gpu_blocks == 128
    assert signals.prefix_caching is True
    assert signals.kv_cache_usage is not None


async def test_router_on_real_vllm_counts_no_reprefill_over_500_turns(vllm_url: str) -> None:
    result = await run_acceptance(vllm_url, model=SERVED_MODEL, sessions=50, turns=10)
    assert result.turns == 500
    assert result.short_by_more == 0  # nothing was evicted
    assert result.reprefilled_tokens == 0
    assert result.quarantines == 0
