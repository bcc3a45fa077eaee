"""The operator's pass publishes the engine-to-router assignment (in-memory Kubernetes fake)."""

from __future__ import annotations

from typing import Any

from rolloutpool.reconcile.assignment import ANNOTATION_ROUTER
from rolloutpool.reconcile.labels import pool_labels
from test_operator_passes import NAME, NS, SPEC, Harness


def _router_pod(name: str, ip: str, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": pool_labels(NAME, "router")}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "router"}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _assignment(h: Harness) -> dict[str, str]:
    return {
        n: (h.pod(n)["metadata"].get("annotations") or {}).get(ANNOTATION_ROUTER, "")
        for n in h.pods()
        if "-engine-" in n
    }


async def test_engines_are_assigned_to_router_pods_and_follow_a_dead_one() -> None:
    h = Harness({**SPEC, "replicas": 4, "router": {"replicas": 2}})
    await h.run()
    h.ready(*[f"{NAME}-engine-{i}" for i in range(4)])
    await h.run()
    assert set(_assignment(h).values()) == {""}  # no router pod yet: nothing to assign to
    h.kube.put(_router_pod("p-router-a", "10.0.1.1"))
    h.kube.put(_router_pod("p-router-b", "10.0.1.2"))
    await h.run()
    first = _assignment(h)
    assert sorted(first.values()) == ["p-router-a", "p-router-a", "p-router-b", "p-router-b"]

    h.forget_calls()
    await h.run()
    assert not [w for w in h.writes() if w[0] == "patch" and w[1] == "Pod"]  # a quiet pass patches no pod

    h.kube.put(_router_pod("p-router-a", "10.0.1.1", deleting=True))  # being deleted: its engines move
    h.forget_calls()
    await h.run()
    after = _assignment(h)
    assert set(after.values()) == {"p-router-b"}
    moved = sorted(w[2] for w in h.writes() if w[0] == "patch" and w[1] == "Pod")
    assert moved == sorted(e for e, r in first.items() if r == "p-router-a")  # only its engines were patched
