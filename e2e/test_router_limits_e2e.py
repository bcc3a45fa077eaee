"""The router applies the caps and quarantine the operator writes into the RolloutPool status."""

from __future__ import annotations

import json

import yaml

from poolcases import load_example
from rolloutpool.kube.pods import api_client
from rolloutpool.kube.pools import PoolWatch
from rolloutpool.localcluster.cluster import LocalCluster
from rolloutpool.router import ReplicaSpec, RouterConfig
from rolloutpool.router import build_app as build_router
from rolloutpool.router.app import ROUTER
from routerkit import ROUTER_DEFAULTS, engines, eventually, serve


def _status(cluster: LocalCluster, replicas: list[dict[str, object]]) -> None:
    patch = json.dumps({"status": {"replicaStatus": replicas}})
    cluster.kubectl("patch", "rp/limits", "-n", "default", "--subresource=status", "--type=merge", "-p", patch)


async def test_operator_caps_and_quarantine_combine_with_the_routers(cluster: LocalCluster) -> None:
    pool = load_example("simulated-pool.yaml")
    pool["metadata"] = {"name": "limits", "namespace": "default"}
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(pool))
    watch = PoolWatch(api_client(str(cluster.kubeconfig)), namespace="default", name="limits", timeout_seconds=5)
    try:
        async with engines(2) as urls:
            specs = tuple(ReplicaSpec(f"limits-engine-{i}", url) for i, url in enumerate(urls.values()))
            app = build_router(RouterConfig(replicas=specs, cap=10, **ROUTER_DEFAULTS), limits=watch.events)
            table = app[ROUTER].manager.table
            async with serve(app):
                await eventually(lambda: table.replicas["limits-engine-0"].cap == 10)
                _status(
                    cluster,
                    [
                        {"name": "limits-engine-0", "index": 0, "cap": 3},
                        {"name": "limits-engine-1", "index": 1, "cap": 50, "quarantined": True, "reason": "Evicting"},
                    ],
                )
                # the tighter cap wins; the operator's quarantine applies on top of the router's own
                await eventually(lambda: table.replicas["limits-engine-0"].cap == 3)
                await eventually(lambda: table.replicas["limits-engine-1"].quarantined)
                assert table.replicas["limits-engine-1"].cap == 10
                _status(cluster, [])
                await eventually(lambda: not table.replicas["limits-engine-1"].quarantined)
                assert table.replicas["limits-engine-0"].cap == 10
    finally:
        watch.stop()
        assert watch.join(15), "the pool watch thread did not stop"
        cluster.kubectl("delete", "rp/limits", "-n", "default")
