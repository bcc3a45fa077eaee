"""``/finish_session`` as vllm-router answers it, and ``GET /health`` (real router, real engine-sim)."""

from __future__ import annotations

import asyncio

from rolloutpool.dev.wait import wait_until_async
from routerkit import MODEL, engines, no_leaked_tasks, router


async def test_finish_session_is_200_and_idempotent_for_known_unknown_and_repeated_ids() -> None:
    async with engines(2) as urls, router(urls) as rt:
        assert (await rt.complete("hello there", session="a"))[0] == 200
        status, body, _ = await rt.post("/finish_session?session_id=a")
        assert status == 200
        assert body["status"] == "ok"
        assert body["session_id"] == "a"
        assert body["released"] is True
        assert body["deferred"] is False
        assert body["replica"] in urls
        for sid in ("a", "a", "never-seen"):
            status, body, _ = await rt.post(f"/finish_session?session_id={sid}")
            assert (status, body["status"], body["released"], body["replica"]) == (200, "ok", False, None)
        status, body, _ = await rt.post("/finish_session", {"session_id": "a"})  # the id in a JSON body
        assert (status, body["released"]) == (200, False)
        assert await rt.metric("rolloutpool_router_releases_total", how="finish_session") == 1
        assert rt.live() == {"e0": 0, "e1": 0}
        status, body, _ = await rt.post("/finish_session")
        assert status == 400
        assert body["error"]["param"] == "session_id"
        # DELETE keeps its strict answer: an unknown id is a 404
        assert (await rt.request("DELETE", "/v1/sessions/a"))[0] == 404
    await no_leaked_tasks()


async def test_finish_during_a_turn_in_flight_answers_at_once_and_releases_when_the_turn_ends() -> None:
    async with engines(1, time_scale=20.0) as urls, router(urls) as rt:
        body = {"model": MODEL, "prompt": "a long answer please", "max_tokens": 400}
        turn = asyncio.create_task(rt.post("/v1/completions", body, headers={"X-Session-ID": "busy"}))
        await wait_until_async(lambda: rt.manager.busy("busy"))
        started = asyncio.get_running_loop().time()
        status, answer, _ = await asyncio.wait_for(rt.post("/finish_session?session_id=busy"), timeout=5)
        assert asyncio.get_running_loop().time() - started < 1.0  # never waits for the turn
        assert (status, answer["released"], answer["deferred"]) == (200, True, True)
        assert not turn.done()
        assert rt.live() == {"e0": 1}  # still held: the turn in flight is measured first
        again = await rt.post("/finish_session?session_id=busy")
        assert (again[0], again[1]["deferred"]) == (200, True)  # repeated: still one pending release
        status, _, _ = await turn
        assert status == 200
        await wait_until_async(lambda: rt.live() == {"e0": 0})
        assert await rt.metric("rolloutpool_router_releases_total", how="finish_session") == 1
        # the same id after the finish is a new session (SkyRL reuses ids across epochs)
        assert (await rt.complete("next epoch", session="busy"))[0] == 200
        assert await rt.metric("rolloutpool_router_placements_total", kind="new") == 2
        assert rt.live() == {"e0": 1}
    await no_leaked_tasks()


async def test_many_concurrent_finishes_never_drive_counts_negative() -> None:
    async with engines(2) as urls, router(urls, cap=100) as rt:
        sids = [f"s{i}" for i in range(40)]
        await asyncio.gather(*(rt.complete(f"turn {sid}", session=sid) for sid in sids))
        results = await asyncio.gather(
            *(rt.post(f"/finish_session?session_id={sid}") for sid in sids * 3),
            *(rt.complete(f"again {sid}", session=sid) for sid in sids[:10]),
        )
        assert all(r[0] == 200 for r in results)
        live = rt.live()
        assert all(v >= 0 for v in live.values())
        assert sum(live.values()) == len(rt.manager.table.sessions) <= 10
    await no_leaked_tasks()


async def test_health_is_200_while_a_replica_is_ready_even_with_the_fleet_full() -> None:
    async with engines(1) as urls, router(urls, cap=1) as rt:
        status, body = await rt.request("GET", "/health")
        assert (status, body["placeable"]) == (200, True)
        assert (await rt.complete("take the only slot", session="a"))[0] == 200
        status, body = await rt.request("GET", "/health")  # full: new sessions would wait, the router serves
        assert (status, body["placeable"], body["ready_replicas"]) == (200, False, 1)
        assert (await rt.request("GET", "/healthz"))[0] == 200
        assert (await rt.request("GET", "/readyz"))[0] == 200
        rt.manager.set_draining("e0", True)  # ready, but it takes no new session: still serving
        assert (await rt.request("GET", "/health"))[0] == 200
        rt.manager.set_ready("e0", False, reason="test")  # no ready replica: 503 for probes and pollers
        status, body = await rt.request("GET", "/health")
        assert (status, body["ready_replicas"], body["status"]) == (503, 0, "unavailable")
        assert (await rt.request("GET", "/readyz"))[0] == 503
        assert (await rt.request("GET", "/healthz"))[0] == 200  # liveness: the process still serves
    await no_leaked_tasks()
