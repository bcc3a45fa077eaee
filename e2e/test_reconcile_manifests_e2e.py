"""A real kube-apiserver accepts every manifest the reconcile builders produce (server-side dry run).

The API server validates and defaults each child exactly as on a real create, admission included,
but stores nothing. Its answer also shows that server defaults do not make ``needs_update`` see a
difference, and that the status ``build_status`` writes passes the CRD's schema.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from poolcases import EXAMPLES, load_example
from rolloutpool.autoscale.law import MetricsHealth, ReplicaControl
from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.reconcile.caps import parse_spec
from rolloutpool.reconcile.children import desired_engine_pods, needs_update, router_objects
from rolloutpool.reconcile.engines import DrainEnd, EnginePlan
from rolloutpool.reconcile.labels import DEFAULT_IMAGE, pool_selector
from rolloutpool.reconcile.status import build_status

EXAMPLE_FILES = sorted(path.name for path in EXAMPLES.glob("*.yaml"))
PLACED = {  # a vLLM pool with everything passed through to the pod: node selector, tolerations, TP 2
    "gpusPerReplica": 2,
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rollouts", "effect": "NoSchedule"}],
    "extraArgs": ["--max-num-seqs=128", "--enforce-eager"],
}
CASES = [pytest.param(name, {}, id=name.removesuffix(".yaml")) for name in EXAMPLE_FILES]
CASES.append(pytest.param("vllm-pool.yaml", PLACED, id="vllm-placed"))


def _dry_run_create(cluster: LocalCluster, manifest: dict[str, Any]) -> dict[str, Any]:
    result = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input_text=json.dumps(manifest))
    created: dict[str, Any] = json.loads(result.stdout)
    return created


def _priority_class(cluster: LocalCluster, manifest: dict[str, Any]) -> None:
    """The PriorityClass an example's engine names: admission refuses a pod without it (so this file runs alone,
    not only after the GPU-pool test that creates it)."""
    name = manifest["spec"]["engine"].get("priorityClassName")
    if name:
        priority = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump({**priority, "value": 1000}))


@pytest.mark.parametrize(("example", "engine"), CASES)
def test_every_child_and_the_status_pass_the_api_server(
    cluster: LocalCluster, example: str, engine: dict[str, Any]
) -> None:
    namespace = f"dryrun-{example.removesuffix('.yaml')}-{len(engine)}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        manifest = load_example(example)
        manifest["metadata"]["namespace"] = namespace
        manifest["spec"]["engine"].update(engine)
        _priority_class(cluster, manifest)
        cluster.kubectl("create", "-f", "-", input_text=yaml.safe_dump(manifest))
        name = manifest["metadata"]["name"]
        pool: dict[str, Any] = json.loads(cluster.kubectl("get", "rp", name, "-n", namespace, "-o", "json").stdout)
        spec, error = parse_spec(pool=pool)
        assert error is None
        assert spec is not None

        pods = desired_engine_pods(pool=pool, spec=spec, default_image=DEFAULT_IMAGE)
        children = [*pods.values(), *router_objects(pool=pool, spec=spec, default_image=DEFAULT_IMAGE)]
        assert len(children) == spec.replicas + 6
        for child in children:
            answer = _dry_run_create(cluster, child)
            what = f"{child['kind']}/{child['metadata']['name']}"
            assert answer["metadata"]["uid"], what
            assert answer["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"], what
            assert not needs_update(observed=answer, desired=child), f"server defaults changed {what}"
            if child["kind"] == "Pod" and engine:
                assert answer["spec"]["nodeSelector"] == engine["nodeSelector"], what
                assert all(t in answer["spec"]["tolerations"] for t in engine["tolerations"]), what
                assert answer["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}, what

        # nothing was stored
        listed = cluster.kubectl(
            "get", "pods,deploy,svc,sa,role,rolebinding", "-n", namespace, "-l", pool_selector(name)
        )
        assert listed.stdout.strip() == ""

        names = list(pods)
        status = build_status(
            pool=pool,
            spec=spec,
            spec_error=None,
            pods=[{**pod, "status": {"phase": "Running"}} for pod in pods.values()],
            live_sessions={names[0]: 3},
            queued_sessions=1,
            controls={names[0]: ReplicaControl(target=0.81, changed_at=1.7e9, quarantined=True, reason="Preempting")},
            health=MetricsHealth(False, "PrometheusUnreachable", "Prometheus query failed: refused"),
            draining={},
            previous=None,
            now=datetime.now(UTC),
            plan=EnginePlan(end_drain=(DrainEnd(names[-1], "DrainTimeout"),)),
        )
        body = json.dumps({"status": status.model_dump(mode="json", by_alias=True, exclude_none=True)})
        patched = cluster.kubectl(
            "patch", "rp", name, "-n", namespace, "--subresource=status", "--type=merge",
            "--dry-run=server", "-o", "json", "-p", body,
        )  # fmt: skip
        returned = json.loads(patched.stdout)["status"]
        first = returned["replicaStatus"][0]
        assert first["quarantined"] is True
        # the law's working-set target and why it moved survive the server's schema (no pruned field)
        assert (first["target"], first["targetReason"]) == (0.81, "Preempting")
        assert "cap" not in first
        assert [c["type"] for c in returned["conditions"]] == [
            "Ready",
            "Progressing",
            "Degraded",
            "ReplicasQuarantined",
            "MetricsAvailable",
        ]
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
