"""The router applies the caps and quarantine the operator writes into the RolloutPool status."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import yaml

from poolcases import load_example
from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.wait import wait_until_async
from rolloutpool.kube.pods import api_client
from rolloutpool.kube.pools import PoolWatch
from rolloutpool.router import ReplicaSpec, RouterConfig
from rolloutpool.router import build_app as build_router
from rolloutpool.router.app import ROUTER
from routerkit import ROUTER_DEFAULTS, engines, serve


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


async def test_operator_caps_and_quarantine_combine_with_the_routers(cluster: LocalCluster) -> None:
    with _watched_pool(cluster, "limits") as watch:
        async with engines(2) as urls:
            specs = tuple(ReplicaSpec(f"limits-engine-{i}", url) for i, url in enumerate(urls.values()))
            app = build_router(RouterConfig(replicas=specs, cap=10, **ROUTER_DEFAULTS), limits=watch.events)
            table = app[ROUTER].manager.table
            async with serve(app):
                await wait_until_async(lambda: table.replicas["limits-engine-0"].cap == 10)
                _status(
                    cluster,
                    "limits",
                    [
                        {"name": "limits-engine-0", "index": 0, "cap": 3},
                        {"name": "limits-engine-1", "index": 1, "cap": 50, "quarantined": True, "reason": "Evicting"},
                    ],
                )
                # a cap fixed on the router is a hard limit: the tighter wins; the operator's quarantine applies
                # on top of the router's own
                await wait_until_async(lambda: table.replicas["limits-engine-0"].cap == 3)
                await wait_until_async(lambda: table.replicas["limits-engine-1"].quarantined)
                assert table.replicas["limits-engine-1"].cap == 10
                _status(cluster, "limits", [])
                await wait_until_async(lambda: not table.replicas["limits-engine-1"].quarantined)
                assert table.replicas["limits-engine-0"].cap == 10


async def test_the_operators_cap_replaces_a_cap_the_router_only_derived(cluster: LocalCluster) -> None:
    """A router deployed by the operator derives its cap from expectedResidency; the law's cap may exceed it."""
    with _watched_pool(cluster, "derived") as watch:
        async with engines(1) as urls:
            specs = (ReplicaSpec("derived-engine-0", next(iter(urls.values()))),)
            config = RouterConfig(replicas=specs, max_model_len=4096, cap_ceiling=24, **ROUTER_DEFAULTS)
            app = build_router(config, limits=watch.events)
            replica = app[ROUTER].manager.table.replicas["derived-engine-0"]
            async with serve(app):
                # 32,768 KV tokens / (4,096 x residency 0.5) x (1 - headroom 0.1) = 14
                await wait_until_async(lambda: replica.cap == 14)
                _status(cluster, "derived", [{"name": "derived-engine-0", "index": 0, "cap": 20}])
                await wait_until_async(lambda: replica.cap == 20)  # above the derived 14: the law found room
                _status(cluster, "derived", [{"name": "derived-engine-0", "index": 0, "cap": 30}])
                await wait_until_async(lambda: replica.cap == 24)  # maxSessionsPerReplica stays a hard limit
                _status(cluster, "derived", [])
                await wait_until_async(lambda: replica.cap == 14)  # no decision: the router's own guess again
