"""Admission queue, idle expiry and exact counts under load and races (DESIGN sections 1, 3, 9)."""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import pytest

from rolloutpool.dev.wait import wait_until_async
from routerkit import engines, no_leaked_tasks, router


async def test_queue_full_is_429_and_a_release_admits_the_waiting_session() -> None:
    async with engines(1) as urls, router(urls, cap=1, queue_max=1, queue_timeout_s=30.0, retry_after_s=3) as rt:
        assert (await rt.post("/v1/sessions", {"session_id": "a"}))[0] == 201
        waiting = asyncio.create_task(rt.post("/v1/sessions", {"session_id": "b"}))
        await wait_until_async(lambda: rt.manager.queue_depth == 1)
        status, body, resp = await rt.post("/v1/sessions", {"session_id": "c"})
        assert status == 429
        assert resp.headers["Retry-After"] == "3"
        assert body["error"]["type"] == "RateLimitError"
        assert await rt.metric("rolloutpool_router_queue_depth") == 1
        assert not waiting.done()
        assert (await rt.request("DELETE", "/v1/sessions/a"))[0] == 200
        status, body, _ = await waiting
        assert status == 201
        assert body["session_id"] == "b"
        assert rt.live() == {"e0": 1}
        assert rt.manager.queue_depth == 0
        assert await rt.metric("rolloutpool_router_admission_rejections_total", reason="queue_full") == 1
        assert await rt.metric("rolloutpool_router_queue_wait_seconds_count", outcome="admitted") == 1
    await no_leaked_tasks()


async def test_a_client_that_gives_up_in_the_queue_leaves_no_session_behind() -> None:
    async with engines(1) as urls, router(urls, cap=1, queue_timeout_s=30.0) as rt:
        assert (await rt.post("/v1/sessions", {"session_id": "a"}))[0] == 201
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as impatient:
            with pytest.raises(TimeoutError):
                await impatient.post(f"{rt.url}/v1/sessions", json={"session_id": "gave-up"})
        await wait_until_async(lambda: rt.manager.queue_depth == 0)  # the disconnect cancelled its wait
        assert (await rt.request("DELETE", "/v1/sessions/a"))[0] == 200
        await asyncio.sleep(0.2)  # a wrongly kept waiter would be admitted by now
        assert rt.live() == {"e0": 0}
        assert rt.manager.table.lookup("gave-up") is None
    await no_leaked_tasks()


async def test_releasing_a_queued_session_takes_it_out_of_the_queue() -> None:
    async with engines(1) as urls, router(urls, cap=1, queue_timeout_s=30.0) as rt:
        assert (await rt.post("/v1/sessions", {"session_id": "a"}))[0] == 201
        waiting = asyncio.create_task(rt.post("/v1/sessions", {"session_id": "b"}))
        await wait_until_async(lambda: rt.manager.queue_depth == 1)
        status, body, _ = await rt.post("/finish_session?session_id=b")
        assert (status, body["released"]) == (200, False)  # never live: nothing to release, but dequeued
        status, body, _ = await waiting
        assert status == 503
        assert "released while queued" in body["error"]["message"]
        assert rt.manager.queue_depth == 0
        assert (await rt.request("DELETE", "/v1/sessions/a"))[0] == 200
        assert rt.live() == {"e0": 0}
        reason = "released_while_queued"
        assert await rt.metric("rolloutpool_router_admission_rejections_total", reason=reason) == 1
    await no_leaked_tasks()


async def test_queue_timeout_is_503_and_a_proxied_request_waits_too() -> None:
    async with engines(1) as urls, router(urls, cap=1, queue_timeout_s=0.3, implicit=None) as rt:  # one-turn requests
        assert (await rt.complete("hello there", session="a"))[0] == 200
        started = time.monotonic()
        status, body, resp = await rt.post("/v1/sessions", {"session_id": "b"})
        assert status == 503
        assert "Retry-After" in resp.headers
        assert time.monotonic() - started < 10
        status, body, _ = await rt.complete("hello again", session="c")
        assert status == 503
        assert body["error"]["type"] == "ServiceUnavailableError"
        # a one-turn request queues as well, and its slot is freed when it completes
        queued = asyncio.create_task(rt.complete("one turn"))
        await wait_until_async(lambda: rt.manager.queue_depth == 1)
        assert (await rt.post("/finish_session?session_id=a"))[0] == 200
        assert (await queued)[0] == 200
        assert rt.live() == {"e0": 0}
    await no_leaked_tasks()


async def test_idle_sessions_expire_and_free_their_slot() -> None:
    async with (
        engines(1) as urls,
        router(urls, cap=1, idle_timeout_s=0.5, expiry_interval_s=0.1, queue_timeout_s=30.0) as rt,
    ):
        assert (await rt.post("/v1/sessions", {"session_id": "idle"}))[0] == 201
        status, _, _ = await rt.post("/v1/sessions", {"session_id": "next"})  # waits for the expiry
        assert status == 201
        assert rt.manager.lookup("idle") is None
        assert await rt.metric("rolloutpool_router_expiries_total") == 1
        assert (await rt.request("DELETE", "/v1/sessions/idle"))[0] == 404
        await wait_until_async(lambda: rt.manager.lookup("next") is None)
        assert rt.live() == {"e0": 0}
    await no_leaked_tasks()


async def test_ten_thousand_live_sessions_are_counted_exactly() -> None:
    async with engines(2) as urls, router(urls, cap=5000, queue_max=0) as rt:
        limit = asyncio.Semaphore(64)

        async def place(i: int) -> str:
            async with limit:
                status, body, _ = await rt.post("/v1/sessions", {"session_id": f"s{i}"})
                assert status == 201, body
                return str(body["replica"]["name"])

        names = await asyncio.gather(*(place(i) for i in range(10_000)))
        assert names.count("e0") == names.count("e1") == 5000
        assert rt.live() == {"e0": 5000, "e1": 5000}
        status, _, _ = await rt.post("/v1/sessions", {"session_id": "one-too-many"})
        assert status == 429  # queue_max=0: every replica is at its cap
        assert await rt.metric("rolloutpool_router_live_sessions") == 10_000

        async def release(i: int) -> None:
            async with limit:
                status, _ = await rt.request("DELETE", f"/v1/sessions/s{i}")
                assert status == 200

        await asyncio.gather(*(release(i) for i in range(0, 10_000, 4)))
        assert sum(rt.live().values()) == 7500
        assert await rt.metric("rolloutpool_router_live_sessions") == 7500
        assert await rt.metric("rolloutpool_router_releases_total", how="delete") == 2500
        assert rt.manager.queue_depth == 0
        assert all(r.inflight == 0 for r in rt.manager.table.replicas.values())
    await no_leaked_tasks()


async def test_concurrent_requests_and_releases_of_one_session_keep_counts_exact() -> None:
    rng = random.Random(7)
    async with engines(2) as urls, router(urls, cap=50) as rt:

        async def turn(sid: str) -> None:
            status, _, _ = await rt.complete(f"turn of {sid} " * 5, session=sid, max_tokens=4)
            assert status in {200, 503}

        async def finish(sid: str) -> None:
            status, _, _ = await rt.post(f"/finish_session?session_id={sid}")
            assert status in {200, 404}

        async def delete(sid: str) -> None:
            status, _ = await rt.request("DELETE", f"/v1/sessions/{sid}")
            assert status in {200, 404}

        ops = []
        for i in range(30):
            sid = f"race{i}"
            ops += [turn(sid), turn(sid), turn(sid), finish(sid), delete(sid)]
        rng.shuffle(ops)
        checks = 0

        async def audit() -> None:
            nonlocal checks
            while True:
                counts = rt.live()  # asserts live == sessions held, per replica and in total
                assert all(c >= 0 for c in counts.values())
                checks += 1
                await asyncio.sleep(0.005)

        auditor = asyncio.create_task(audit())
        await asyncio.gather(*ops)
        auditor.cancel()
        await asyncio.gather(auditor, return_exceptions=True)
        assert checks > 0
        live = rt.live()
        placements = await rt.metric("rolloutpool_router_placements_total")
        releases = await rt.metric("rolloutpool_router_releases_total")
        assert placements - releases == sum(live.values())
        for sid in list(rt.manager.table.sessions):
            assert (await rt.request("DELETE", f"/v1/sessions/{sid}"))[0] == 200
        assert rt.live() == {"e0": 0, "e1": 0}
        assert all(r.inflight == 0 for r in rt.manager.table.replicas.values())
    await no_leaked_tasks()
