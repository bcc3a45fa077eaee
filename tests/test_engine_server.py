"""The engine simulator speaks vLLM's OpenAI API and metrics over real HTTP (DESIGN section 5).

Every test starts a real server on a free loopback port; nothing is mocked. A high
``time_scale`` keeps runs short; no assertion depends on wall-clock speed except two
loose, one-sided bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from rolloutpool.engine.model.tokenizer import detokenize, generate_ids, render_chat, tokenize
from rolloutpool.engine.server.app import ServerConfig, build_app
from routerkit import sse

FAST = 1000.0
BS = 16


@contextlib.asynccontextmanager
async def serve(**overrides: Any) -> AsyncIterator[str]:
    """A running simulator; yields its base URL."""
    settings: dict[str, Any] = {"time_scale": FAST, "num_gpu_blocks": 2048, "max_model_len": 4096, "model": "sim"}
    settings.update(overrides)
    runner = web.AppRunner(build_app(ServerConfig(**settings)), shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def scrape(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    """``{sample name: value}`` for unlabelled-by-reason samples, plus the parsed families."""
    async with session.get(f"{base}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    values: dict[str, Any] = {}
    for family in families.values():
        for s in family.samples:
            key = s.name
            for label in ("finished_reason", "reason"):
                if label in s.labels:
                    key += f"[{s.labels[label]}]"
            values[key] = s.value
    return {"values": values, "families": families, "text": text}


WORDS = ["the", "agent", "reads", "the", "tool", "output", "and", "decides", "what", "to", "call", "next", ","]


def user_text(session_id: int, turn: int, n_words: int) -> str:
    return " ".join(f"{WORDS[(i + turn) % len(WORDS)]}{session_id}x{turn}" for i in range(n_words))


# -- tokenizer (pure) -------------------------------------------------------------------


def test_generated_text_retokenizes_to_the_same_ids_and_chat_prompts_extend() -> None:
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi, what's 2+2?"}]
    prompt = tokenize(render_chat(messages))
    output = generate_ids(prompt, 200, seed=3)
    text = detokenize(output)
    assert tokenize(text) == output
    assert generate_ids(prompt, 50, seed=3) == output[:50]
    assert generate_ids(prompt, 50, seed=4) != output[:50]
    following = [*messages, {"role": "assistant", "content": text.strip()}, {"role": "user", "content": "and 3+3?"}]
    assert tokenize(render_chat(following))[: len(prompt) + len(output)] == prompt + output


# -- chat, multi-turn, prefix cache -----------------------------------------------------


async def test_multi_turn_chat_hits_the_prefix_cache_turn_over_turn() -> None:
    async with serve() as base, aiohttp.ClientSession() as session:
        messages: list[dict[str, str]] = [{"role": "system", "content": user_text(0, 0, 40)}]
        cached: list[int] = []
        prompts: list[int] = []
        previous_context = 0
        for turn in range(5):
            messages.append({"role": "user", "content": user_text(1, turn, 30)})
            body = {"model": "sim", "messages": messages, "max_tokens": 40, "session_id": "s-1", "temperature": 1.0}
            status, reply = await post(session, f"{base}/v1/chat/completions", body)
            assert status == 200, reply
            assert reply["object"] == "chat.completion"
            assert reply["choices"][0]["finish_reason"] == "length"
            usage = reply["usage"]
            assert usage["completion_tokens"] == 40
            assert usage["total_tokens"] == usage["prompt_tokens"] + 40
            cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
            # everything computed last turn (prompt + output but the last sampled token) is a hit
            expected = (previous_context - 1) // BS * BS if turn else 0
            assert cached_tokens == expected
            cached.append(cached_tokens)
            prompts.append(usage["prompt_tokens"])
            previous_context = usage["prompt_tokens"] + usage["completion_tokens"]
            messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        assert cached == sorted(cached)
        assert len(set(cached)) == len(cached)
        values = (await scrape(session, base))["values"]
        assert values["vllm:prefix_cache_hits_total"] == sum(cached)
        assert values["vllm:prompt_tokens_cached_total"] == sum(cached)
        assert values["vllm:prompt_tokens_total"] == values["vllm:prefix_cache_queries_total"] == sum(prompts)
        assert values["vllm:generation_tokens_total"] == 5 * 40
        assert values["vllm:request_success_total[length]"] == 5


@pytest.mark.parametrize(("num_gpu_blocks", "evicted"), [(80, True), (4096, False)])
async def test_interleaved_sessions_lose_their_prefix_when_the_cache_is_oversubscribed(
    num_gpu_blocks: int, evicted: bool
) -> None:
    """Six sessions of ~250 tokens each round-robin over a pool of 79 usable blocks (1264 tokens)."""
    async with serve(num_gpu_blocks=num_gpu_blocks, max_model_len=1024) as base, aiohttp.ClientSession() as session:
        histories: dict[int, list[dict[str, str]]] = {s: [] for s in range(6)}
        context: dict[int, int] = {}
        returning: list[tuple[int, int]] = []
        for turn in range(2):
            for sid, messages in histories.items():
                messages.append({"role": "user", "content": user_text(sid, turn, 180)})
                status, reply = await post(
                    session, f"{base}/v1/chat/completions", {"messages": messages, "max_tokens": 48}
                )
                assert status == 200, reply
                usage = reply["usage"]
                if turn:
                    returning.append((usage["prompt_tokens_details"]["cached_tokens"], context[sid]))
                context[sid] = usage["prompt_tokens"] + usage["completion_tokens"]
                messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        assert all(prev > 200 for _, prev in returning)
        if evicted:
            assert all(hit < prev // 4 for hit, prev in returning), returning
        else:
            assert all(hit == (prev - 1) // BS * BS for hit, prev in returning), returning
        values = (await scrape(session, base))["values"]
        assert values["vllm:num_preemptions_total"] == 0  # one request at a time: eviction, not preemption
        assert values["vllm:kv_cache_usage_perc"] == 0.0  # idle: cached-but-free blocks count as free


# -- streaming -------------------------------------------------------------------------


@pytest.mark.parametrize("chat", [False, True])
async def test_streaming_with_include_usage_ends_with_a_usage_chunk_then_done(chat: bool) -> None:
    async with serve(time_scale=100.0) as base, aiohttp.ClientSession() as session:
        if chat:
            url, body = f"{base}/v1/chat/completions", {"messages": [{"role": "user", "content": user_text(1, 1, 40)}]}
        else:
            url, body = f"{base}/v1/completions", {"prompt": user_text(1, 1, 40)}
        body |= {"max_tokens": 60, "model": "sim"}
        status, plain = await post(session, url, body)
        assert status == 200
        async with session.post(url, json={**body, "stream": True, "stream_options": {"include_usage": True}}) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            events = await sse(resp)
        assert events[-1] == "[DONE]"
        final = events[-2]
        assert final["choices"] == []
        assert final["usage"]["completion_tokens"] == 60
        assert final["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
        assert final["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # same prompt as the plain request
        chunks = events[:-2]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk" if chat else "text_completion"}
        assert all(c["id"] == chunks[0]["id"] for c in chunks)
        if chat:
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            pieces = [c["choices"][0]["delta"]["content"] for c in chunks]
            expected = plain["choices"][0]["message"]["content"]
        else:
            pieces = [c["choices"][0]["text"] for c in chunks]
            expected = plain["choices"][0]["text"]
        assert "".join(pieces) == expected
        assert sum(1 for p in pieces if p) > 1  # tokens arrive as they are generated
        assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])

        async with session.post(url, json={**body, "stream": True}) as resp:
            events = await sse(resp)
        assert events[-1] == "[DONE]"
        assert all("usage" not in e for e in events[:-1])


# -- completions with token ids, determinism ----------------------------------------------


async def test_completions_accept_token_id_prompts_and_cache_whole_blocks() -> None:
    async with serve() as base, aiohttp.ClientSession() as session:
        prompt = list(range(1000, 1100))
        first = await post(session, f"{base}/v1/completions", {"prompt": prompt, "max_tokens": 5})
        second = await post(session, f"{base}/v1/completions", {"prompt": [prompt], "max_tokens": 5})
        assert first[0] == second[0] == 200
        for _, reply in (first, second):
            assert reply["object"] == "text_completion"
            assert reply["model"] == "sim"
            assert reply["usage"]["prompt_tokens"] == 100
            assert reply["usage"]["completion_tokens"] == 5
            assert len(tokenize(reply["choices"][0]["text"])) == 5
        assert first[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert second[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 96  # (100 - 1) // 16 * 16
        assert first[1]["choices"][0]["text"] == second[1]["choices"][0]["text"]
        status, error = await post(session, f"{base}/v1/completions", {"prompt": [1, -5, 3]})
        assert status == 400
        assert error["error"]["type"] == "BadRequestError"


async def test_same_seed_same_text_across_servers_and_request_seed_varies_it() -> None:
    body = {"prompt": "The quick brown fox", "max_tokens": 30}
    texts = []
    for seed in (7, 7, 8):
        async with serve(seed=seed) as base, aiohttp.ClientSession() as session:
            status, reply = await post(session, f"{base}/v1/completions", body)
            assert status == 200
            texts.append(reply["choices"][0]["text"])
            status, reseeded = await post(session, f"{base}/v1/completions", {**body, "seed": 1})
            assert reseeded["choices"][0]["text"] != reply["choices"][0]["text"]
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


# -- errors ------------------------------------------------------------------------------


async def test_errors_are_openai_shaped_and_the_server_keeps_serving() -> None:
    async with serve(max_model_len=256, num_gpu_blocks=64) as base, aiohttp.ClientSession() as session:
        async with session.post(
            f"{base}/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 400
            bad_json = await resp.json()
        cases = [
            ({"prompt": "hi", "model": "other"}, 404, "NotFoundError"),
            ({"prompt": list(range(256))}, 400, "BadRequestError"),
            ({"max_tokens": 3}, 400, "BadRequestError"),
            ({"prompt": "hi", "max_tokens": 0}, 400, "BadRequestError"),
            ({"prompt": "hi", "max_tokens": "many"}, 400, "Bad Request"),  # vLLM 0.32's request validation
        ]
        errors = [bad_json]
        for body, want_status, want_type in cases:
            status, error = await post(session, f"{base}/v1/completions", body)
            assert status == want_status, (body, error)
            assert error["error"]["type"] == want_type
            errors.append(error)
        status, error = await post(session, f"{base}/v1/chat/completions", {"messages": []})
        assert status == 400
        errors.append(error)
        for error in errors:
            assert set(error["error"]) == {"message", "type", "param", "code"}
            assert error["error"]["code"] in (400, 404)
        assert "maximum context length is 256 tokens" in errors[2]["error"]["message"]

        # a prompt that fits but whose max_tokens does not is truncated to the context
        status, reply = await post(session, f"{base}/v1/completions", {"prompt": list(range(250)), "max_tokens": 50})
        assert status == 200
        assert reply["usage"]["completion_tokens"] == 6
        assert reply["choices"][0]["finish_reason"] == "length"
        async with session.get(f"{base}/health") as resp:
            assert resp.status == 200
        async with session.get(f"{base}/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == "sim"
        async with session.get(f"{base}/version") as resp:
            assert "version" in await resp.json()


# -- metrics -----------------------------------------------------------------------------

GAUGES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:cache_config_info",
]
COUNTERS = [
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:prompt_tokens_cached",
    "vllm:generation_tokens",
    "vllm:request_success",
]
HISTOGRAMS = [
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_num_preemptions",
]


async def test_metrics_have_vllm_names_types_labels_and_created_samples() -> None:
    async with serve(num_gpu_blocks=500, max_model_len=2000) as base, aiohttp.ClientSession() as session:
        status, reply = await post(session, f"{base}/v1/completions", {"prompt": "count to ten", "max_tokens": 25})
        assert status == 200
        scraped = await scrape(session, base)
    families, values, text = scraped["families"], scraped["values"], scraped["text"]
    for name in GAUGES:
        assert families[name].type == "gauge", name
    for name in COUNTERS:
        assert families[name].type == "counter", name
        assert f"# TYPE {name}_total counter" in text or f"# TYPE {name} counter" in text
        assert f"{name}_created{{" in text, name
    for name in HISTOGRAMS:
        assert families[name].type == "histogram", name
        assert f"{name}_created{{" in text, name
    for name in GAUGES[:-1] + COUNTERS + HISTOGRAMS:
        for sample in families[name].samples:
            assert sample.labels["model_name"] == "sim"
            assert sample.labels["engine"] == "0"
    (info,) = families["vllm:cache_config_info"].samples
    assert info.value == 1.0
    assert "model_name" not in info.labels
    assert info.labels["block_size"] == "16"
    assert info.labels["num_gpu_blocks"] == "500"
    assert info.labels["kv_cache_size_tokens"] == "8000"
    assert info.labels["kv_cache_max_concurrency"] == "4.0"
    assert info.labels["enable_prefix_caching"] == "True"
    assert info.labels["gpu_memory_utilization"] == "0.9"
    assert info.labels["engine"] == "0"
    assert {s.labels["reason"] for s in families["vllm:num_requests_waiting_by_reason"].samples} == {
        "capacity",
        "deferred",
    }
    prompt_tokens = reply["usage"]["prompt_tokens"]
    assert values["vllm:prompt_tokens_total"] == prompt_tokens
    assert values["vllm:generation_tokens_total"] == 25
    assert values["vllm:request_success_total[length]"] == 1
    assert values["vllm:request_success_total[stop]"] == 0
    assert values["vllm:time_to_first_token_seconds_count"] == 1
    assert values["vllm:e2e_request_latency_seconds_count"] == 1
    assert values["vllm:inter_token_latency_seconds_count"] == 24
    assert values["vllm:request_num_preemptions_count"] == 1
    assert values["vllm:num_requests_running"] == values["vllm:num_requests_waiting"] == 0
    # simulated seconds: TTFT <= e2e, and the e2e covers 25 steps of at least the step overhead
    assert 0 < values["vllm:time_to_first_token_seconds_sum"] <= values["vllm:e2e_request_latency_seconds_sum"]
    assert values["vllm:e2e_request_latency_seconds_sum"] >= 25 * 0.004


async def test_concurrent_requests_on_a_small_pool_are_preempted_and_all_finish() -> None:
    async with serve(num_gpu_blocks=40, max_model_len=600) as base, aiohttp.ClientSession() as session:
        bodies = [{"prompt": list(range(i * 1000, i * 1000 + 100)), "max_tokens": 300} for i in range(4)]
        replies = await asyncio.gather(*(post(session, f"{base}/v1/completions", b) for b in bodies))
        assert all(status == 200 for status, _ in replies)
        assert all(r["usage"]["completion_tokens"] == 300 for _, r in replies)
        values = (await scrape(session, base))["values"]
    assert values["vllm:num_preemptions_total"] > 0
    assert values["vllm:request_num_preemptions_sum"] == values["vllm:num_preemptions_total"]
    # as in vLLM 0.32, re-admissions after a preemption are not counted again
    assert values["vllm:prefix_cache_queries_total"] == values["vllm:prompt_tokens_total"]
    assert values["vllm:prefix_cache_hits_total"] == values["vllm:prompt_tokens_cached_total"]
    assert values["vllm:kv_cache_usage_perc"] == 0.0


# -- time scale, disconnects, faults -------------------------------------------------------


async def test_time_scale_runs_simulated_seconds_faster_than_wall_seconds() -> None:
    async with serve() as base, aiohttp.ClientSession() as session:
        started = time.monotonic()
        status, _ = await post(session, f"{base}/v1/completions", {"prompt": "go", "max_tokens": 1000})
        wall = time.monotonic() - started
        assert status == 200
        simulated = (await scrape(session, base))["values"]["vllm:e2e_request_latency_seconds_sum"]
    # 1000 decode steps of overhead + an 8B weight read (7.96 ms on the H100 preset): more than 7.5 simulated seconds
    assert simulated > 7.5
    assert wall < simulated / 2


async def test_an_engine_behind_its_time_scale_counts_the_simulated_time_it_lost() -> None:
    """At a time scale Python cannot follow the loop re-anchors; the lag counter says by how much."""
    async with serve(time_scale=1e7) as base, aiohttp.ClientSession() as session:
        status, _ = await post(session, f"{base}/v1/completions", {"prompt": "go", "max_tokens": 1000})
        assert status == 200
        values = (await scrape(session, base))["values"]
    simulated = values["vllm:e2e_request_latency_seconds_sum"]
    lag = values["rolloutpool_engine_lag_seconds_total"]
    # 1000 decode steps take > 7.5 simulated seconds, under 1 us of wall at 1e7: almost all of it is lag
    assert simulated > 7.5
    assert 0.5 * simulated < lag
    async with serve(time_scale=1.0) as base, aiohttp.ClientSession() as session:
        assert (await scrape(session, base))["values"]["rolloutpool_engine_lag_seconds_total"] == 0.0


async def _wait_for_metric(session: aiohttp.ClientSession, base: str, key: str, value: float) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        values = (await scrape(session, base))["values"]
        if values[key] == value or time.monotonic() > deadline:
            return values
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_goes_away_has_its_request_aborted_and_blocks_freed(stream: bool) -> None:
    async with serve(time_scale=1.0) as base, aiohttp.ClientSession() as session:
        body = {"prompt": list(range(500)), "max_tokens": 3000, "stream": stream}
        async with aiohttp.ClientSession() as doomed:
            if stream:
                async with doomed.post(f"{base}/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    await resp.content.readline()  # the first chunk: the request is running
            else:
                with pytest.raises(asyncio.TimeoutError):
                    await doomed.post(f"{base}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=0.5))
        values = await _wait_for_metric(session, base, "vllm:request_success_total[abort]", 1)
        assert values["vllm:request_success_total[abort]"] == 1
        assert values["vllm:num_requests_running"] == 0
        assert values["vllm:kv_cache_usage_perc"] == 0.0
        status, _ = await post(session, f"{base}/v1/completions", {"prompt": "still here", "max_tokens": 2})
        assert status == 200


async def test_error_rate_one_answers_every_generation_with_an_openai_500() -> None:
    async with serve(error_rate=1.0) as base, aiohttp.ClientSession() as session:
        for url, body in ((f"{base}/v1/completions", {"prompt": "hi"}), (f"{base}/v1/chat/completions", {})):
            status, error = await post(session, url, body)
            assert status == 500
            assert error["error"]["type"] == "InternalServerError"
            assert error["error"]["code"] == 500
        async with session.get(f"{base}/health") as resp:
            assert resp.status == 200


async def test_hang_rate_one_never_answers_until_the_client_gives_up() -> None:
    async with serve(hang_rate=1.0) as base, aiohttp.ClientSession() as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(
                f"{base}/v1/completions", json={"prompt": "hi"}, timeout=aiohttp.ClientTimeout(total=0.3)
            )
        async with session.get(f"{base}/health") as resp:
            assert resp.status == 200
        values = (await scrape(session, base))["values"]
        assert values["vllm:prompt_tokens_total"] == 0  # the hung request never reached the engine


async def test_added_latency_delays_every_generation() -> None:
    async with serve(added_latency_ms=200) as base, aiohttp.ClientSession() as session:
        started = time.monotonic()
        status, _ = await post(session, f"{base}/v1/completions", {"prompt": "hi", "max_tokens": 1})
        assert status == 200
        assert time.monotonic() - started >= 0.2
