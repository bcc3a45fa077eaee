"""The operator creates, reports on and lets go of a RolloutPool's children on a real API server.

``rolloutpool operator`` runs as a process against the session's control plane (etcd,
kube-apiserver and kube-controller-manager, whose garbage collector deletes the children
of a deleted pool). No kubelet runs yet: the tests fake it by writing pod status (IP,
Ready) through the status subresource (see ``test_operator_kit.play_kubelet``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.net import free_port
from rolloutpool.dev.wait import wait_until
from rolloutpool.reconcile.caps import replica_caps
from test_operator_kit import (
    EXAMPLES,
    OperatorProcess,
    api,
    apply_pool,
    child_pods,
    condition,
    dumps,
    namespace,
    play_kubelet,
    pool_status,
)

NS = "op-children"
ROUTER_KINDS = ("serviceaccount", "role", "rolebinding", "service", "deployment")
LABELS = {
    "app.kubernetes.io/name": "rolloutpool",
    "app.kubernetes.io/managed-by": "rolloutpool-operator",
    "rolloutpool.io/component": "engine",
}


@pytest.fixture
def kube(cluster: LocalCluster) -> Iterator[tuple[client.CoreV1Api, client.CustomObjectsApi]]:
    connection = api(cluster)
    try:
        yield client.CoreV1Api(connection), client.CustomObjectsApi(connection)
    finally:
        connection.close()  # type: ignore[no-untyped-call]


def _router_objects(cluster: LocalCluster, ns: str, pool: str) -> dict[str, Any]:
    found = {}
    for kind in ROUTER_KINDS:
        result = cluster.kubectl("get", kind, f"{pool}-router", "-n", ns, "-o", "yaml", check=False)
        if result.returncode == 0:
            found[kind] = yaml.safe_load(result.stdout)
    return found


def _assert_no_target(status: dict[str, Any]) -> None:
    """Blind (Prometheus unreachable): every replica without a target or cap, ``targetReason`` NoMetrics, none
    quarantined by the law."""
    entries = status["replicaStatus"]
    assert entries, dumps(status)
    assert all("target" not in r and "cap" not in r for r in entries), dumps(entries)
    assert {r.get("targetReason") for r in entries} == {"NoMetrics"}, dumps(entries)
    assert not any(r["quarantined"] for r in entries), dumps(entries)


def _uids(cluster: LocalCluster, ns: str) -> dict[str, str]:
    out = cluster.kubectl("get", ",".join(("pods", *ROUTER_KINDS, "replicasets")), "-n", ns, "-o", "yaml").stdout
    items = yaml.safe_load(out)["items"]
    return {f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["uid"] for o in items}


def test_example_pools_get_children_status_and_survive_restart(
    cluster: LocalCluster, kube: tuple[client.CoreV1Api, client.CustomObjectsApi], tmp_path: Path
) -> None:
    """Both examples: owned, labelled children; status and printer columns; restart adds nothing; GC."""
    core, custom = kube
    with namespace(cluster, NS) as ns, OperatorProcess(cluster, ns, tmp_path / "operator.log") as operator:
        started = time.monotonic()
        apply_pool(cluster, ns, EXAMPLES / "simulated-pool.yaml")
        vllm = apply_pool(cluster, ns, EXAMPLES / "vllm-pool.yaml")
        wait_until(
            lambda: len(child_pods(core, ns, "sim-grpo")) == 4,
            what="4 simulated engine pods",
            timeout=30.0,
            interval=0.1,
        )
        wait_until(
            lambda: len(_router_objects(cluster, ns, "sim-grpo")) == 5,
            what="5 router objects",
            timeout=30.0,
            interval=0.1,
        )
        print(f"apply -> simulated pool's children created: {time.monotonic() - started:.2f}s")
        wait_until(
            lambda: len(child_pods(core, ns, "qwen3-8b-grpo")) == 8,
            what="8 vLLM engine pods",
            timeout=30.0,
            interval=0.1,
        )

        pools: dict[str, Any] = {
            name: custom.get_namespaced_custom_object("rolloutpool.io", "v1alpha1", ns, "rolloutpools", name)
            for name in ("sim-grpo", "qwen3-8b-grpo")
        }
        for pool_name, pool in pools.items():
            owner = {"kind": "RolloutPool", "name": pool_name, "uid": pool["metadata"]["uid"], "controller": True}
            for pod_name, pod in child_pods(core, ns, pool_name).items():
                meta = pod["metadata"]
                assert {
                    **LABELS,
                    "rolloutpool.io/pool": pool_name,
                    "app.kubernetes.io/instance": pool_name,
                }.items() <= (meta["labels"].items()), dumps(meta)
                assert meta["labels"]["rolloutpool.io/index"] == pod_name.rsplit("-", 1)[1]
                assert {k: meta["ownerReferences"][0][k] for k in owner} == owner
                assert meta["annotations"]["prometheus.io/port"] == "8000"
                assert meta["annotations"]["rolloutpool.io/spec-hash"]
            for kind, obj in _router_objects(cluster, ns, pool_name).items():
                assert obj["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"], kind
                assert obj["metadata"]["labels"]["rolloutpool.io/component"] == "router", kind

        sim_pod = child_pods(core, ns, "sim-grpo")["sim-grpo-engine-2"]["spec"]["containers"][0]
        assert sim_pod["command"] == ["rolloutpool", "engine-sim"]
        assert "--kv-capacity-tokens=400000" in sim_pod["args"]
        vllm_pod = child_pods(core, ns, "qwen3-8b-grpo")["qwen3-8b-grpo-engine-7"]["spec"]
        engine = vllm_pod["containers"][0]
        assert engine["image"] == vllm["spec"]["engine"]["image"]
        assert {"--max-model-len=32768", "--enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(
            engine["args"]
        )
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert engine["startupProbe"]["failureThreshold"] * engine["startupProbe"]["periodSeconds"] >= 600
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in vllm_pod["tolerations"]
        assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in vllm_pod["volumes"])
        router = _router_objects(cluster, ns, "sim-grpo")
        role = router["role"]
        # the router schedules turns by the spec's working set; the hold limit in wall seconds (time scale 10)
        router_args = router["deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert {"--target=0.9", "--keep-quantile=0.99", "--hold-limit=300", "--time-scale=10"} <= set(router_args), (
            router_args
        )
        assert not any(a.startswith(("--cap", "--max-model-len")) for a in router_args), router_args
        vllm_router = _router_objects(cluster, ns, "qwen3-8b-grpo")["deployment"]
        assert "--cap-ceiling=256" in vllm_router["spec"]["template"]["spec"]["containers"][0]["args"]
        assert {tuple(r["resources"]) for r in role["rules"]} == {("pods",), ("rolloutpools",)}
        assert all(set(r["verbs"]) == {"get", "list", "watch"} for r in role["rules"])

        # the kubelet's part, faked: every simulated engine pod runs and is ready
        for index, name in enumerate(sorted(child_pods(core, ns, "sim-grpo"))):
            play_kubelet(core, ns, name, ip=f"127.0.9.{index + 1}")
        status = wait_until(
            lambda: (s := pool_status(custom, ns, "sim-grpo")).get("readyReplicas") == 4 and s,
            what="readyReplicas 4",
            timeout=30.0,
            interval=0.1,
        )
        assert status["replicas"] == 4
        assert status["observedGeneration"] == 1
        assert [r["name"] for r in status["replicaStatus"]] == [f"sim-grpo-engine-{i}" for i in range(4)]
        # autoscaling off: the operator publishes no working-set target, the routers keep workingSetTarget
        assert all("target" not in r and "cap" not in r for r in status["replicaStatus"]), status["replicaStatus"]
        assert condition(status, "Progressing")["status"] == "False"
        assert condition(status, "MetricsAvailable")["reason"] == "AutoscalingDisabled"
        table = cluster.kubectl("get", "rp", "-n", ns).stdout
        print(table)
        row = next(line.split() for line in table.splitlines() if line.startswith("sim-grpo "))
        assert row[1:5] == ["4", "4", "0", "0"], table

        # vLLM example: Prometheus at an unresolvable address -> unreachable; the law publishes no target (NoMetrics)
        # and the routers keep their own, which is safe without measurements
        vllm_status = wait_until(
            lambda: (s := pool_status(custom, ns, "qwen3-8b-grpo")).get("replicas") == 8 and s,
            what="vLLM status",
            timeout=30.0,
            interval=0.1,
        )
        assert condition(vllm_status, "MetricsAvailable")["reason"] == "PrometheusUnreachable"
        _assert_no_target(vllm_status)

        before = _uids(cluster, ns)
        operator.stop()
        marker = len(operator.logs())
        operator.start()
        wait_until(
            lambda: (
                "Reconciled RolloutPool pool=op-children/sim-grpo" in operator.logs()[marker:]
                and "Reconciled RolloutPool pool=op-children/qwen3-8b-grpo" in operator.logs()[marker:]
            ),
            what="a pass of both pools after the restart",
            timeout=30.0,
            interval=0.1,
        )
        assert _uids(cluster, ns) == before, "the restarted operator created or replaced children"

        cluster.kubectl("delete", "rp", "sim-grpo", "-n", ns, "--wait=false")
        wait_until(lambda: not child_pods(core, ns, "sim-grpo"), what="GC of the engine pods", timeout=60, interval=0.1)
        wait_until(
            lambda: not _router_objects(cluster, ns, "sim-grpo"), what="GC of the router", timeout=60, interval=0.1
        )
        assert len(child_pods(core, ns, "qwen3-8b-grpo")) == 8


def test_invalid_spec_and_unreachable_prometheus(
    cluster: LocalCluster, kube: tuple[client.CoreV1Api, client.CustomObjectsApi], tmp_path: Path
) -> None:
    """A session ceiling below the floor: Ready=False naming the field, no children. A closed Prometheus port: no
    target (NoMetrics), the routers' own applies."""
    core, custom = kube
    base = yaml.safe_load((EXAMPLES / "simulated-pool.yaml").read_text())
    invalid = copy.deepcopy(base)
    invalid["metadata"]["name"] = "too-tight"
    invalid["spec"]["concurrency"]["maxSessionsPerReplica"] = 5
    floor = replica_caps(spec=RolloutPoolSpec.model_validate(base["spec"]))
    assert floor is not None
    assert floor.floor == 400000 // 32768  # sessions that fit at full context: a ceiling below it cannot be served
    blind = copy.deepcopy(base)
    blind["metadata"]["name"] = "blind"
    blind["spec"]["replicas"] = 2
    blind["spec"]["autoscaling"] = {"enabled": True, "prometheusUrl": f"http://127.0.0.1:{free_port()}"}
    with namespace(cluster, "op-invalid") as ns, OperatorProcess(cluster, ns, tmp_path / "operator.log"):
        apply_pool(cluster, ns, invalid)
        apply_pool(cluster, ns, blind)
        status = wait_until(
            lambda: condition(pool_status(custom, ns, "too-tight"), "Ready"),
            what="Ready condition",
            timeout=30.0,
            interval=0.1,
        )
        assert status["status"] == "False"
        assert status["reason"] == "InvalidMaxSessionsPerReplica"
        assert "spec.concurrency.maxSessionsPerReplica" in status["message"]
        blind_status = wait_until(
            lambda: (s := pool_status(custom, ns, "blind")).get("replicas") == 2 and s,
            what="blind pool status",
            timeout=30.0,
            interval=0.1,
        )
        metrics = condition(blind_status, "MetricsAvailable")
        assert (metrics["status"], metrics["reason"]) == ("False", "PrometheusUnreachable"), dumps(metrics)
        _assert_no_target(blind_status)
        # the blind pool had passes since the invalid one was reported: the invalid one got no children
        assert child_pods(core, ns, "too-tight") == {}
        assert _router_objects(cluster, ns, "too-tight") == {}
        events = cluster.kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name=too-tight").stdout
        assert "InvalidMaxSessionsPerReplica" in events, events
