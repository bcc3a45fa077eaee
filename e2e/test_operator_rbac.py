"""The operator runs on the agreed least-privilege RBAC: a namespaced Role, nothing cluster-wide.

The operator authenticates as a ServiceAccount (a token from the TokenRequest API) bound
to a Role with exactly the rules of the interface notes, in the namespace it serves. It
must create the children, write the status and post Events without a single denied
request. No kubelet runs yet: pods stay Pending, which this test does not need.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.wait import wait_until
from test_operator_kit import EXAMPLES, OperatorProcess, apply_pool, namespace

NS = "op-rbac"
RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["rolloutpool.io"],
        "resources": ["rolloutpools"],
        "verbs": ["get", "list", "watch", "patch", "update"],
    },
    {"apiGroups": ["rolloutpool.io"], "resources": ["rolloutpools/status"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete", "patch"]},
    {
        "apiGroups": [""],
        "resources": ["services", "serviceaccounts"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    # create only: the operator makes each pool's router admin token and never reads a Secret (the chart's rule)
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    {
        "apiGroups": ["apps"],
        "resources": ["deployments"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
]


def _token_kubeconfig(cluster: LocalCluster, ns: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount ``operator`` of ``ns``."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    token = cluster.kubectl("create", "token", "operator", "-n", ns, "--duration=1h").stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": admin["clusters"][0]["name"], "user": "operator"}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def test_the_agreed_namespaced_rbac_is_enough(cluster: LocalCluster, tmp_path: Path) -> None:
    with namespace(cluster, NS) as ns:
        cluster.kubectl("create", "serviceaccount", "operator", "-n", ns)
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "rolloutpool-operator", "namespace": ns},
            "rules": RULES,
        }
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(role))
        cluster.kubectl(
            "create", "rolebinding", "rolloutpool-operator", "-n", ns,
            "--role=rolloutpool-operator", f"--serviceaccount={ns}:operator",
        )  # fmt: skip
        kubeconfig = _token_kubeconfig(cluster, ns, tmp_path / "operator.kubeconfig")
        pool = copy.deepcopy(yaml.safe_load((EXAMPLES / "simulated-pool.yaml").read_text()))
        pool["spec"]["replicas"] = 2
        with OperatorProcess(cluster, ns, tmp_path / "operator.log", kubeconfig=kubeconfig) as operator:
            apply_pool(cluster, ns, pool)

            def settled() -> bool:
                out = cluster.kubectl("get", "rp", "sim-grpo", "-n", ns, "-o", "jsonpath={.status.replicas}").stdout
                kinds = "pods,deployment,service,serviceaccount,role,rolebinding"
                children = cluster.kubectl("get", kinds, "-n", ns, "-l", "rolloutpool.io/pool=sim-grpo", "-o", "name")
                return out == "2" and len(children.stdout.split()) >= 7  # 2 engines, a router pod, 5 router objects

            wait_until(settled, what="children and status written by the restricted operator", timeout=60, interval=0.1)
            # an unservable spec makes the operator post a Warning Event on the pool
            patch = '{"spec": {"concurrency": {"maxSessionsPerReplica": 5}}}'
            cluster.kubectl("patch", "rp", "sim-grpo", "-n", ns, "--type=merge", "-p", patch)

            def warned() -> bool:
                selector = "involvedObject.kind=RolloutPool,reason=InvalidMaxSessionsPerReplica"
                return "sim-grpo" in cluster.kubectl("get", "events", "-n", ns, "--field-selector", selector).stdout

            wait_until(warned, what="the Warning Event posted by the restricted operator", timeout=30.0, interval=0.1)
            logs = operator.logs()
        for denied in ("Forbidden", "status=403", "'code': 403", "Not enough permissions", "Traceback"):
            assert denied not in logs, logs
