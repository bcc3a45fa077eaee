"""RL trainers' rollout calls on a real engine-sim server: logprobs, top-k, prompt_logprobs, n > 1 (issue 27).

Each client test reads the answer the way that framework's client does (prime-rl's renderer
on ``/inference/v1/generate``, AReaL on ``/v1/completions`` with token ids and no model,
SkyRL's ``sample`` with ``n > 1``); before logprobs and ``n`` existed each of them failed.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rolloutpool.dev.bench.conformance import TRAINER_JSON, observe_sim_trainer
from rolloutpool.dev.bench.conformance_trainer import SHAPE_CASES, compare_trainer, from_json, shape_paths
from rolloutpool.engine.server import calls, generate
from rolloutpool.engine.server.app import ServerConfig, build_app
from routerkit import ENGINE_DEFAULTS, MODEL, serve, sse

PROMPT = list(range(100, 180))  # 80 tokens: five full blocks of 16


class Engine:
    def __init__(self, url: str, http: aiohttp.ClientSession) -> None:
        self.url, self.http = url, http

    async def post(self, path: str, body: Any, **kwargs: Any) -> tuple[int, Any]:
        async with self.http.post(f"{self.url}{path}", json=body, **kwargs) as resp:
            text = await resp.text()
            return resp.status, json.loads(text)

    async def stream(self, path: str, body: Any) -> list[Any]:
        async with self.http.post(f"{self.url}{path}", json={**body, "stream": True}) as resp:
            assert resp.status == 200
            return await sse(resp)

    async def counter(self, name: str) -> float:
        async with self.http.get(f"{self.url}/metrics") as resp:
            text = await resp.text()
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@contextlib.asynccontextmanager
async def engine(**overrides: Any) -> AsyncIterator[Engine]:
    app = build_app(ServerConfig(**{**ENGINE_DEFAULTS, **overrides}))
    async with serve(app) as (url, _), aiohttp.ClientSession() as http:
        yield Engine(url, http)


def sampled_evidence(choice: dict[str, Any]) -> list[float]:
    """prime-rl's check of vLLM 0.32's token-mode logprobs: one finite, non-sentinel logprob per sampled id."""
    content = choice["logprobs"]["content"]
    assert len(content) == len(choice["token_ids"])
    out = []
    for token_id, entry in zip(choice["token_ids"], content, strict=True):
        assert entry["token_id"] == token_id
        logprob = entry["logprob"]
        assert isinstance(logprob, float)
        assert math.isfinite(logprob)
        assert logprob != -9999.0
        assert logprob <= 0
        out.append(logprob)
    return out


async def test_prime_rl_generate_reads_sampled_token_logprobs_and_a_top_k_head() -> None:
    head = 2
    body = {
        "model": MODEL,
        "token_ids": PROMPT,
        "cache_salt": "policy-3",
        # prime-rl asks for two more candidates than its head to select it independently of the sampled token
        "sampling_params": {
            "max_tokens": 12,
            "logprobs": head + 2,
            "skip_special_tokens": False,
            "stop_token_ids": [2],
        },
    }
    async with engine() as e:
        status, answer = await e.post("/inference/v1/generate", body, headers={"X-Session-ID": "traj-1"})
    assert status == 200
    (choice,) = answer["choices"]
    logprobs = sampled_evidence(choice)
    assert len(logprobs) == 12
    for token_id, entry in zip(choice["token_ids"], choice["logprobs"]["content"], strict=True):
        top = entry["top_logprobs"]
        assert len(top) == head + 2
        assert top[0] == {"token_id": token_id, "logprob": entry["logprob"], "rank": entry["rank"]}  # sampled first
        others = [t["logprob"] for t in top[1:]]
        assert others == sorted(others, reverse=True)
        assert len({t["token_id"] for t in top}) == len(top)
        assert math.fsum(math.exp(t["logprob"]) for t in top) <= 1.0 + 1e-9
        ranks = [t["rank"] for t in top[1:]]
        assert ranks == sorted(ranks)
        assert all(r >= 1 for r in ranks)


async def test_prime_rl_generate_streams_logprobs_with_every_token() -> None:
    body = {"model": MODEL, "token_ids": PROMPT, "sampling_params": {"max_tokens": 6, "logprobs": 1}}
    async with engine() as e:
        _, whole = await e.post("/inference/v1/generate", body)
        events = await e.stream("/inference/v1/generate", body)
    chunks = [ev for ev in events if isinstance(ev, dict) and ev["choices"]]
    assert len(chunks) == 6
    streamed = [entry for ev in chunks for entry in ev["choices"][0]["logprobs"]["content"]]
    assert streamed == whole["choices"][0]["logprobs"]["content"]  # deterministic for a prompt


async def test_areal_completions_with_token_ids_and_no_model_read_token_id_logprobs() -> None:
    # AReaL's RemotevLLMEngine: token-id prompt, no model, logprobs=0, tokens as "token_id:<id>"
    body = {
        "prompt": PROMPT,
        "max_tokens": 10,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    async with engine() as e:
        status, answer = await e.post("/v1/completions", body)
    assert status == 200
    choice = answer["choices"][0]
    logprobs = choice["logprobs"]
    output_ids = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
    assert output_ids == choice["token_ids"]
    assert len(logprobs["token_logprobs"]) == 10
    assert all(isinstance(v, float) and v <= 0 for v in logprobs["token_logprobs"])
    # logprobs=0: each position lists the sampled token only
    assert [list(top) for top in logprobs["top_logprobs"]] == [[t] for t in logprobs["tokens"]]
    assert [next(iter(top.values())) for top in logprobs["top_logprobs"]] == logprobs["token_logprobs"]


async def test_skyrl_sample_generates_n_choices_each_its_own_request() -> None:
    n = 4
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 8, "n": n, "logprobs": 0, "seed": 5}}
    async with engine() as e:
        queries = await e.counter("vllm:prefix_cache_queries_total")
        status, answer = await e.post("/inference/v1/generate", body)
        queries = await e.counter("vllm:prefix_cache_queries_total") - queries
        hits = await e.counter("vllm:prefix_cache_hits_total")
    assert status == 200
    choices = answer["choices"]
    assert [c["index"] for c in choices] == list(range(n))
    assert all(len(c["token_ids"]) == 8 for c in choices)
    assert len({tuple(c["token_ids"]) for c in choices}) == n  # each choice samples its own tokens
    for c in choices:
        sampled_evidence(c)
    assert answer["usage"]["prompt_tokens"] == 80  # the prompt once
    assert answer["usage"]["completion_tokens"] == n * 8
    assert queries == n * 80  # each choice is one engine request
    assert hits == (n - 1) * 64  # the later children find the first one's blocks


async def test_skyrl_sample_streams_every_choice_to_its_finish() -> None:
    body = {
        "token_ids": PROMPT,
        "sampling_params": {"max_tokens": 3, "n": 3},
        "stream_options": {"include_usage": True},
    }
    async with engine() as e:
        events = await e.stream("/inference/v1/generate", body)
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == []
    assert events[-2]["usage"]["completion_tokens"] == 9
    chunks = [ev["choices"][0] for ev in events[:-2]]
    assert sorted(c["index"] for c in chunks) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    finished = [c for c in chunks if c["finish_reason"]]
    assert sorted(c["index"] for c in finished) == [0, 1, 2]
    assert all(c["weight_versions"] for c in finished)
    assert all(c["weight_versions"] is None for c in chunks if not c["finish_reason"])


async def test_chat_logprobs_and_n_choices() -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 5,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 3,
    }
    async with engine() as e:
        status, answer = await e.post("/v1/chat/completions", body)
        events = await e.stream("/v1/chat/completions", body)
    assert status == 200
    for choice in answer["choices"]:
        content = choice["logprobs"]["content"]
        assert len(content) == 5
        assert "".join(entry["token"] for entry in content) == choice["message"]["content"]
        assert all(len(entry["top_logprobs"]) == 3 for entry in content)
        assert all(entry["top_logprobs"][0]["token"] == entry["token"] for entry in content)
    streamed = [ev["choices"][0] for ev in events[:-1] if ev["choices"][0]["logprobs"] is not None]
    assert len(streamed) == 10


async def test_prompt_logprobs_score_every_prompt_token_and_skip_the_cache_lookup() -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": 2, "logprobs": 1}
    async with engine() as e:
        _, first = await e.post("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 2})
        queries = await e.counter("vllm:prefix_cache_queries_total")
        status, answer = await e.post("/v1/completions", body)
        queries = await e.counter("vllm:prefix_cache_queries_total") - queries
        _, again = await e.post("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 2})
    assert status == 200
    scores = answer["choices"][0]["prompt_logprobs"]
    assert len(scores) == 80
    assert scores[0] is None
    for token, position in zip(PROMPT[1:], scores[1:], strict=True):
        assert str(token) in position
        assert 2 <= len(position) <= 3
        assert all(v["logprob"] <= 0 and v["rank"] >= 1 for v in position.values())
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # vLLM does not read the cache for them
    assert queries == 0
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 64


async def test_logprobs_cost_nothing_when_not_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*_: Any, **__: Any) -> Any:
        raise AssertionError("scored a request that asked for no logprobs")

    for module in (calls, generate):
        monkeypatch.setattr(module, "score_output", forbidden)
        monkeypatch.setattr(module, "score_prompt", forbidden)
    async with engine() as e:
        status, _ = await e.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "n": 2})
        assert status == 200
        status, _ = await e.post("/inference/v1/generate", {"token_ids": PROMPT, "sampling_params": {"max_tokens": 4}})
        assert status == 200
        await e.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
        status, answer = await e.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "logprobs": 1})
        assert status == 500  # the scorer is reached only when asked for
        assert "AssertionError" in answer["error"]["message"]


# -- against a real vLLM's answers, recorded by the conformance run ------------------------------------


async def test_engine_sim_answers_trainers_in_the_shapes_a_real_vllm_did() -> None:
    recorded = from_json(json.loads((Path(__file__).parent / "data" / TRAINER_JSON.name).read_text()))
    assert len(recorded.shapes) == len(SHAPE_CASES)
    sim = await observe_sim_trainer()
    rows = compare_trainer(recorded, sim)
    assert [row for row in rows if not row[4]] == []
    assert len(rows) == len(SHAPE_CASES) + len(recorded.accounting)


def test_shape_paths_see_types_lengths_and_top_k_sizes() -> None:
    k2 = {"top_logprobs": [{"a": -0.1, "b": -1.0}, {"c": -0.2, "d": -1.1, "e": -2.0}], "tokens": ["a", "c"]}
    shape = shape_paths({"choices": [{"logprobs": k2, "bytes": [1, 2, 3]}]}, k=2)
    assert shape["choices[].logprobs.top_logprobs[]#size"] == "k..k+1"  # 2 and 3 entries read alike
    assert shape["choices[].logprobs.top_logprobs[]{*}"] == "float"
    assert shape["choices[].logprobs.tokens#len"] == "2"
    assert "choices[].bytes#len" not in shape  # follows the tokenizer
    missing = shape_paths({"choices": [{"logprobs": None, "bytes": [1]}]}, k=2)
    assert missing["choices[].logprobs"] == "null"
    assert missing != shape
    too_many = shape_paths(
        {"choices": [{"logprobs": {"top_logprobs": [{"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0}]}}]}, k=2
    )
    assert too_many["choices[].logprobs.top_logprobs[]#size"] == "4"
