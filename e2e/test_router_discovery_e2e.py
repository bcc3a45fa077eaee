"""The router discovers engine pods through a real kube-apiserver watch.

No kubelet runs here yet (issue 6), so the test plays the kubelet's part: it creates
the pods and writes their status (IP, Ready condition) through the status
subresource, while real engine simulators serve on loopback at those addresses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import aiohttp
import pytest
import yaml

from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.wait import wait_until_async
from rolloutpool.kube.pods import PodWatch, api_client
from rolloutpool.router import RouterConfig
from rolloutpool.router import build_app as build_router
from rolloutpool.router.app import ROUTER
from routerkit import ROUTER_DEFAULTS, engines, serve

NAMESPACE = "discovery"
SELECTOR = "rolloutpool.io/pool=disc,rolloutpool.io/component=engine"


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    cluster.kubectl("create", "namespace", NAMESPACE)
    try:
        yield NAMESPACE
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def _pod(name: str, port: int) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "labels": {"rolloutpool.io/pool": "disc", "rolloutpool.io/component": "engine"},
            },
            "spec": {
                "containers": [{"name": "engine", "image": "sim", "ports": [{"name": "http", "containerPort": port}]}]
            },
        }
    )


def _status(cluster: LocalCluster, name: str, *, ready: bool) -> None:
    status = {
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
    }
    cluster.kubectl(
        "patch", "pod", name, "-n", NAMESPACE, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )


async def test_router_follows_pod_readiness_and_deletion(cluster: LocalCluster, namespace: str) -> None:
    async with engines(2) as urls:
        ports = {name: int(url.rsplit(":", 1)[1]) for name, url in urls.items()}
        for name, port in ports.items():
            cluster.kubectl("apply", "-f", "-", input_text=_pod(f"disc-engine-{name[1:]}", port))
        _status(cluster, "disc-engine-0", ready=True)  # engine 1 stays pending: not routable

        watch = PodWatch(api_client(str(cluster.kubeconfig)), namespace=namespace, selector=SELECTOR, timeout_seconds=5)
        config = RouterConfig(replicas=(), discovery=True, cap=8, **ROUTER_DEFAULTS)
        app = build_router(config, discovery=watch.events)
        manager = app[ROUTER].manager
        try:
            async with serve(app) as (url, _), aiohttp.ClientSession() as http:
                await wait_until_async(lambda: set(manager.runtime) == {"disc-engine-0"})
                body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": "s1"}) as resp:
                    assert resp.status == 200
                assert manager.lookup("s1").replica == "disc-engine-0"

                _status(cluster, "disc-engine-1", ready=True)
                await wait_until_async(lambda: set(manager.runtime) == {"disc-engine-0", "disc-engine-1"})

                _status(cluster, "disc-engine-0", ready=False)  # unready: dropped within seconds
                await wait_until_async(lambda: set(manager.runtime) == {"disc-engine-1"})
                assert manager.lookup("s1") is None  # its session is re-placed on the next turn
                async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": "s1"}) as resp:
                    assert resp.status == 200
                assert manager.lookup("s1").replica == "disc-engine-1"

                cluster.kubectl("delete", "pod", "disc-engine-1", "-n", namespace, "--grace-period=0", "--force")
                await wait_until_async(lambda: manager.runtime == {})
                assert len(manager.table.sessions) == 0
                async with http.get(f"{url}/readyz") as resp:
                    assert resp.status == 503
        finally:
            watch.stop()
            assert watch.join(15), "the pod watch thread did not stop"
