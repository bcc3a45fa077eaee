"""Sessionless clients keep their replica: implicit sessions on real routers and engines (docs/sessionless-clients.md).

The first tests run our router in process in front of engine simulators; the last ones run the
bench's real processes (two engine-sims, our router, vllm-router ``cache_aware``) with concurrent
sessionless rollouts, and compare lost turns and prefix-hit ratios.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from rolloutpool.dev.bench.sessionless import SessionlessConfig, measure
from rolloutpool.routing.implicit import ImplicitConfig
from routerkit import MODEL, engines, router, sse

VLLM_ROUTER = shutil.which("vllm-router") or shutil.which("vllm-router", path=str(Path(sys.executable).parent))


def _messages(task: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "agent"}, {"role": "user", "content": task}]


async def _chat(r: Any, messages: list[dict[str, Any]], *, seed: int = 0) -> tuple[dict[str, Any], str | None]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "seed": seed}
    async with r.http.post(f"{r.url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json(), resp.headers.get("X-RolloutPool-Replica")


async def test_a_sessionless_chat_returns_to_its_replica_as_one_session() -> None:
    async with engines(2) as urls, router(urls) as r:
        conversations = [_messages(f"task {i} " + "word " * 50) for i in range(4)]
        first = await asyncio.gather(*(_chat(r, m) for m in conversations))
        assert len(r.manager.table.sessions) == 4  # four live implicit sessions, not one-turn ones
        for messages, (data, _) in zip(conversations, first, strict=True):
            messages += [data["choices"][0]["message"], {"role": "user", "content": "tool said " + "x " * 30}]
        second = await asyncio.gather(*(_chat(r, m) for m in conversations))
        assert [rep for _, rep in second] == [rep for _, rep in first]
        for data, _ in second:
            assert data["usage"]["prompt_tokens_details"]["cached_tokens"] > 50
        assert len(r.manager.table.sessions) == 4
        assert await r.metric("rolloutpool_router_implicit_sessions_total", outcome="matched") == 4
        assert await r.metric("rolloutpool_router_implicit_sessions_total", outcome="created") == 4


async def test_a_streamed_answer_is_the_tip_of_the_next_turn() -> None:
    async with engines(2) as urls, router(urls) as r:
        messages = _messages("streamed task " + "w " * 60)
        body = {"model": MODEL, "messages": messages, "max_tokens": 8, "stream": True}
        async with r.http.post(f"{r.url}/v1/chat/completions", json=body) as resp:
            events = await sse(resp)
            replica = resp.headers["X-RolloutPool-Replica"]
        text = "".join(
            e["choices"][0]["delta"].get("content") or "" for e in events if isinstance(e, dict) and e["choices"]
        )
        implicit = r.service.proxy.implicit
        assert implicit is not None
        (first,) = implicit.index.sessions.values()
        assert first.tips  # the stream's text made the tip
        # a second, unrelated conversation takes the other replica; the continuation must not follow load
        await _chat(r, _messages("another task " + "v " * 60))
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
        _, again = await _chat(r, messages)
        assert again == replica
        assert await r.metric("rolloutpool_router_implicit_sessions_total", outcome="matched") == 1


async def test_grpo_samples_of_one_prompt_are_separate_sessions_in_one_group() -> None:
    async with engines(2) as urls, router(urls) as r:
        prompt = _messages("shared prompt " + "p " * 60)
        results = await asyncio.gather(*(_chat(r, list(prompt), seed=i) for i in range(4)))  # samples differ
        sessions = r.manager.table.sessions
        assert len(sessions) == 4
        assert len({s.group for s in sessions.values()}) == 1
        assert await r.metric("rolloutpool_router_implicit_sessions_total", outcome="forked") == 3
        for data, replica in results:  # each sample's next turn returns to its own session
            nxt = [*prompt, data["choices"][0]["message"], {"role": "user", "content": "go on"}]
            _, again = await _chat(r, nxt)
            assert again == replica
        assert len(sessions) == 4


async def test_token_id_completions_without_model_continue_their_session() -> None:
    async with engines(2) as urls, router(urls) as r:
        prompt = list(range(1000, 1200))
        body = {"prompt": prompt, "max_tokens": 20, "logprobs": 0, "return_tokens_as_token_ids": True}
        async with r.http.post(f"{r.url}/v1/completions", json=body) as resp:
            data, replica = await resp.json(), resp.headers["X-RolloutPool-Replica"]
        out = [int(t.split(":")[1]) for t in data["choices"][0]["logprobs"]["tokens"]]
        body["prompt"] = prompt + out + list(range(5000, 5040))
        async with r.http.post(f"{r.url}/v1/completions", json=body) as resp:
            again = await resp.json()
            assert resp.headers["X-RolloutPool-Replica"] == replica
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 200
        (sid,) = r.manager.table.sessions
        assert sid.startswith("implicit-")


async def test_idle_implicit_sessions_are_released_and_do_not_count_as_finished() -> None:
    implicit = ImplicitConfig(idle_timeout_s=0.2)
    async with engines(1) as urls, router(urls, implicit=implicit, expiry_interval_s=0.1) as r:
        await _chat(r, _messages("one"))
        assert len(r.manager.table.sessions) == 1
        for _ in range(50):
            if not r.manager.table.sessions:
                break
            await asyncio.sleep(0.05)
        assert not r.manager.table.sessions
        assert await r.metric("rolloutpool_router_releases_total", how="implicit_idle") == 1
        assert r.service.proxy.implicit is not None
        assert not r.service.proxy.implicit.index.sessions


async def test_implicit_sessions_are_not_renewed() -> None:
    async with engines(1) as urls, router(urls, renew_every_s=0.05) as r:
        await _chat(r, _messages("one " * 40))
        await asyncio.sleep(0.3)
        assert r.service.renewer is not None
        assert r.service.renewer.records == {}
        assert await r.metric("rolloutpool_router_renewals_total") == 0


async def test_without_implicit_sessions_a_sessionless_request_is_one_turn() -> None:
    async with engines(2) as urls, router(urls, implicit=None) as r:
        await _chat(r, _messages("one"))
        assert not r.manager.table.sessions
        assert await r.metric("rolloutpool_router_implicit_sessions_total") == 0


# -- real processes: the bench's measurement ------------------------------------------------------

SMALL = SessionlessConfig(rollouts=6, turns=3, group_size=3, prompt_tokens=400, observation_tokens=100)


@pytest.mark.parametrize("workload", ["art", "areal"])
def test_sessionless_rollouts_lose_no_turn_and_hit_as_with_ids_and_cache_aware(workload: str, tmp_path: Path) -> None:
    if VLLM_ROUTER is None:
        pytest.skip("vllm-router binary not installed (pip install vllm-router)")
    cfg = SessionlessConfig(**{**SMALL.__dict__, "vllm_router_bin": VLLM_ROUTER})
    ours = measure("ours", workload, cfg, log_dir=tmp_path)
    ids = measure("ours-ids", workload, cfg, log_dir=tmp_path)
    peer = measure("cache-aware", workload, cfg, log_dir=tmp_path)
    assert ours.errors == ids.errors == peer.errors == 0
    assert ours.later_turns == 12
    assert ours.lost_turns == 0
    assert ours.moved_turns == 0
    assert ours.hit_ratio == pytest.approx(ids.hit_ratio, abs=0.01)
    assert ours.hit_ratio >= peer.hit_ratio - 0.01


def test_without_implicit_sessions_the_same_rollouts_lose_turns(tmp_path: Path) -> None:
    """The measurement can fail: one-turn sessions spread a rollout's turns over both engines."""
    off = measure("ours-off", "art", SMALL, log_dir=tmp_path)
    ours = measure("ours", "art", SMALL, log_dir=tmp_path)
    assert off.lost_turns > 0
    assert off.hit_ratio < ours.hit_ratio
