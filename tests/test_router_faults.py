"""Failures, quarantine, the admin API, restarts and shutdown of the router (DESIGN sections 1, 3, 9).

Upstreams are real engine simulators; a tiny fault-injecting replica stands in for
a replica that dies mid-stream or hangs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

from rolloutpool.dev.wait import wait_until_async
from rolloutpool.routing.quarantine import QuarantineConfig
from routerkit import MODEL, FaultyReplica, engines, no_leaked_tasks, router, serve, sse

TOKEN = "s3cret-admin-token"  # noqa: S105 - a test fixture, not a credential


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def test_replica_dying_mid_stream_ends_the_stream_and_the_session_moves() -> None:
    faulty = FaultyReplica("die")
    async with serve(faulty.app()) as (bad_url, _), engines(1) as urls, router({"bad": bad_url, **urls}) as rt:
        body = {"model": MODEL, "prompt": "tell me", "max_tokens": 8, "stream": True}
        async with rt.http.post(f"{rt.url}/v1/completions", json=body, headers={"X-Session-ID": "s"}) as resp:
            assert resp.status == 200
            assert resp.headers["X-RolloutPool-Replica"] == "bad"
            events = await sse(resp)
        assert [e["choices"][0]["text"] for e in events[:2]] == ["one", "two"]
        assert events[-1]["error"]["code"] == 502
        assert "[DONE]" not in events
        assert rt.manager.lookup("s") is None  # unbound: placed again on its next turn
        assert not rt.manager.replica("bad").ready
        status, body, replica = await rt.complete("tell me again", session="s")
        assert (status, replica) == (200, "e0")
        assert rt.live() == {"bad": 0, "e0": 1}
        assert await rt.metric("rolloutpool_router_upstream_errors_total", replica="bad") == 1
        # a connection refused is a 502 as well, and the router keeps serving
        faulty.calls = 0
        rt.manager.set_ready("bad", True)
        status, body, _ = await rt.complete("hello", session="t")
        assert status == 502
        assert body["error"]["type"] == "BadGatewayError"
        assert (await rt.complete("hello", session="t"))[0] == 200
        await wait_until_async(lambda: rt.manager.runtime["bad"].scrape_failures >= 3)
        assert not rt.manager.replica("bad").ready
        assert (await rt.request("GET", "/readyz"))[0] == 200
    await no_leaked_tasks()


async def test_hanging_replica_is_a_504_within_the_timeout() -> None:
    faulty = FaultyReplica("hang")
    async with (
        serve(faulty.app()) as (bad_url, _),
        engines(1) as urls,
        router({"bad": bad_url, **urls}, upstream_timeout_s=0.5, admin_token=TOKEN) as rt,
    ):
        started = time.monotonic()
        status, body, _ = await rt.complete("are you there", session="s")
        assert status == 504
        assert body["error"]["type"] == "GatewayTimeoutError"
        assert time.monotonic() - started < 10
        assert rt.manager.lookup("s") is None
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (await rt.request("POST", "/admin/replicas/bad/drain", headers=auth))[0] == 200
        status, body, replica = await rt.complete("are you there", session="s")
        assert (status, replica) == (200, "e0")
        assert await rt.metric("rolloutpool_router_upstream_errors_total", kind="timeout") == 1
    await no_leaked_tasks()


async def test_collapsing_cached_tokens_quarantine_the_replica() -> None:
    quarantine = QuarantineConfig(
        min_evicted_tokens=32, evicted_fraction=0.25, min_window_tokens=32, hold_seconds=600, waiting_scrapes=1000
    )
    async with (
        engines(1, num_gpu_blocks=48, max_model_len=512) as urls,
        # placement only (no turn scheduling, which would keep A's prefix by holding the turns that evict it)
        router(urls, quarantine=quarantine, queue_timeout_s=0.3, admin_token=TOKEN, turns=None) as rt,
    ):
        prompts, outputs = {}, {}
        for sid in "ABCDE":  # 5 x 13 blocks do not fit in 47: A's idle prefix is evicted (tail first)
            prompts[sid] = words(sid, 200)
            status, body, _ = await rt.complete(prompts[sid], session=sid)
            assert status == 200
            outputs[sid] = body["choices"][0]["text"]
        assert not rt.manager.replica("e0").quarantined
        status, body, _ = await rt.complete(f"{prompts['A']}{outputs['A']} {words('x', 5)}", session="A")
        assert status == 200
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] < 100
        status, admin = await rt.request("GET", "/admin/replicas", headers={"Authorization": f"Bearer {TOKEN}"})
        row = admin["replicas"][0]
        assert (row["quarantined"], row["quarantine_reason"]) == (True, "Evicting")
        assert row["signals"]["capacity_tokens"] == 48 * 16
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total", replica="e0") >= 192
        assert await rt.metric("rolloutpool_router_quarantines_total", reason="Evicting") == 1
        assert (await rt.post("/v1/sessions", {"session_id": "new"}))[0] == 503  # no new sessions
        assert (await rt.complete(f"{prompts['B']}{outputs['B']} more", session="B"))[0] == 200  # sticky ones go on
        assert (await rt.request("DELETE", "/v1/sessions/C"))[0] == 200  # a finished session lifts it
        assert not rt.manager.replica("e0").quarantined
        assert (await rt.post("/v1/sessions", {"session_id": "new"}))[0] == 201
    await no_leaked_tasks()


async def test_admin_api_needs_the_token_and_never_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with engines(2) as urls, router(urls, admin_token=TOKEN) as rt:
        assert (await rt.request("GET", "/admin/replicas"))[0] == 401
        assert (await rt.request("GET", "/admin/replicas", headers={"Authorization": "Bearer wrong"}))[0] == 401
        assert (await rt.request("POST", "/admin/replicas/e0/drain", headers={"Authorization": TOKEN}))[0] == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, body = await rt.request("POST", "/admin/replicas/e0/drain", headers=auth)
        assert (status, body["draining"]) == (200, True)
        assert (await rt.request("POST", "/admin/replicas/zz/drain", headers=auth))[0] == 404
        for i in range(3):
            assert (await rt.post("/v1/sessions", {"session_id": f"s{i}"}))[1]["replica"]["name"] == "e1"
        status, body = await rt.request("GET", "/admin/replicas", headers=auth)
        assert status == 200
        rows = {r["name"]: r for r in body["replicas"]}
        assert (rows["e0"]["draining"], rows["e1"]["live_sessions"], rows["e1"]["ready"]) == (True, 3, True)
        assert "waiting" in rows["e1"]["signals"]
        assert (await rt.request("POST", "/admin/replicas/e0/drain?undo=true", headers=auth))[1]["draining"] is False
    async with engines(1) as urls, router(urls) as rt:
        assert (await rt.request("GET", "/admin/replicas", headers={"Authorization": f"Bearer {TOKEN}"}))[0] == 403
    assert TOKEN not in caplog.text
    await no_leaked_tasks()


async def test_restart_restores_sessions_without_double_counting(tmp_path: Path) -> None:
    state = tmp_path / "router-state.json"
    async with engines(2) as urls:
        async with router(urls, state_path=state, state_debounce_s=0.05) as rt:
            for i in range(5):
                assert (await rt.complete(words(f"s{i}", 30), session=f"s{i}"))[0] == 200
            assert (await rt.request("DELETE", "/v1/sessions/s4"))[0] == 200
            before = rt.live()
            homes = {sid: s.replica for sid, s in rt.manager.table.sessions.items()}
            contexts = {sid: s.context_tokens for sid, s in rt.manager.table.sessions.items()}
            await wait_until_async(state.exists)
        saved = json.loads(state.read_text())
        assert len(saved["sessions"]) == 4
        async with router(urls, state_path=state, state_debounce_s=0.05) as rt:
            assert rt.live() == before
            assert {sid: s.replica for sid, s in rt.manager.table.sessions.items()} == homes
            assert {sid: s.context_tokens for sid, s in rt.manager.table.sessions.items()} == contexts
            for sid, home in homes.items():
                status, body, replica = await rt.complete(words(sid, 40), session=sid)
                assert (status, replica) == (200, home)
                status, body, _ = await rt.post("/v1/sessions", {"session_id": sid})
                assert (status, body["created"]) == (200, False)
            assert rt.live() == before
            assert (await rt.request("DELETE", "/v1/sessions/s0"))[0] == 200
            assert (await rt.request("DELETE", "/v1/sessions/s0"))[0] == 404
        # a restart without replica e1: its sessions are dropped, e0's are kept
        async with router({"e0": urls["e0"]}, state_path=state) as rt:
            expected = sum(1 for sid, home in homes.items() if home == "e0" and sid != "s0")
            assert rt.live() == {"e0": expected}
    state.write_text("{not json")
    async with engines(1) as urls, router(urls, state_path=state) as rt:
        assert rt.live() == {"e0": 0}  # an unreadable snapshot is a fresh start
    await no_leaked_tasks()


async def test_shutdown_finishes_in_flight_requests_and_fails_queued_ones() -> None:
    async with (
        engines(1, time_scale=1.0) as urls,
        router(urls, cap=1, queue_timeout_s=30.0, shutdown_timeout_s=20.0) as rt,
    ):
        body = {"model": MODEL, "prompt": "a slow answer", "max_tokens": 60, "stream": True}
        async with rt.http.post(f"{rt.url}/v1/completions", json=body, headers={"X-Session-ID": "a"}) as resp:
            assert resp.status == 200
            queued = asyncio.create_task(rt.post("/v1/sessions", {"session_id": "b"}))
            await wait_until_async(lambda: rt.manager.queue_depth == 1)
            assert rt.manager.replica("e0").inflight == 1
            stopping = asyncio.create_task(rt.runner.cleanup())
            status, _, _ = await queued
            assert status == 503
            events = await sse(resp)
        assert events[-1] == "[DONE]"
        await stopping
    await no_leaked_tasks()
