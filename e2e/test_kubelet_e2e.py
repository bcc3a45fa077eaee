"""The process kubelet against the real control plane: pods of our image run as local processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rolloutpool.api.pods import has_ready_condition
from rolloutpool.dev.kubelet.kubelet import ProcessKubelet, default_executables
from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.processes import pid_alive, signal_group, start_group
from rolloutpool.dev.wait import wait_until

IMAGE = "ghcr.io/rolloutpool/rolloutpool:0.1.0"
_ENGINE_ARGS = ["engine-sim", "--host=$(POD_IP)", "--port=8000", "--kv-capacity-tokens=4096", "--max-model-len=1024"]
_POD_IP_ENV = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


@pytest.fixture(scope="module")
def kubelet(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessKubelet]:
    """One process kubelet for the module; ``python`` is runnable too (the RBAC probe script)."""
    executables = {**default_executables(), "python": sys.executable}
    with ProcessKubelet(
        cluster.kubeconfig,
        tmp_path_factory.mktemp("kubelet"),
        backoff_base=0.5,
        backoff_cap=2.0,
        executables=executables,
    ) as running:
        yield running
        # leave no pods behind for a later kubelet of the session to run again: delete them while this one runs
        if _CREATED:
            cluster.kubectl("delete", "namespace", *_CREATED, "--wait=true", "--timeout=120s", check=False)
            _CREATED.clear()


_CREATED: list[str] = []


def _namespace(cluster: LocalCluster, name: str) -> str:
    cluster.kubectl("create", "namespace", name)
    _CREATED.append(name)
    return name


def _apply(cluster: LocalCluster, *docs: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(docs))


def _pod(name: str, namespace: str, *, command: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "engine",
        "image": IMAGE,
        "command": command or ["rolloutpool", *_ENGINE_ARGS],
        "env": _POD_IP_ENV,
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    container.update(spec.pop("container", {}))
    container = {k: v for k, v in container.items() if v is not None}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [container], **spec},
    }


def _get(cluster: LocalCluster, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def test_node_registered_with_gpus(cluster: LocalCluster, kubelet: ProcessKubelet) -> None:
    node = _get(cluster, "node", kubelet.node_name, "default")
    assert node is not None
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    assert not node["spec"].get("taints")
    lease = _get(cluster, "lease", kubelet.node_name, "kube-node-lease")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == kubelet.node_name


def test_engine_pods_run_ready_on_their_own_addresses(cluster: LocalCluster, kubelet: ProcessKubelet) -> None:
    ns = _namespace(cluster, "kl-engines")
    started = time.monotonic()
    _apply(cluster, _pod("a", ns), _pod("b", ns))
    pods = [
        wait_until(
            lambda n=n: (p := _get(cluster, "pod", n, ns)) and has_ready_condition(p) and p,
            what=f"{n} Ready",
            timeout=90.0,
            interval=0.2,
        )
        for n in "ab"
    ]
    elapsed = time.monotonic() - started
    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == 2
    for pod, ip in zip(pods, ips, strict=True):
        assert ip.startswith("127.0.0.")
        assert ip != "127.0.0.1"
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] == kubelet.node_name
        assert pod["status"]["hostIP"] == "127.0.0.1"
        conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert conditions["PodScheduled"] == conditions["Initialized"] == conditions["ContainersReady"] == "True"
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] is True
        assert "running" in status["state"]
        with urllib.request.urlopen(f"http://{ip}:8000/health", timeout=5) as resp:
            assert resp.status == 200
    print(f"two engine pods created -> both Ready in {elapsed:.1f}s")


def test_crashing_container_is_restarted(cluster: LocalCluster, kubelet: ProcessKubelet) -> None:
    ns = _namespace(cluster, "kl-crash")
    bad = _pod(
        "crash", ns, command=["rolloutpool", "engine-sim", "--port=not-a-port"], container={"readinessProbe": None}
    )
    _apply(cluster, bad)

    def restarted() -> dict[str, Any] | None:
        pod = _get(cluster, "pod", "crash", ns)
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        return statuses[0] if statuses and statuses[0]["restartCount"] >= 2 else None

    status = wait_until(restarted, what="two restarts", timeout=90.0, interval=0.2)
    assert status["lastState"]["terminated"]["exitCode"] == 2  # click's usage error
    assert set(status["state"]) <= {"running", "waiting"}
    pod = _get(cluster, "pod", "crash", ns)
    assert pod is not None
    assert pod["status"]["phase"] == "Running"
    log = kubelet.log_path(ns, "crash", "engine")
    assert log is not None
    assert "not-a-port" in log.read_text()


def test_deletion_terminates_the_process_gracefully(cluster: LocalCluster, kubelet: ProcessKubelet) -> None:
    ns = _namespace(cluster, "kl-delete")
    _apply(cluster, _pod("gone", ns, terminationGracePeriodSeconds=30))
    wait_until(
        lambda: has_ready_condition(_get(cluster, "pod", "gone", ns) or {}), what="Ready", timeout=90.0, interval=0.2
    )
    (pid,) = kubelet.processes()[f"{ns}/gone"].values()
    log = kubelet.log_path(ns, "gone", "engine")
    assert log is not None
    started = time.monotonic()
    cluster.kubectl("delete", "pod", "gone", "-n", ns, "--wait=true", "--timeout=60s")
    assert time.monotonic() - started < 25  # SIGTERM honoured: no wait for the 30 s SIGKILL
    assert not pid_alive(pid)
    assert f"{ns}/gone" not in kubelet.processes()
    assert _get(cluster, "pod", "gone", ns) is None


def test_foreign_image_fails_with_a_clear_reason(cluster: LocalCluster, kubelet: ProcessKubelet) -> None:
    ns = _namespace(cluster, "kl-nginx")
    nginx = {"name": "web", "image": "nginx:1.27"}
    _apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"containers": [nginx]},
        },
    )
    pod = wait_until(
        lambda: (p := _get(cluster, "pod", "web", ns)) and p["status"].get("phase") == "Failed" and p,
        what="Failed",
        timeout=90.0,
        interval=0.2,
    )
    assert pod["status"]["reason"] == "UnsupportedImage"
    assert "nginx:1.27" in pod["status"]["message"]
    assert "ghcr" in pod["status"]["message"]
    assert kubelet.processes().get(f"{ns}/web") is None


def test_unschedulable_pod_stays_pending(cluster: LocalCluster, kubelet: ProcessKubelet) -> None:
    ns = _namespace(cluster, "kl-big")
    _apply(cluster, _pod("huge", ns, container={"resources": {"limits": {"nvidia.com/gpu": "64"}}}))

    def condition() -> dict[str, Any] | None:
        pod = _get(cluster, "pod", "huge", ns) or {}
        found = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
        return found.get("PodScheduled")

    scheduled = wait_until(condition, what="PodScheduled=False", timeout=90.0, interval=0.2)
    assert scheduled["status"] == "False"
    assert scheduled["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in scheduled["message"]
    assert (_get(cluster, "pod", "huge", ns) or {})["status"]["phase"] == "Pending"


_RBAC_PROBE = """
import os
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
config.load_kube_config()
core = client.CoreV1Api()
ns = os.environ["POD_NAMESPACE"]
print("pods:", len(core.list_namespaced_pod(ns).items))
for call in (core.list_namespaced_secret, core.list_namespaced_config_map):
    try:
        call(ns)
        print(call.__name__, "allowed")
    except ApiException as err:
        print(call.__name__, "denied", err.status)
"""


def test_service_account_kubeconfig_enforces_rbac(cluster: LocalCluster, kubelet: ProcessKubelet) -> None:
    ns = _namespace(cluster, "kl-rbac")
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "pod-reader", "namespace": ns},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "pod-reader", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": ns}}
    env = [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    probe = _pod(
        "probe", ns, command=["python", "-c", _RBAC_PROBE], serviceAccountName="reader", restartPolicy="Never",
        container={"env": env, "readinessProbe": None},
    )  # fmt: skip
    _apply(cluster, account, role, binding, probe)
    wait_until(
        lambda: ((_get(cluster, "pod", "probe", ns) or {}).get("status") or {}).get("phase") == "Succeeded",
        what="Succeeded",
        timeout=90.0,
        interval=0.2,
    )
    log = kubelet.log_path(ns, "probe", "engine")
    assert log is not None
    output = log.read_text()
    assert "pods: 1" in output
    assert "list_namespaced_secret denied 403" in output
    assert "list_namespaced_config_map denied 403" in output
    directory = kubelet.pod_directory(ns, "probe")
    assert directory is not None
    kubeconfig = str(directory / "kubeconfig")
    can = cluster.kubectl("auth", "can-i", "list", "pods", "-n", ns, f"--kubeconfig={kubeconfig}", check=False)
    assert can.stdout.strip() == "yes"
    cannot = cluster.kubectl("auth", "can-i", "delete", "pods", "-n", ns, f"--kubeconfig={kubeconfig}", check=False)
    assert cannot.stdout.strip() == "no"
    whoami = cluster.kubectl("auth", "whoami", "-o", "json", f"--kubeconfig={kubeconfig}")
    extra = json.loads(whoami.stdout)["status"]["userInfo"]
    assert extra["username"] == f"system:serviceaccount:{ns}:reader"
    assert extra["extra"]["authentication.kubernetes.io/pod-name"] == ["probe"]  # the token is bound to the pod


def test_deployment_pods_run(cluster: LocalCluster, kubelet: ProcessKubelet) -> None:
    ns = _namespace(cluster, "kl-deploy")
    template = {"metadata": {"labels": {"app": "engine"}}, "spec": _pod("unused", ns)["spec"]}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "engine", "namespace": ns},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "engine"}}, "template": template},
    }
    _apply(cluster, deployment)
    result = cluster.kubectl("rollout", "status", "deployment/engine", "-n", ns, "--timeout=90s", check=False)
    assert result.returncode == 0, result.stderr
    pods = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
    assert len(pods) == 2
    assert all(has_ready_condition(p) for p in pods)
    cluster.kubectl("delete", "deployment", "engine", "-n", ns, "--wait=true")
    wait_until(
        lambda: not json.loads(cluster.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"],
        what="pods gone",
        timeout=90.0,
        interval=0.2,
    )
    assert not any(k.startswith(f"{ns}/") for k in kubelet.processes())


def test_stopping_the_kubelet_stops_every_process(cluster: LocalCluster, tmp_path: Path) -> None:
    # a second node with its own scheduler name, so the module's kubelet leaves these pods alone
    ns = _namespace(cluster, "kl-stop")
    other = ProcessKubelet(
        cluster.kubeconfig,
        tmp_path / "k",
        node_name="kl-stop-node",
        scheduler_name="kl-stop",
        pod_subnet="127.0.1.0/24",
    )
    with other:
        _apply(cluster, *(_pod(n, ns, schedulerName="kl-stop") for n in ("stop-a", "stop-b")))
        wait_until(
            lambda: all(has_ready_condition(_get(cluster, "pod", n, ns) or {}) for n in ("stop-a", "stop-b")),
            what="Ready",
            timeout=90.0,
            interval=0.2,
        )
        ips = [(_get(cluster, "pod", n, ns) or {})["status"]["podIP"] for n in ("stop-a", "stop-b")]
        assert sorted(ips) == ["127.0.1.2", "127.0.1.3"]  # the second node's own pod subnet
        pids = [pid for containers in other.processes().values() for pid in containers.values()]
        assert len(pids) == 2
        assert all(pid_alive(p) for p in pids)
    assert not any(pid_alive(p) for p in pids)
    assert other.processes() == {}
    node = _get(cluster, "node", "kl-stop-node", "default")
    assert node is not None
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "False"
    cluster.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force")  # no kubelet left to do it
    assert os.path.isdir(tmp_path / "k" / "pods")


def _kubelet_process(cluster: LocalCluster, directory: Path, name: str) -> subprocess.Popen[bytes]:
    command = default_executables()["rolloutpool"]
    argv = [command, "localcluster", "kubelet", f"--dir={directory}", f"--kubeconfig={cluster.kubeconfig}"]
    argv += [f"--node-name={name}-node", f"--scheduler-name={name}", "--pod-subnet=127.0.2.0/24"]
    return start_group(argv, log=directory / "kubelet.log", append=True)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - http on loopback, built here
            return bool(resp.status == 200)
    except OSError:
        return False


def test_killed_kubelet_takes_its_pods_along_and_a_new_one_restarts_them(cluster: LocalCluster, tmp_path: Path) -> None:
    ns = _namespace(cluster, "kl-sigkill")
    first = _kubelet_process(cluster, tmp_path, "kl-sigkill")
    second: subprocess.Popen[bytes] | None = None
    try:
        _apply(cluster, _pod("victim", ns, schedulerName="kl-sigkill"))
        wait_until(
            lambda: has_ready_condition(_get(cluster, "pod", "victim", ns) or {}),
            what="Ready",
            timeout=90.0,
            interval=0.2,
        )
        ip = (_get(cluster, "pod", "victim", ns) or {})["status"]["podIP"]
        pids = _pids_with_cwd(tmp_path / "kubelet" / "pods")
        assert len(pids) == 1
        assert ip.startswith("127.0.2.")
        os.kill(first.pid, signal.SIGKILL)  # no chance to clean up: PR_SET_PDEATHSIG must do it
        first.wait(timeout=10)
        wait_until(lambda: not any(pid_alive(p) for p in pids), what="pod process gone", timeout=10, interval=0.2)
        assert not _answers(f"http://{ip}:8000/health")
        # a kubelet started again on the same node runs the pod again, on the address it had
        second = _kubelet_process(cluster, tmp_path, "kl-sigkill")
        wait_until(
            lambda: _answers(f"http://{ip}:8000/health"), what="the pod served again", timeout=90.0, interval=0.2
        )
        again = _pids_with_cwd(tmp_path / "kubelet" / "pods")
        assert len(again) == 1
        second.terminate()  # SIGTERM: the kubelet stops its pods on the way out
        assert second.wait(timeout=30) == 0
        assert not any(pid_alive(p) for p in again)
    finally:
        for proc in (first, second):
            if proc is not None:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        cluster.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force")


def _pids_with_cwd(root: Path) -> list[int]:
    """PIDs whose working directory is under ``root`` (the pod directories of a kubelet)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/cwd").startswith(str(root)):
                    found.append(int(entry))
    return found


_VOLUME_PROBE = """
import os, sys
out = sys.argv[1]
with open(out, "w") as f:
    f.write("written")
print("out", out)
print("level", os.environ["LEVEL"], "token", os.environ["TOKEN"], "tmp", os.environ["TMPDIR"])
print("secret-file", open(sys.argv[2]).read())
print("ca", os.path.exists(sys.argv[3]))
"""


def test_volumes_config_maps_and_secrets(cluster: LocalCluster, kubelet: ProcessKubelet) -> None:
    ns = _namespace(cluster, "kl-volumes")
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": ns},
        "data": {"level": "debug"},
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "sec", "namespace": ns},
        "stringData": {"token": "s3cret"},
    }
    args = ["/state/out.txt", "/etc/sec/token", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"]
    container = {
        "env": [
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "level"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
        ],
        "readinessProbe": None,
        "volumeMounts": [
            {"name": "state", "mountPath": "/state"},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - the pod's emptyDir
            {"name": "sec", "mountPath": "/etc/sec", "readOnly": True},
        ],
    }
    volumes = [
        {"name": "state", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "sec", "secret": {"secretName": "sec"}},
    ]
    pod = _pod(
        "vols",
        ns,
        command=["python", "-c", _VOLUME_PROBE, *args],
        restartPolicy="Never",
        container=container,
        volumes=volumes,
    )
    _apply(cluster, config_map, secret, pod)
    wait_until(
        lambda: ((_get(cluster, "pod", "vols", ns) or {}).get("status") or {}).get("phase") == "Succeeded",
        what="Succeeded",
        timeout=90.0,
        interval=0.2,
    )
    directory = kubelet.pod_directory(ns, "vols")
    assert directory is not None
    assert (directory / "volumes" / "state" / "out.txt").read_text() == "written"
    output = (directory / "logs" / "engine.log").read_text()
    assert f"out {directory}/volumes/state/out.txt" in output
    assert f"level debug token s3cret tmp {directory}/volumes/tmp" in output
    assert "secret-file s3cret" in output
    assert "ca True" in output  # the projected kube-api-access volume carries the cluster CA


def test_missing_secret_waits_then_runs(cluster: LocalCluster, kubelet: ProcessKubelet) -> None:
    ns = _namespace(cluster, "kl-later")
    env = [*_POD_IP_ENV, {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "later", "key": "token"}}}]
    _apply(cluster, _pod("patient", ns, container={"env": env}))

    def waiting() -> dict[str, Any] | None:
        statuses = ((_get(cluster, "pod", "patient", ns) or {}).get("status") or {}).get("containerStatuses") or []
        return (statuses[0]["state"].get("waiting") or None) if statuses else None

    state = wait_until(waiting, what="CreateContainerConfigError", timeout=90.0, interval=0.2)
    assert state["reason"] == "CreateContainerConfigError"
    assert "Secret 'later' not found" in state["message"]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "later", "namespace": ns},
        "stringData": {"token": "t"},
    }
    _apply(cluster, secret)
    wait_until(
        lambda: has_ready_condition(_get(cluster, "pod", "patient", ns) or {}),
        what="Ready once the Secret exists",
        timeout=90.0,
        interval=0.2,
    )
