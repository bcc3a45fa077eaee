"""Scale down drains before deleting, a spec change replaces replicas one at a time, a lost pod comes back.

``rolloutpool operator`` runs as a process against the session's real control plane. No
kubelet runs yet: the tests fake it, writing pod status (IP, Ready) through the status
subresource. The router is faked too: its pod (created by the real Deployment and
ReplicaSet controllers) is given a loopback IP where :class:`FakeRouter` serves the
router's ``/metrics`` with the live sessions per replica the test chooses.
"""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.wait import wait_until
from test_operator_kit import (
    EXAMPLES,
    FakeRouter,
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


@pytest.fixture
def kube(cluster: LocalCluster) -> Iterator[tuple[client.CoreV1Api, client.CustomObjectsApi]]:
    connection = api(cluster)
    try:
        yield client.CoreV1Api(connection), client.CustomObjectsApi(connection)
    finally:
        connection.close()  # type: ignore[no-untyped-call]


def _pool(name: str, replicas: int, drain_timeout: int = 600) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load((EXAMPLES / "simulated-pool.yaml").read_text()))
    body["metadata"]["name"] = name
    body["spec"]["replicas"] = replicas
    body["spec"]["updateStrategy"] = {"drainTimeoutSeconds": drain_timeout}
    return body


def _patch_spec(custom: client.CustomObjectsApi, ns: str, name: str, spec: dict[str, Any]) -> None:
    custom.patch_namespaced_custom_object(
        "rolloutpool.io",
        "v1alpha1",
        ns,
        "rolloutpools",
        name,
        {"spec": spec},
        _content_type="application/merge-patch+json",
    )


def _entry(status: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next((r for r in status.get("replicaStatus") or [] if r["name"] == name), {})
    return found


def _events(cluster: LocalCluster, ns: str, pool: str) -> str:
    return cluster.kubectl("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={pool}").stdout


def _loopback() -> str:
    """A loopback address unlikely to be in use by another test (the fake router binds :8080 on it)."""
    return f"127.{10 + secrets.randbelow(240)}.{1 + secrets.randbelow(250)}.{1 + secrets.randbelow(250)}"


def test_scale_down_drains_live_sessions_then_times_out(
    cluster: LocalCluster, kube: tuple[client.CoreV1Api, client.CustomObjectsApi], tmp_path: Path
) -> None:
    """A replica with live sessions drains (quarantined) until they end; a drain timeout deletes it anyway."""
    core, custom = kube
    router_ip = _loopback()
    with (
        namespace(cluster, "op-drain") as ns,
        FakeRouter(router_ip) as router,
        OperatorProcess(cluster, ns, tmp_path / "operator.log"),
    ):
        apply_pool(cluster, ns, _pool("drainy", 3))
        pods = wait_until(
            lambda: len(p := child_pods(core, ns, "drainy")) == 3 and p,
            what="3 engine pods",
            timeout=30.0,
            interval=0.1,
        )
        for index, name in enumerate(sorted(pods)):
            play_kubelet(core, ns, name, ip=f"127.0.8.{index + 1}")
        routers = wait_until(
            lambda: child_pods(core, ns, "drainy", "router"), what="a router pod", timeout=30.0, interval=0.1
        )
        router.live = {"drainy-engine-1": 1, "drainy-engine-2": 2}
        play_kubelet(core, ns, next(iter(routers)), ip=router_ip)
        wait_until(
            lambda: pool_status(custom, ns, "drainy").get("liveSessions") == 3,
            what="live sessions 3",
            timeout=30.0,
            interval=0.1,
        )

        _patch_spec(custom, ns, "drainy", {"replicas": 2})
        status = wait_until(
            lambda: _entry(s := pool_status(custom, ns, "drainy"), "drainy-engine-2").get("reason") == "Draining" and s,
            what="engine 2 draining",
            timeout=30.0,
            interval=0.1,
        )
        assert _entry(status, "drainy-engine-2")["quarantined"] is True
        assert condition(status, "ReplicasQuarantined")["reason"] == "Draining"
        router.live = {"drainy-engine-1": 1, "drainy-engine-2": 1}  # one session ends; the drain goes on
        wait_until(
            lambda: pool_status(custom, ns, "drainy").get("liveSessions") == 2,
            what="a pass seeing 2 sessions",
            timeout=30.0,
            interval=0.1,
        )
        assert "drainy-engine-2" in child_pods(core, ns, "drainy"), "deleted with a live session left"
        router.live = {"drainy-engine-1": 1}
        wait_until(
            lambda: "drainy-engine-2" not in child_pods(core, ns, "drainy"),
            what="drained replica deleted",
            timeout=30.0,
            interval=0.1,
        )
        status = wait_until(
            lambda: (s := pool_status(custom, ns, "drainy")).get("replicas") == 2 and s,
            what="2",
            timeout=30.0,
            interval=0.1,
        )
        assert condition(status, "ReplicasQuarantined")["status"] == "False", dumps(status)
        events = _events(cluster, ns, "drainy")
        assert "DrainStarted" in events, events
        assert "Drained drainy-engine-2" in events, events

        # the drain timeout: engine 1 keeps a session, and goes after 2 s anyway
        _patch_spec(custom, ns, "drainy", {"replicas": 1, "updateStrategy": {"drainTimeoutSeconds": 2}})
        draining = wait_until(
            lambda: (
                (p := child_pods(core, ns, "drainy").get("drainy-engine-1"))
                and p["metadata"]["annotations"].get("rolloutpool.io/drain-started")
            ),
            what="drain of engine 1 recorded on the pod",
            timeout=30.0,
            interval=0.1,
        )
        wait_until(
            lambda: "drainy-engine-1" not in child_pods(core, ns, "drainy"),
            what="timed-out replica deleted",
            timeout=30.0,
            interval=0.1,
        )
        waited = time.time() - float(draining)
        print(f"drain timeout 2 s: replica deleted {waited:.2f}s after its drain started")
        assert waited >= 2.0
        assert "timed out with 1 live sessions" in _events(cluster, ns, "drainy")


def test_spec_change_replaces_one_at_a_time_and_lost_or_failed_pods_return(
    cluster: LocalCluster, kube: tuple[client.CoreV1Api, client.CustomObjectsApi], tmp_path: Path
) -> None:
    """A deleted or failed pod is recreated; a spec change drains and replaces replicas one at a time."""
    core, custom = kube
    with namespace(cluster, "op-rolling") as ns, OperatorProcess(cluster, ns, tmp_path / "operator.log"):
        apply_pool(cluster, ns, _pool("rolly", 3))
        pods = wait_until(
            lambda: len(p := child_pods(core, ns, "rolly")) == 3 and p, what="3 engine pods", timeout=30.0, interval=0.1
        )
        ips = {name: f"127.0.7.{i + 1}" for i, name in enumerate(sorted(pods))}
        for name, ip in ips.items():
            play_kubelet(core, ns, name, ip=ip)
        wait_until(
            lambda: pool_status(custom, ns, "rolly").get("readyReplicas") == 3,
            what="3 ready",
            timeout=30.0,
            interval=0.1,
        )

        lost = pods["rolly-engine-1"]["metadata"]["uid"]
        cluster.kubectl("delete", "pod", "rolly-engine-1", "-n", ns, "--wait=false")
        back = wait_until(
            lambda: (p := child_pods(core, ns, "rolly").get("rolly-engine-1")) and p["metadata"]["uid"] != lost and p,
            what="engine 1 recreated",
            timeout=30.0,
            interval=0.1,
        )
        play_kubelet(core, ns, "rolly-engine-1", ip=ips["rolly-engine-1"])
        failed = pods["rolly-engine-2"]["metadata"]["uid"]
        core.patch_namespaced_pod_status(  # the faked kubelet reports the engine process dead for good
            "rolly-engine-2", ns, {"status": {"phase": "Failed"}}, _content_type="application/merge-patch+json"
        )
        wait_until(
            lambda: (p := child_pods(core, ns, "rolly").get("rolly-engine-2")) and p["metadata"]["uid"] != failed,
            what="failed engine 2 replaced",
            timeout=30.0,
            interval=0.1,
        )
        play_kubelet(core, ns, "rolly-engine-2", ip=ips["rolly-engine-2"])
        wait_until(
            lambda: pool_status(custom, ns, "rolly").get("readyReplicas") == 3,
            what="3 ready again",
            timeout=30.0,
            interval=0.1,
        )

        old = {name: pod["metadata"]["uid"] for name, pod in child_pods(core, ns, "rolly").items()}
        assert old["rolly-engine-1"] == back["metadata"]["uid"]
        _patch_spec(custom, ns, "rolly", {"engine": {"simulator": {"timeScale": 20}}})
        worst, order = 0, []
        deadline = time.monotonic() + 90
        while True:
            current = child_pods(core, ns, "rolly")
            for name, pod in current.items():
                if pod["metadata"]["uid"] != old[name] and not pod.get("status", {}).get("podIP"):
                    order.append(name)
                    play_kubelet(core, ns, name, ip=ips[name])  # the faked kubelet starts the new pod
            unready = [n for n in old if n not in current or not current[n].get("status", {}).get("podIP")]
            worst = max(worst, len(unready))
            if all(current.get(n, {}).get("metadata", {}).get("uid") not in (None, old[n]) for n in old):
                break
            assert time.monotonic() < deadline, f"rolling update stuck: {dumps(current)}"
            time.sleep(0.05)
        print(f"rolling update order: {order}; most replicas missing at once: {worst}")
        assert sorted(order) == sorted(old)
        assert worst <= 1
        status = wait_until(
            lambda: condition(s := pool_status(custom, ns, "rolly"), "Progressing").get("reason") == "Reconciled" and s,
            what="Progressing=False Reconciled",
            timeout=30.0,
            interval=0.1,
        )
        assert status["readyReplicas"] == 3
        args = child_pods(core, ns, "rolly")["rolly-engine-0"]["spec"]["containers"][0]["args"]
        assert "--time-scale=20" in args
        assert _events(cluster, ns, "rolly").count("DrainStarted") >= 3


def _uid(cluster: LocalCluster, ns: str, kind: str, name: str) -> str | None:
    result = cluster.kubectl("get", kind, name, "-n", ns, "-o", "jsonpath={.metadata.uid}", check=False)
    return result.stdout or None if result.returncode == 0 else None


def test_router_objects_come_back_and_follow_the_spec(
    cluster: LocalCluster, kube: tuple[client.CoreV1Api, client.CustomObjectsApi], tmp_path: Path
) -> None:
    """A deleted router Service or Role is recreated; a router spec change reaches the Deployment."""
    _core, custom = kube
    with namespace(cluster, "op-router") as ns, OperatorProcess(cluster, ns, tmp_path / "operator.log"):
        apply_pool(cluster, ns, _pool("routy", 1))
        kinds = ("service", "role", "rolebinding", "serviceaccount", "deployment")
        uids = wait_until(
            lambda: all((u := {k: _uid(cluster, ns, k, "routy-router") for k in kinds}).values()) and u,
            what="router objects",
            timeout=30.0,
            interval=0.1,
        )
        started = time.monotonic()
        cluster.kubectl("delete", "service,role", "routy-router", "-n", ns)
        wait_until(
            lambda: None not in {_uid(cluster, ns, k, "routy-router") for k in ("service", "role")},
            what="router Service and Role recreated",
            timeout=30.0,
            interval=0.1,
        )
        print(f"router Service and Role recreated {time.monotonic() - started:.2f}s after deletion")
        assert _uid(cluster, ns, "service", "routy-router") != uids["service"]
        assert _uid(cluster, ns, "deployment", "routy-router") == uids["deployment"]

        _patch_spec(custom, ns, "routy", {"router": {"replicas": 2, "idleTimeoutSeconds": 60}})

        def deployment() -> dict[str, Any]:
            out = cluster.kubectl("get", "deployment", "routy-router", "-n", ns, "-o", "yaml").stdout
            found: dict[str, Any] = yaml.safe_load(out)
            return found

        wait_until(
            lambda: deployment()["spec"]["replicas"] == 2,
            what="router Deployment scaled to 2",
            timeout=30.0,
            interval=0.1,
        )
        args = deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--idle-timeout=60" in args
        assert _uid(cluster, ns, "deployment", "routy-router") == uids["deployment"], "patched, not replaced"
