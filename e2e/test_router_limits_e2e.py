"""The router applies the working-set targets and quarantine the operator writes into the RolloutPool status.

The engine simulators report 2,048 blocks of 16 tokens (32,768 KV tokens); until sessions are measured the router
expects a first context of 2,048 tokens, so a replica's room for new sessions is ``32,768 x target // 2,048``: 14 at
the router's own 0.9, 8 at 0.5, 16 at 1.0. A live-session cap is only a ceiling over that room.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import yaml

from poolcases import load_example
from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.wait import wait_until_async
from rolloutpool.kube.pods import api_client
from rolloutpool.kube.pools import PoolWatch
from rolloutpool.router import ReplicaSpec, RouterConfig
from rolloutpool.router import build_app as build_router
from rolloutpool.router.app import ROUTER
from rolloutpool.routing.workingset import WorkingSetConfig
from routerkit import ROUTER_DEFAULTS, engines, serve

TOKEN = "limits-admin-token"  # noqa: S105 -- a test token


@contextmanager
def _watched_pool(cluster: LocalCluster, name: str) -> Iterator[PoolWatch]:
    """The example pool applied as ``name``, and a watch on it; both gone afterwards, even on failure."""
    pool = load_example("simulated-pool.yaml")
    pool["metadata"] = {"name": name, "namespace": "default"}
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(pool))
    watch = PoolWatch(api_client(str(cluster.kubeconfig)), namespace="default", name=name, timeout_seconds=5)
    try:
        yield watch
    finally:
        watch.stop()
        assert watch.join(15), "the pool watch thread did not stop"
        cluster.kubectl("delete", f"rp/{name}", "-n", "default")


def _status(cluster: LocalCluster, pool: str, replicas: list[dict[str, object]]) -> None:
    patch = json.dumps({"status": {"replicaStatus": replicas}})
    cluster.kubectl("patch", f"rp/{pool}", "-n", "default", "--subresource=status", "--type=merge", "-p", patch)


async def test_operator_targets_and_quarantine_combine_with_the_routers(cluster: LocalCluster) -> None:
    with _watched_pool(cluster, "limits") as watch:
        async with engines(2) as urls:
            specs = tuple(ReplicaSpec(f"limits-engine-{i}", url) for i, url in enumerate(urls.values()))
            app = build_router(RouterConfig(replicas=specs, cap=10, **ROUTER_DEFAULTS), limits=watch.events)
            manager = app[ROUTER].manager
            table, work = manager.table, manager.ledger.work
            assert work is not None  # turn scheduling is on by default
            async with serve(app):
                # the fixed cap 10 is tighter than the room at the router's own target 0.9 (14)
                await wait_until_async(lambda: table.replicas["limits-engine-0"].cap == 10)
                assert work.target_of("limits-engine-0") == 0.9
                _status(
                    cluster,
                    "limits",
                    [
                        {"name": "limits-engine-0", "index": 0, "target": 0.5, "targetReason": "Evicting"},
                        {
                            "name": "limits-engine-1",
                            "index": 1,
                            "target": 1.0,
                            "quarantined": True,
                            "reason": "Evicting",
                        },
                    ],
                )
                # the operator's target replaces the router's: at 0.5 the working set has room for 8 new sessions,
                # tighter than the fixed cap; the operator's quarantine applies on top of the router's own
                await wait_until_async(lambda: table.replicas["limits-engine-0"].cap == 8)
                assert work.target_of("limits-engine-0") == 0.5
                await wait_until_async(lambda: table.replicas["limits-engine-1"].quarantined)
                assert work.target_of("limits-engine-1") == 1.0
                assert table.replicas["limits-engine-1"].cap == 10  # a higher target never lifts the fixed cap
                _status(cluster, "limits", [])
                # no decision: the router's own target again, and no quarantine
                await wait_until_async(lambda: not table.replicas["limits-engine-1"].quarantined)
                await wait_until_async(lambda: table.replicas["limits-engine-0"].cap == 10)
                assert {work.target_of(name) for name in table.replicas} == {0.9}


async def test_the_operators_target_replaces_the_routers_own_under_the_ceiling(cluster: LocalCluster) -> None:
    """A router deployed by the operator starts at ``workingSetTarget``; the law's target may exceed it, but never the
    working set's limit, and ``maxSessionsPerReplica`` stays a hard ceiling. ``GET /admin/replicas`` shows it."""
    with _watched_pool(cluster, "derived") as watch:
        async with engines(1) as urls:
            specs = (ReplicaSpec("derived-engine-0", next(iter(urls.values()))),)
            config = RouterConfig(
                replicas=specs,
                turns=WorkingSetConfig(target=0.5),
                cap_ceiling=12,
                admin_token=TOKEN,
                **ROUTER_DEFAULTS,
            )
            app = build_router(config, limits=watch.events)
            replica = app[ROUTER].manager.table.replicas["derived-engine-0"]
            async with serve(app) as (url, _), aiohttp.ClientSession() as http:

                async def row() -> dict[str, Any]:
                    auth = {"Authorization": f"Bearer {TOKEN}"}
                    async with http.get(f"{url}/admin/replicas", headers=auth) as resp:
                        assert resp.status == 200
                        rows: list[dict[str, Any]] = (await resp.json())["replicas"]
                    return rows[0]

                await wait_until_async(lambda: replica.cap == 8)  # 32,768 x 0.5 // 2,048
                assert (await row())["target"] == 0.5
                _status(cluster, "derived", [{"name": "derived-engine-0", "index": 0, "target": 0.7}])
                await wait_until_async(lambda: replica.cap == 11)  # 32,768 x 0.7 // 2,048: the law found room
                shown = await row()
                assert (shown["target"], shown["cap"], shown["held_turns"], shown["kept_sessions"]) == (0.7, 11, 0, 0)
                _status(cluster, "derived", [{"name": "derived-engine-0", "index": 0, "target": 1.5}])
                await wait_until_async(lambda: replica.cap == 12)  # room for 16: maxSessionsPerReplica binds
                assert (await row())["target"] == 1.0  # the working set never passes its limit (the KV capacity)
                _status(cluster, "derived", [])
                await wait_until_async(lambda: replica.cap == 8)  # no decision: the router's own target again
                assert (await row())["target"] == 0.5
