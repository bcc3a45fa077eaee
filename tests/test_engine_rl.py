"""engine-sim speaks vLLM 0.32's RL API: token-in generate, tokenize, pause/resume, weight sync (real HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rolloutpool.dev.wait import wait_until_async
from rolloutpool.engine.model.tokenizer import tokenize
from rolloutpool.engine.server.app import ServerConfig, build_app
from rolloutpool.engine.server.rl import RL_CONTROL, RLControl
from routerkit import ENGINE_DEFAULTS, MODEL, serve, sse


class Engine:
    def __init__(self, url: str, http: aiohttp.ClientSession, control: RLControl) -> None:
        self.url, self.http, self.control = url, http, control

    async def post(self, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        async with self.http.post(f"{self.url}{path}", json=body, **kwargs) as resp:
            text = await resp.text()
            return resp.status, json.loads(text) if text else None

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(f"{self.url}{path}") as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if resp.content_type == "application/json" else text)

    async def generate(self, ids: list[int], max_tokens: int = 8, **extra: Any) -> tuple[int, Any]:
        body = {"token_ids": ids, "sampling_params": {"max_tokens": max_tokens}, "model": MODEL, **extra}
        return await self.post("/inference/v1/generate", body)

    async def metric(self, name: str, **labels: str) -> float:
        _, text = await self.get("/metrics")
        return sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )


@contextlib.asynccontextmanager
async def engine(**overrides: Any) -> AsyncIterator[Engine]:
    app = build_app(ServerConfig(**{**ENGINE_DEFAULTS, **overrides}))
    async with serve(app) as (url, _), aiohttp.ClientSession() as http:
        yield Engine(url, http, app[RL_CONTROL])


PROMPT = list(range(100, 180))  # 80 tokens: five full blocks


async def test_generate_is_token_in_token_out_and_cache_salt_separates_caches() -> None:
    async with engine() as e:
        status, body = await e.generate(PROMPT, max_tokens=12, request_id="r1")
        assert status == 200
        assert body["request_id"] == "generate-tokens-r1"  # vLLM's prefix
        assert body["model"] == MODEL
        assert body["output_mode"] == "tokens"
        assert body["prompt_token_ids"] is None  # only with return_token_ids, as vLLM
        (choice,) = body["choices"]
        assert len(choice["token_ids"]) == 12
        assert all(isinstance(t, int) for t in choice["token_ids"])
        assert choice["finish_reason"] == "length"
        assert choice["weight_versions"] == [{"version": "0", "start": 0, "end": 12}]
        assert "text" not in choice
        assert body["usage"]["prompt_tokens"] == 80
        assert body["usage"]["completion_tokens"] == 12
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        status, again = await e.generate(PROMPT, max_tokens=12)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 64  # four blocks (the last is recomputed)
        assert again["choices"][0]["token_ids"] == choice["token_ids"]  # deterministic for a prompt
        _, salted = await e.generate(PROMPT, max_tokens=12, cache_salt="policy-7")
        assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        _, salted = await e.generate(PROMPT, max_tokens=12, cache_salt="policy-7")
        assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 64
        _, text = await e.generate(PROMPT, max_tokens=4, output_mode="text")
        assert isinstance(text["choices"][0]["text"], str)


async def test_generate_streams_token_ids_and_usage() -> None:
    async with engine() as e:
        _, whole = await e.generate(PROMPT, max_tokens=20)
        body = {
            "token_ids": PROMPT,
            "sampling_params": {"max_tokens": 20},
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with e.http.post(f"{e.url}/inference/v1/generate", json=body) as resp:
            assert resp.status == 200
            events = await sse(resp)
        assert events[-1] == "[DONE]"
        usage = events[-2]
        assert usage["choices"] == []
        assert usage["usage"]["completion_tokens"] == 20
        streamed = [t for ev in events[:-2] for t in ev["choices"][0]["token_ids"]]
        assert streamed == whole["choices"][0]["token_ids"]
        assert events[-3]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"sampling_params": {"max_tokens": 4}}, 400, "token_ids"),
        ({"token_ids": [], "sampling_params": {}}, 400, "token_ids"),
        ({"token_ids": [1, "x"], "sampling_params": {}}, 400, "token_ids"),
        ({"token_ids": [1, 2]}, 400, "sampling_params"),
        ({"token_ids": [1, 2], "sampling_params": {"n": 0}}, 400, None),
        ({"token_ids": [1, 2], "sampling_params": {"n": 10_000}}, 400, None),
        ({"token_ids": [1, 2], "sampling_params": {"logprobs": 21}}, 400, "logprobs"),
        ({"token_ids": [1, 2], "sampling_params": {"prompt_logprobs": -2}}, 400, "prompt_logprobs"),
        ({"token_ids": [1, 2], "sampling_params": {"max_tokens": 0}}, 400, "sampling_params.max_tokens"),
        ({"token_ids": [1, 2], "sampling_params": {}, "model": "other"}, 404, "model"),
        ({"token_ids": [1, 2], "sampling_params": {}, "cache_salt": 3}, 400, "cache_salt"),
        ({"token_ids": [1, 2], "sampling_params": {}, "output_mode": "logits"}, 400, "output_mode"),
    ],
)
async def test_bad_generate_bodies_are_openai_errors(body: dict[str, Any], status: int, param: str | None) -> None:
    async with engine() as e:
        got, answer = await e.post("/inference/v1/generate", body)
        assert got == status
        assert answer["error"]["param"] == param
        assert e.control.runner.in_flight == 0


async def test_tokenize_and_detokenize_round_trip() -> None:
    async with engine() as e:
        status, tok = await e.post("/tokenize", {"prompt": "hello there, general"})
        assert status == 200
        assert tok["count"] == len(tok["tokens"]) > 0
        assert tok["max_model_len"] == ENGINE_DEFAULTS["max_model_len"]
        status, chat = await e.post("/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 200
        assert chat["count"] > tok["count"] // 4
        _, generated = await e.generate(tok["tokens"], max_tokens=10)
        out = generated["choices"][0]["token_ids"]
        status, detok = await e.post("/detokenize", {"tokens": out})
        assert status == 200
        assert (await e.post("/tokenize", {"prompt": detok["prompt"]}))[1]["tokens"] == out  # generated ids round-trip
        special = (await e.post("/tokenize", {"prompt": "<|im_start|>"}))[1]["tokens"]
        assert (await e.post("/detokenize", {"tokens": special}))[1]["prompt"] == "<|im_start|>"
        messages = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        status, rendered = await e.post("/v1/chat/completions/render", messages)
        assert (status, rendered["token_ids"]) == (200, chat["tokens"])
        assert (await e.post("/v1/completions/render", {"prompt": "hello"}))[1]["token_ids"] == tokenize("hello")
        assert (await e.post("/tokenize", {"nothing": 1}))[0] == 400
        assert (await e.post("/detokenize", {"tokens": "abc"}))[0] == 400


async def test_pause_abort_ends_requests_in_flight_and_holds_new_ones_until_resume() -> None:
    async with engine(time_scale=10.0) as e:
        long = asyncio.create_task(e.generate(PROMPT, max_tokens=2000))
        await wait_until_async(lambda: e.control.runner.in_flight == 1)
        status, paused = await e.post("/pause")  # default: abort, clear the cache
        assert status == 200
        assert paused == {"status": "paused", "mode": "abort", "cache_cleared": True, "aborted": 1}
        status, body = await long
        assert status == 200
        assert body["choices"][0]["finish_reason"] == "abort"
        assert (await e.get("/is_paused"))[1]["is_paused"] is True
        held = asyncio.create_task(e.generate(PROMPT, max_tokens=4))
        await asyncio.sleep(0.3)
        assert not held.done()
        assert e.control.runner.in_flight == 0
        assert (await e.post("/resume"))[0] == 200
        status, body = await held
        assert status == 200
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the pause cleared the cache
        assert (await e.get("/is_paused"))[1]["is_paused"] is False
        assert await e.metric("vllm:rl_weight_update_operation_duration_seconds_count", operation="pause") == 1
        assert await e.metric("vllm:rl_weight_update_operations_in_flight", operation="pause") == 0
        assert (await e.post("/pause?mode=later"))[0] == 400
        assert (await e.post("/pause?clear_cache=maybe"))[0] == 400


async def test_pause_wait_lets_requests_in_flight_finish() -> None:
    # time scale 5: the request runs ~0.4 s of wall time, long enough for the poll below to see it in flight on a
    # loaded machine (at 50 it could finish between two polls, and the test waited for a request already gone)
    async with engine(time_scale=5.0) as e:
        running = asyncio.create_task(e.generate(PROMPT, max_tokens=300))
        await wait_until_async(lambda: e.control.runner.in_flight == 1)
        status, paused = await e.post("/pause?mode=wait&clear_cache=false")
        # the pause answered once the engine had finished the request; its own answer may still be on the way
        # to the client (asserting running.done() here raced it: it failed once on a loaded machine)
        assert e.control.runner.in_flight == 0
        assert (status, paused["mode"], paused["cache_cleared"]) == (200, "wait", False)
        _, body = await asyncio.wait_for(running, timeout=10)
        assert body["choices"][0]["finish_reason"] == "length"
        await e.post("/resume")
        _, after = await e.generate(PROMPT, max_tokens=4)
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 64  # kept


async def test_pause_keep_freezes_requests_longer_than_a_client_timeout() -> None:
    async with engine(time_scale=10.0) as e:
        frozen = asyncio.create_task(e.generate(PROMPT, max_tokens=400))
        await wait_until_async(lambda: e.control.runner.in_flight == 1)
        status, paused = await e.post("/pause?mode=keep")
        assert (status, paused["mode"], paused["cache_cleared"]) == (200, "keep", False)  # its blocks are held
        job = next(iter(e.control._spans))
        await asyncio.sleep(0.1)  # the step computed before the pause is still published
        seen = job.visible
        await asyncio.sleep(0.4)
        assert job.visible == seen  # no engine step while frozen
        # a client that gives up during the pause: its request is aborted and its blocks freed
        impatient = {"token_ids": PROMPT[:40], "sampling_params": {"max_tokens": 4}}
        with pytest.raises(TimeoutError):
            async with e.http.post(
                f"{e.url}/inference/v1/generate", json=impatient, timeout=aiohttp.ClientTimeout(total=0.3)
            ) as resp:
                await resp.read()
        assert not frozen.done()
        assert (await e.post("/resume"))[0] == 200
        status, body = await frozen
        assert status == 200
        assert body["choices"][0]["finish_reason"] == "length"
        assert len(body["choices"][0]["token_ids"]) == 400
        await wait_until_async(lambda: e.control.runner.in_flight == 0)
        assert e.control.runner.engine.pool.num_used == 0


async def test_update_weights_flushes_the_cache_and_bumps_the_version_mid_request() -> None:
    async with engine(time_scale=20.0) as e:
        await e.generate(PROMPT, max_tokens=4)
        running = asyncio.create_task(e.generate(PROMPT[:16] + [7] * 16, max_tokens=300))
        await wait_until_async(lambda: e.control.runner.in_flight == 1)
        await e.post("/pause?mode=keep&clear_cache=false")
        assert (await e.post("/update_weight_version", {"weight_version": 5}))[1]["weight_version"] == 5
        await e.post("/resume")
        _, body = await running
        spans = body["choices"][0]["weight_versions"]
        assert [s["version"] for s in spans] == ["0", "5"]
        assert spans[0]["end"] == spans[1]["start"] > 0
        assert spans[1]["end"] == 300
        status, updated = await e.post("/update_weights", {})
        assert (status, updated["weight_version"], updated["cache_cleared"]) == (200, 6, True)
        _, after = await e.generate(PROMPT, max_tokens=4)
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert after["choices"][0]["weight_versions"][0]["version"] == "6"
        assert (await e.get("/weight_info"))[1] == {"weight_version": 6}
        assert (await e.post("/reset_prefix_cache"))[1]["reset"] is True
        for path in ("/init_weight_transfer_engine", "/start_weight_update", "/finish_weight_update"):
            assert (await e.post(path))[0] == 200
        assert await e.metric("vllm:rl_weight_update_operation_duration_seconds_count", operation="update_weights") == 1
        assert (await e.post("/update_weight_version", {}))[0] == 400
        assert (await e.post("/update_weights", {"weight_version": [1]}))[0] == 400
