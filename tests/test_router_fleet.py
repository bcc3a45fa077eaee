"""One router of a fleet, in process: its engines follow the views, sessions owned elsewhere are released.

Real engine simulators and a real router; the fleet views come from a queue the test fills, as
the Kubernetes watch would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp

from rolloutpool.dev.wait import wait_until_async
from rolloutpool.router import RouterConfig
from rolloutpool.router import build_app as build_router
from rolloutpool.router.app import ROUTER
from rolloutpool.router.fleet import Fleet, peer_key
from rolloutpool.routing.discovery import ReplicaEvent
from rolloutpool.routing.fleetview import FleetView
from routerkit import ROUTER_DEFAULTS, engines, no_leaked_tasks, serve

ME, PEER = "router-a", "router-b"
TOKEN = "fleet-token"  # noqa: S105 -- a test token


def _view(owners: dict[str, str], urls: dict[str, str]) -> FleetView:
    mine = {e: ReplicaEvent(e, urls[e], True, "Ready") for e, r in owners.items() if r == ME}
    return FleetView(owners=owners, peers={r: f"http://{r}.invalid" for r in set(owners.values())}, engines=mine)


async def test_engines_follow_the_assignment_and_moved_sessions_are_released() -> None:
    views: asyncio.Queue[FleetView] = asyncio.Queue()

    async def source() -> AsyncIterator[FleetView]:
        while True:
            yield await views.get()

    async with engines(2) as urls:
        fleet = Fleet(self_name=ME, source=source, admin_token=TOKEN, sweep_interval_s=0.2)
        config = RouterConfig(replicas=(), discovery=True, cap=16, **ROUTER_DEFAULTS)
        app = build_router(config, discovery=fleet.discovery, fleet=fleet)
        manager = app[ROUTER].manager
        async with serve(app) as (url, _), aiohttp.ClientSession() as http:
            views.put_nowait(_view({"e0": ME, "e1": ME}, urls))  # both engines mine: every session is mine
            await wait_until_async(lambda: set(manager.runtime) == {"e0", "e1"})
            body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            for i in range(20):
                async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": f"s{i}"}) as r:
                    assert r.status == 200, (await r.text(), manager.table.replicas)
            assert len(manager.table.sessions) == 20

            views.put_nowait(_view({"e0": ME, "e1": PEER}, urls))  # e1 moves to the peer, with its ring points
            await wait_until_async(lambda: set(manager.runtime) == {"e0"})
            view = fleet.view
            await wait_until_async(lambda: all(view.owner(s) == ME for s in manager.table.sessions))
            kept = set(manager.table.sessions)
            assert kept == {f"s{i}" for i in range(20) if view.owner(f"s{i}") == ME and manager.lookup(f"s{i}")}
            assert 0 < len(kept) < 20
            assert all(s.replica == "e0" for s in manager.table.sessions.values())

            # a session owned by the peer is forwarded; the peer is unreachable here: a clear 503, nothing placed
            foreign = next(f"x{i}" for i in range(1000) if view.owner(f"x{i}") == PEER)
            async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": foreign}) as r:
                assert r.status == 503
                assert (await r.json())["error"]["type"] == "ServiceUnavailableError"
                assert r.headers["Retry-After"] == "1"
            assert manager.lookup(foreign) is None
            # a client cannot claim its request was forwarded: without the peers' key it is refused, nothing placed
            headers = {"X-Session-ID": foreign, "X-RolloutPool-Forwarded": PEER}
            for forged in ({}, {"X-RolloutPool-Peer-Auth": "guess"}, {"X-RolloutPool-Peer-Auth": TOKEN}):
                async with http.post(f"{url}/v1/chat/completions", json=body, headers={**headers, **forged}) as r:
                    assert r.status == 403, await r.text()
                    assert "reserved for the routers" in (await r.json())["error"]["message"]
            assert manager.lookup(foreign) is None
            # ...a peer's forwarded request is served here, never forwarded twice
            headers["X-RolloutPool-Peer-Auth"] = peer_key(TOKEN)
            async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
            assert manager.lookup(foreign) is not None
            await wait_until_async(lambda: manager.lookup(foreign) is None)  # and swept once idle: not ours
    await no_leaked_tasks()
