"""Weight updates without false alarms, and the fan-out of weight-sync calls (real router, real engine-sim)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from rolloutpool.dev.wait import wait_until_async
from rolloutpool.engine.server.app import ServerConfig, build_app
from rolloutpool.engine.server.rl import RL_CONTROL, RLControl
from rolloutpool.router.admin import fan_out_status
from rolloutpool.routing.quarantine import PressureState, QuarantineConfig
from rolloutpool.routing.weights import (
    WeightTracker,
    call_flushes,
    flush_operations_total,
    law_holds,
    observe_scrape_excused,
    reprefill_excuse,
)
from routerkit import ENGINE_DEFAULTS, MODEL, killable_engine, no_leaked_tasks, router, serve

TOKEN = "s3cret"  # noqa: S105 - a test token
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# -- pure decisions ---------------------------------------------------------------------


def test_reprefill_excuse() -> None:
    assert reprefill_excuse(previous=None, replica="a", epoch=3, salt=None) is None
    assert reprefill_excuse(previous=("a", 2, None), replica="a", epoch=3, salt=None) == "WeightUpdate"
    assert reprefill_excuse(previous=("a", 3, None), replica="a", epoch=3, salt=None) is None
    assert reprefill_excuse(previous=("a", 3, "v1"), replica="a", epoch=3, salt="v2") == "CacheSaltChanged"
    assert reprefill_excuse(previous=("b", 0, "v1"), replica="a", epoch=5, salt="v1") is None  # moved: not ours


def test_call_flushes_follows_vllm_defaults() -> None:
    assert call_flushes("pause", {})
    assert call_flushes("pause", {"mode": "keep", "clear_cache": "true"})
    assert not call_flushes("pause", {"clear_cache": "false"})
    assert call_flushes("update_weights", {})
    assert call_flushes("reset_prefix_cache", {})
    assert not call_flushes("resume", {})
    assert not call_flushes("update_weight_version", {})


def test_flush_operations_total_reads_engine_metrics() -> None:
    text = (
        'vllm:rl_weight_update_operation_duration_seconds_count{model_name="m",operation="pause"} 2.0\n'
        'vllm:rl_weight_update_operation_duration_seconds_count{model_name="m",operation="resume"} 2.0\n'
        'vllm:rl_weight_update_operation_duration_seconds_count{model_name="m",operation="update_weights"} 1.0\n'
        'vllm:rl_weight_update_operation_duration_seconds_sum{model_name="m",operation="pause"} 9.0\n'
    )
    assert flush_operations_total(text) == 3.0
    assert flush_operations_total("vllm:num_requests_waiting 0\n") is None


def test_tracker_excuses_one_turn_per_session_after_a_flush() -> None:
    t = WeightTracker()
    assert t.excuse("s", "a") is None  # a first turn: nothing to compare with
    assert t.excuse("s", "a") is None
    t.flushed("a", now=10.0)
    assert t.in_grace("a", now=20.0)
    assert not t.in_grace("a", now=100.0)
    assert t.excuse("s", "a") == "WeightUpdate"
    assert t.excuse("s", "a") is None  # once
    t.flushed("b", now=11.0)
    assert t.excuse("s", "a") is None  # another replica's flush
    t.note_salt("s", "v2")
    assert t.excuse("s", "a") == "CacheSaltChanged"
    t.note_salt("s", "v2")
    assert t.excuse("s", "a") is None
    assert not t.observe_engine_ops("a", 1.0, now=0.0)  # the first count is a baseline
    assert t.observe_engine_ops("a", 2.0, now=1.0)
    assert not t.observe_engine_ops("b", None, now=0.0)
    assert t.observe_engine_ops("b", 1.0, now=1.0)  # the series appears at the first operation
    t.forget("s")
    t.flushed("a", now=12.0)
    assert t.excuse("s", "a") is None  # a reused id starts afresh


def test_law_holds_and_excused_scrapes() -> None:
    assert law_holds(weight_updates=1.0, reason="Queueing")
    assert law_holds(weight_updates=1.0, reason="Preempting")
    assert not law_holds(weight_updates=1.0, reason="LivePrefixEviction")  # the router already excused the update
    assert not law_holds(weight_updates=0.0, reason="Queueing")
    assert not law_holds(weight_updates=None, reason="Queueing")
    assert not law_holds(weight_updates=2.0, reason=None)
    state = PressureState(QuarantineConfig(waiting_scrapes=1))
    state.observe_scrape(now=0.0, preemptions_total=0.0, waiting=0.0)
    observe_scrape_excused(state, now=1.0, preemptions_total=50.0)
    assert not state.quarantined
    state.observe_scrape(now=2.0, preemptions_total=50.0, waiting=0.0)
    assert not state.quarantined  # the burst's preemptions are not seen later either
    assert fan_out_status(ok=2, failed=0) == 200
    assert fan_out_status(ok=1, failed=2) == 207
    assert fan_out_status(ok=0, failed=2) == 502
    assert fan_out_status(ok=0, failed=0) == 503


# -- real processes ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def rl_engines(count: int, **overrides: Any) -> AsyncIterator[tuple[dict[str, str], list[RLControl]]]:
    settings = {**ENGINE_DEFAULTS, **overrides}
    async with contextlib.AsyncExitStack() as stack:
        urls, controls = {}, []
        for i in range(count):
            app = build_app(ServerConfig(seed=i, **settings))
            url, _ = await stack.enter_async_context(serve(app))
            urls[f"e{i}"] = url
            controls.append(app[RL_CONTROL])
        yield urls, controls


_HISTORY: dict[tuple[int, str], str] = {}


def _conversation(sid: str, turn: int, rt: Any = None) -> str:
    """The prompt of a session's turn: its previous prompt, the reply it got, and a new observation."""
    text = _HISTORY.get((id(rt), sid), "")
    return text + f" {sid} observes turn {turn}: the weather, the sea, the wind and the tide" * 4


async def _turns(rt: Any, sids: list[str], turn: int) -> list[int]:
    cached = []
    for sid in sids:
        prompt = _conversation(sid, turn, rt)
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 8}
        status, answer, _ = await rt.post("/v1/completions", body, headers={"X-Session-ID": sid})
        assert status == 200, answer
        _HISTORY[id(rt), sid] = prompt + answer["choices"][0]["text"]
        cached.append(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
    return cached


async def test_fanned_out_update_is_not_eviction_but_a_silent_flush_is() -> None:
    async with rl_engines(2) as (urls, controls), router(urls, admin_token=TOKEN) as rt:
        sids = [f"s{i}" for i in range(6)]
        await _turns(rt, sids, 0)
        assert min(await _turns(rt, sids, 1)) > 0  # warm: cached prefixes
        for call in ("pause?mode=abort", "update_weights", "resume"):
            status, body, _ = await rt.post(f"/admin/rl/{call}", {} if call == "update_weights" else None, headers=AUTH)
            assert status == 200, body
            assert body["ok"] == 2
        assert all(c.weight_version == 1 for c in controls)
        assert max(await _turns(rt, sids, 2)) == 0  # every live session re-prefilled ...
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total") == 0  # ... and it is not eviction
        assert await rt.metric("rolloutpool_router_quarantines_total") == 0
        assert min(await _turns(rt, sids, 3)) > 0
        # the control: the same flush that nobody announced is counted as eviction
        for c in controls:
            assert c.runner.engine.pool.reset_prefix_cache()
        await _turns(rt, sids, 4)
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total") > 0
    await no_leaked_tasks()


async def test_an_update_the_trainer_sends_to_the_engines_directly_is_seen_in_their_metrics() -> None:
    async with rl_engines(1) as (urls, _), router(urls) as rt, aiohttp.ClientSession() as http:
        await _turns(rt, ["a", "b"], 0)
        await _turns(rt, ["a", "b"], 1)
        before = rt.manager.weights.flushes
        async with http.post(f"{urls['e0']}/update_weights", json={}) as resp:
            assert resp.status == 200
        await wait_until_async(lambda: rt.manager.weights.flushes > before)  # the next scrape
        assert max(await _turns(rt, ["a", "b"], 2)) == 0
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total") == 0
    await no_leaked_tasks()


async def test_a_new_cache_salt_re_prefills_without_counting_as_eviction() -> None:
    async with rl_engines(1) as (urls, _), router(urls) as rt:

        async def turn(turn: int, salt: str) -> int:
            prompt = _conversation("x", turn, rt)
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "cache_salt": salt}
            status, answer, _ = await rt.post("/v1/completions", body, headers={"X-Session-ID": "x"})
            assert status == 200
            _HISTORY[id(rt), "x"] = prompt + answer["choices"][0]["text"]
            return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])

        await turn(0, "policy-1")
        assert await turn(1, "policy-1") > 0
        assert await turn(2, "policy-2") == 0  # a new policy version shares no block with the old one
        assert await turn(3, "policy-2") > 0
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total") == 0
    await no_leaked_tasks()


@contextlib.asynccontextmanager
async def hanging_replica() -> AsyncIterator[str]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_waiting 0.0\nvllm:num_preemptions_total 0.0\n")

    async def hang(request: web.Request) -> web.Response:
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.05)
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_route("*", "/{call}", hang)
    async with serve(app) as (url, _):
        yield url


async def test_fan_out_with_one_replica_hanging_and_one_down_answers_207_in_time() -> None:
    async with (
        rl_engines(1) as (urls, controls),
        hanging_replica() as hung,
        killable_engine(seed=5, **ENGINE_DEFAULTS) as dead,
    ):
        replicas = {"ok": urls["e0"], "hung": hung, "dead": dead.url}
        async with router(replicas, admin_token=TOKEN, unready_after_failures=1000) as rt:
            await dead.kill()
            started = asyncio.get_running_loop().time()
            status, body, _ = await rt.post("/admin/rl/pause?mode=keep&timeout_s=0.5", headers=AUTH)
            assert asyncio.get_running_loop().time() - started < 3.0  # in parallel, each with its timeout
            assert status == 207
            rows = {r["name"]: r for r in body["replicas"]}
            assert (rows["ok"]["ok"], rows["ok"]["status"], rows["ok"]["body"]["mode"]) == (True, 200, "keep")
            assert rows["hung"]["error"] == "timeout after 0.5 s"
            assert rows["dead"]["error"].startswith("unreachable")
            assert (body["ok"], body["failed"], body["query"]) == (1, 2, {"mode": "keep"})
            assert controls[0].paused == "keep"
            assert set(rt.manager.weights.flushed_at) == {"ok"}  # only where the flushing call succeeded
            status, body, _ = await rt.post("/admin/rl/resume?timeout_s=0.5", headers=AUTH)
            assert status == 207
            assert controls[0].paused is None
            # bad calls change nothing
            assert (await rt.post("/admin/rl/pause"))[0] == 401
            assert (await rt.post("/admin/rl/format_disk", headers=AUTH))[0] == 404
            assert (await rt.post("/admin/rl/pause?timeout_s=-1", headers=AUTH))[0] == 400
            assert (await rt.post("/admin/rl/pause", headers={"Authorization": "Bearer nope"}))[0] == 401
            assert controls[0].paused is None
    await no_leaked_tasks()


async def test_admin_fan_out_is_disabled_without_a_token() -> None:
    async with rl_engines(1) as (urls, controls), router(urls) as rt:
        assert (await rt.post("/admin/rl/pause"))[0] == 403
        assert controls[0].paused is None
    await no_leaked_tasks()


async def test_keep_pause_outlasting_a_client_timeout_keeps_counts_exact() -> None:
    async with rl_engines(2, time_scale=50.0) as (urls, controls), router(urls, admin_token=TOKEN) as rt:
        await _turns(rt, ["k1", "k2"], 0)
        assert (await rt.post("/admin/rl/pause?mode=keep", headers=AUTH))[0] == 200
        body = {"model": MODEL, "prompt": _conversation("k1", 1), "max_tokens": 8}
        with pytest.raises(TimeoutError):
            async with rt.http.post(
                f"{rt.url}/v1/completions",
                json=body,
                headers={"X-Session-ID": "k1"},
                timeout=aiohttp.ClientTimeout(total=0.5),
            ) as resp:
                await resp.read()
        await wait_until_async(lambda: not rt.manager.busy("k1"))
        assert sum(rt.live().values()) == 2  # the session stays; nothing went negative
        assert (await rt.post("/admin/rl/resume", headers=AUTH))[0] == 200
        await _turns(rt, ["k1", "k2"], 1)
        assert sum(rt.live().values()) == 2
        await wait_until_async(lambda: all(c.runner.in_flight == 0 for c in controls))
    await no_leaked_tasks()


async def test_flush_while_a_thousand_sessions_are_live() -> None:
    async with rl_engines(2) as (urls, _), router(urls, admin_token=TOKEN, cap=600) as rt:
        placed = await asyncio.gather(*(rt.post("/v1/sessions", {"session_id": f"p{i}"}) for i in range(1000)))
        assert all(p[0] == 201 for p in placed)
        sids = [f"w{i}" for i in range(10)]
        await _turns(rt, sids, 0)
        await _turns(rt, sids, 1)
        for call in ("pause", "update_weights", "resume"):
            status, _, _ = await rt.post(f"/admin/rl/{call}", {} if call == "update_weights" else None, headers=AUTH)
            assert status == 200
        live = rt.live()
        assert sum(live.values()) == 1010
        assert all(v >= 0 for v in live.values())
        assert max(await _turns(rt, sids, 2)) == 0
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total") == 0
        finished = await asyncio.gather(*(rt.post(f"/finish_session?session_id=p{i}") for i in range(1000)))
        assert all(f[0] == 200 for f in finished)
        assert sum(rt.live().values()) == 10
    await no_leaked_tasks()


# -- the operator's law -----------------------------------------------------------------


def test_the_law_holds_through_a_weight_update_and_cuts_without_one() -> None:
    from rolloutpool.autoscale import LawParams, ReplicaControl, ReplicaSignals, decide_replica  # noqa: PLC0415
    from rolloutpool.metrics.promql import assemble_signals, build_queries  # noqa: PLC0415

    params = LawParams()
    previous = ReplicaControl(target=0.9, changed_at=0.0)
    burst = {"kv_usage": 0.9, "waiting": 40.0, "preemptions_per_s": 1.0}
    cut = decide_replica(previous=previous, signals=ReplicaSignals(**burst), params=params, now=1000.0)
    assert cut.target is not None
    assert cut.target < 0.9
    assert cut.quarantined
    held = decide_replica(
        previous=previous, signals=ReplicaSignals(**burst, weight_updates=2.0), params=params, now=1000.0
    )
    assert (held.target, held.quarantined, held.reason) == (0.9, False, "WeightUpdate")
    query = build_queries(namespace="ns", replicas=["a"], window_seconds=120)["weight_updates"]
    assert "increase(vllm:rl_weight_update_operation_duration_seconds_count{" in query
    assert 'operation=~"pause|reset_prefix_cache|update_weights"' in query
    answer = {"weight_updates": [{"metric": {"pod": "a"}, "value": [0, "3"]}], "kv_usage": []}
    assert assemble_signals(answer, replicas=["a"])["a"] == ReplicaSignals(weight_updates=3.0)
