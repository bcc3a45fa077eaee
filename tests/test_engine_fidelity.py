"""engine-sim behaves as vLLM 0.32 where a real run showed it differed (issue 14, item 2).

The block pool's free-queue order, the counters under preemption, the block size,
prefix caching off, token-by-token streaming, ``n``, batched prompts,
``return_token_ids`` and ``prompt_tokens_details: null``. The HTTP tests run a real
engine-sim on a loopback port; ``tests/test_conformance_vllm.py`` compares the same
things against a real vLLM.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from rolloutpool.cli import main
from rolloutpool.engine.model.blocks import BlockPool
from rolloutpool.engine.model.core import Engine, EngineConfig, Request
from rolloutpool.engine.model.hashing import hash_token_blocks
from rolloutpool.engine.server.app import ServerConfig
from routerkit import sse
from test_engine_server import post, scrape, serve


def test_uncached_blocks_freed_later_are_reused_before_any_cached_block() -> None:
    pool = BlockPool(5)  # 4 usable
    assert pool.take_new(2)
    pool.seal([11, 12], 0, 2)
    pool.release([11, 12], 2, 0)  # a cached prefix, free at the back
    assert pool.take_new(2)  # the two never-used blocks
    pool.release([], 0, 2)  # uncached blocks freed AFTER the cached ones
    assert pool.take_new(2)
    assert pool.evictions == 0  # vLLM prepends uncached blocks: the prefix survives
    assert pool.count_hits([11, 12], 2) == 2
    assert pool.take_new(1)  # now only the cached prefix is left: its tail goes first
    assert pool.count_hits([11, 12], 2) == 1


def test_preempted_readmissions_are_not_counted_again() -> None:
    cfg = EngineConfig(num_gpu_blocks=12, block_size=16, max_num_seqs=4, max_num_batched_tokens=512, max_model_len=160)
    engine = Engine(cfg)
    for rid in range(3):
        tokens = [rid * 1000 + i for i in range(40)]
        engine.add(Request(rid, prompt_len=40, max_tokens=100, hashes=hash_token_blocks(tokens + [rid] * 100, 16)))
    while engine.has_work:
        engine.step()
    c = engine.counters
    assert c.preemptions > 0
    assert c.prefix_queries == c.prompt_tokens == 3 * 40  # each request's first admission only
    assert c.prefix_hits == c.prompt_tokens_cached


def test_prefix_caching_off_never_hits() -> None:
    cfg = EngineConfig(num_gpu_blocks=64, block_size=16, enable_prefix_caching=False)
    engine = Engine(cfg)
    hashes = hash_token_blocks(list(range(100)) + [0] * 4, 16)
    for rid in range(2):
        engine.add(Request(rid, prompt_len=100, max_tokens=4, hashes=hashes))
        while engine.has_work:
            engine.step()
    assert engine.counters.prefix_hits == 0


def test_engine_sim_cli_takes_block_size() -> None:
    result = CliRunner().invoke(main, ["engine-sim", "--block-size", "32", "--num-gpu-blocks", "3"])
    assert result.exit_code == 2  # 2 usable blocks of 32 cannot hold the default context: refused before serving
    assert "blocks of 32" in result.output


async def test_block_size_32_caches_whole_blocks_of_32() -> None:
    prompt = list(range(100))
    async with serve(block_size=32, num_gpu_blocks=256) as base, aiohttp.ClientSession() as session:
        await post(session, f"{base}/v1/completions", {"prompt": prompt, "max_tokens": 1})
        _, reply = await post(session, f"{base}/v1/completions", {"prompt": prompt, "max_tokens": 1})
        info = (await scrape(session, base))["families"]["vllm:cache_config_info"].samples[0].labels
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 96  # (100 - 1) // 32 blocks
    assert info["block_size"] == "32"


async def test_stream_sends_one_event_per_token_and_the_usage_tail() -> None:
    body = {"prompt": list(range(20)), "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True}}
    async with (
        serve() as base,
        aiohttp.ClientSession() as session,
        session.post(f"{base}/v1/completions", json=body) as resp,
    ):
        events = await sse(resp)
    assert events[-1] == "[DONE]"
    chunks: list[dict[str, Any]] = events[:-1]  # type: ignore[assignment]
    tokens = [c for c in chunks if c["choices"]]
    assert len(tokens) == 7
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 6 + ["length"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 7


async def test_n_batched_prompts_and_return_token_ids() -> None:
    body = {"prompt": [list(range(40)), list(range(100, 130))], "max_tokens": 5, "n": 2, "return_token_ids": True}
    async with serve() as base, aiohttp.ClientSession() as session:
        status, reply = await post(session, f"{base}/v1/completions", body)
    assert status == 200
    choices = reply["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert all(len(c["token_ids"]) == 5 for c in choices)
    assert choices[0]["prompt_token_ids"] == list(range(40))
    assert choices[2]["prompt_token_ids"] == list(range(100, 130))
    assert choices[0]["token_ids"] != choices[1]["token_ids"]  # the n choices sample differently
    assert reply["usage"]["prompt_tokens"] == 70
    assert reply["usage"]["completion_tokens"] == 20


async def test_chat_stream_with_n_opens_each_choice_and_ends_each() -> None:
    body = {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3, "n": 2, "stream": True}
    async with (
        serve() as base,
        aiohttp.ClientSession() as session,
        session.post(f"{base}/v1/chat/completions", json=body) as resp,
    ):
        events = await sse(resp)
    chunks: list[dict[str, Any]] = events[:-1]  # type: ignore[assignment]
    roles = [c["choices"][0]["index"] for c in chunks if "role" in c["choices"][0]["delta"]]
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert roles == [0, 1]
    assert sorted(finishes) == [0, 1]
    assert len(chunks) == 2 + 2 * 3


async def test_prompt_tokens_details_off_answers_null() -> None:
    async with serve(prompt_tokens_details=False) as base, aiohttp.ClientSession() as session:
        _, reply = await post(session, f"{base}/v1/completions", {"prompt": list(range(40)), "max_tokens": 2})
    assert reply["usage"]["prompt_tokens_details"] is None


async def test_prefix_caching_off_is_reported_in_cache_config_info() -> None:
    async with serve(enable_prefix_caching=False) as base, aiohttp.ClientSession() as session:
        for _ in range(2):
            _, reply = await post(session, f"{base}/v1/completions", {"prompt": list(range(80)), "max_tokens": 2})
        info = (await scrape(session, base))["families"]["vllm:cache_config_info"].samples[0].labels
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert info["enable_prefix_caching"] == "False"


def test_server_config_rejects_a_context_the_pool_cannot_hold() -> None:
    with pytest.raises(ValueError, match="blocks of 32"):
        ServerConfig(block_size=32, num_gpu_blocks=10, max_model_len=4096)
