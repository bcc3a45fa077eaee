"""The Helm chart against a real kube-apiserver: server-side dry run, install/uninstall, real RBAC.

There is no kubelet or scheduler here: the operator pod is created and stays Pending, which is
all these tests need. Least privilege is checked with ``kubectl auth can-i --as`` the operator's
ServiceAccount, answered by the API server's RBAC authorizer.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from poolcases import ROOT
from rolloutpool.api.crd import CRD_NAME
from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.wait import wait_until
from test_chart import OPERATOR_RULES

CHART = ROOT / "charts" / "rolloutpool"
SA_PREFIX = "system:serviceaccount"  # + ":<namespace>:<name>"
GROUP = "rolloutpool.io"


@pytest.fixture
def helm(cluster: LocalCluster, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    env = cluster.env()
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(tmp_path / var.lower())

    def run(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
        argv = [str(cluster.binaries.helm), *args]
        if values:
            file = tmp_path / "values.yaml"
            file.write_text(yaml.safe_dump(values))
            argv += ["--values", str(file)]
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=300)

    return run


def ensure_namespaces(cluster: LocalCluster, *names: str) -> None:
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}} for name in names]
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(docs))


def exists(cluster: LocalCluster, *ref: str) -> bool:
    return cluster.kubectl("get", *ref, "--ignore-not-found", "-o", "name", check=False).stdout.strip() != ""


def can_i(cluster: LocalCluster, sa: str, verb: str, resource: str, *, group: str, namespace: str | None) -> bool:
    resource, _, subresource = resource.partition("/")
    args = ["auth", "can-i", verb, f"{resource}.{group}" if group else resource, f"--as={sa}"]
    args += [f"--subresource={subresource}"] if subresource else []
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    result = cluster.kubectl(*args, check=False)
    assert result.stdout.strip() in {"yes", "no"}, result.stdout + result.stderr
    return result.stdout.strip() == "yes"


Check = tuple[str, str, str]
"""(verb, apiGroup, resource or resource/subresource)."""

AGREED: list[Check] = sorted((verb, group, res) for (group, res), verbs in OPERATOR_RULES.items() for verb in verbs)
FORBIDDEN: list[Check] = [
    ("get", "", "secrets"),
    ("list", "", "secrets"),
    ("watch", "", "secrets"),
    ("get", "", "configmaps"),
    ("create", "", "pods/exec"),
    ("delete", "rolloutpool.io", "rolloutpools"),
    ("create", "rolloutpool.io", "rolloutpools"),
    ("update", "apps", "deployments"),
    ("update", "", "pods"),
    ("create", "rbac.authorization.k8s.io", "clusterroles"),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings"),
    ("bind", "rbac.authorization.k8s.io", "roles"),
    ("escalate", "rbac.authorization.k8s.io", "roles"),
    ("impersonate", "", "serviceaccounts"),
    ("create", "", "serviceaccounts/token"),
    ("list", "", "nodes"),
    ("delete", "", "namespaces"),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions"),
]


def access(cluster: LocalCluster, sa: str, checks: list[Check], namespace: str | None) -> dict[Check, bool]:
    """The API server's RBAC decision on each check for ServiceAccount ``sa`` (``<ns>:<name>``).

    One SubjectAccessReview per check, all created by one kubectl call: the same question
    ``kubectl auth can-i --as`` asks, without a process per check. ``namespace=None`` asks
    about every namespace at once (a cluster-wide grant).
    """
    sa_namespace = sa.split(":", maxsplit=1)[0]
    reviews = []
    for verb, group, resource in checks:
        name, _, subresource = resource.partition("/")
        attributes = {"verb": verb, "group": group, "resource": name, "subresource": subresource}
        attributes |= {"namespace": namespace} if namespace else {}
        spec = {
            "user": f"{SA_PREFIX}:{sa}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa_namespace}", "system:authenticated"],
            "resourceAttributes": attributes,
        }
        reviews.append({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
    listing = {"apiVersion": "v1", "kind": "List", "items": reviews}
    # kubectl prints the template once per created review, in input order
    out = cluster.kubectl("create", "-o", "jsonpath={.status.allowed} ", "-f", "-", input_text=json.dumps(listing))
    answers = out.stdout.split()
    assert set(answers) <= {"true", "false"}, out.stdout
    return {check: answer == "true" for check, answer in zip(checks, answers, strict=True)}


def allowed(cluster: LocalCluster, sa: str, checks: list[Check], namespace: str | None) -> list[Check]:
    return [check for check, yes in access(cluster, sa, checks, namespace).items() if yes]


def refused(cluster: LocalCluster, sa: str, checks: list[Check], namespace: str | None) -> list[Check]:
    return [check for check, yes in access(cluster, sa, checks, namespace).items() if not yes]


def render(helm: Callable[..., subprocess.CompletedProcess[str]], release: str, namespace: str, values: dict) -> str:
    result = helm("template", release, str(CHART), "--namespace", namespace, values=values)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def installed(
    cluster: LocalCluster, helm: Callable[..., subprocess.CompletedProcess[str]]
) -> Iterator[Callable[[str, str, dict[str, Any]], None]]:
    """``install(release, namespace, values)``; every release is uninstalled after the test."""
    releases: list[tuple[str, str]] = []

    def install(release: str, namespace: str, values: dict[str, Any]) -> None:
        ensure_namespaces(cluster, namespace)
        releases.append((release, namespace))
        result = helm("install", release, str(CHART), "--namespace", namespace, values=values)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "NOTES:" in result.stdout

    yield install
    for release, namespace in releases:
        helm("uninstall", release, "--namespace", namespace)


@pytest.mark.parametrize(
    "values",
    [
        {"dashboard": {"enabled": True}},
        {
            "dashboard": {"enabled": True},
            "watch": {"scope": "namespaces", "namespaces": ["chart-dry-a", "chart-dry-b"]},
        },
    ],
    ids=["cluster", "namespaces"],
)
def test_every_rendered_object_passes_a_server_side_dry_run(
    cluster: LocalCluster, helm: Callable[..., subprocess.CompletedProcess[str]], values: dict[str, Any]
) -> None:
    ensure_namespaces(cluster, "chart-dry", "chart-dry-a", "chart-dry-b")
    manifests = render(helm, "dry", "chart-dry", values)
    docs = [d for d in yaml.safe_load_all(manifests) if d]
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ConfigMap"} <= {d["kind"] for d in docs}
    crd = (CHART / "crds" / f"{CRD_NAME}.yaml").read_text()
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input_text=f"{manifests}\n---\n{crd}",
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == len(docs) + 1, result.stdout
    assert all(line.endswith("(server dry run)") for line in lines), result.stdout
    assert not exists(cluster, "deployment", "dry-rolloutpool-operator", "-n", "chart-dry")


def test_install_creates_the_operator_and_uninstall_leaves_only_the_crd(
    cluster: LocalCluster,
    helm: Callable[..., subprocess.CompletedProcess[str]],
    installed: Callable[[str, str, dict[str, Any]], None],
) -> None:
    ns, name = "chart-install", "inst-rolloutpool-operator"
    installed("inst", ns, {})
    objects = [
        ("deployment", name, "-n", ns),
        ("serviceaccount", name, "-n", ns),
        ("clusterrole", name),
        ("clusterrolebinding", name),
        *(("clusterrole", f"inst-rolloutpool-{level}") for level in ("view", "edit", "admin")),
    ]
    for ref in objects:
        assert exists(cluster, *ref), ref
    # the controller-manager turns the Deployment into a (Pending) pod: the pod template is valid
    selector = "app.kubernetes.io/instance=inst,app.kubernetes.io/component=operator"
    wait_until(
        lambda: exists(cluster, "pods", "-n", ns, "-l", selector),
        what="the operator pod exists",
        timeout=60.0,
        interval=0.25,
    )

    status = helm("status", "inst", "--namespace", ns)
    assert "STATUS: deployed" in status.stdout

    result = helm("uninstall", "inst", "--namespace", ns)
    assert result.returncode == 0, result.stderr
    for ref in objects:
        wait_until(lambda ref=ref: not exists(cluster, *ref), what=f"{ref} is deleted", timeout=60.0, interval=0.25)
    wait_until(
        lambda: not exists(cluster, "replicasets,pods", "-n", ns, "-l", selector),
        what="the pods are collected",
        timeout=60.0,
        interval=0.25,
    )
    assert exists(cluster, "crd", CRD_NAME)


def test_cluster_scope_grants_exactly_the_agreed_access(
    cluster: LocalCluster, installed: Callable[[str, str, dict[str, Any]], None]
) -> None:
    installed("wide", "chart-wide", {"watch": {"scope": "cluster"}})
    sa = "chart-wide:wide-rolloutpool-operator"
    ensure_namespaces(cluster, "chart-anywhere")
    for namespace in ("chart-anywhere", "chart-wide", None):
        assert refused(cluster, sa, AGREED, namespace) == []
        assert allowed(cluster, sa, FORBIDDEN, namespace) == []


def test_namespaced_scope_confines_the_operator_to_its_namespaces(
    cluster: LocalCluster, installed: Callable[[str, str, dict[str, Any]], None]
) -> None:
    ensure_namespaces(cluster, "chart-team-a", "chart-team-b", "chart-team-c")
    watch = {"scope": "namespaces", "namespaces": ["chart-team-a", "chart-team-b"]}
    installed("narrow", "chart-narrow", {"watch": watch})
    sa = "chart-narrow:narrow-rolloutpool-operator"
    for namespace in ("chart-team-a", "chart-team-b"):
        assert refused(cluster, sa, AGREED, namespace) == []
        assert allowed(cluster, sa, FORBIDDEN, namespace) == []
    # not even its own (unwatched) namespace, nor cluster-wide
    for namespace in ("chart-team-c", "chart-narrow", "default", None):
        assert allowed(cluster, sa, AGREED + FORBIDDEN, namespace) == []

    # kubectl auth can-i --as (impersonation) gives the same answers as the reviews above
    user = f"{SA_PREFIX}:{sa}"
    sample = [AGREED[0], AGREED[-1], ("create", "", "pods"), ("get", "", "secrets"), ("update", "apps", "deployments")]
    for namespace in ("chart-team-a", "chart-team-c"):
        expected = access(cluster, sa, sample, namespace)
        for verb, group, resource in sample:
            answer = can_i(cluster, user, verb, resource, group=group, namespace=namespace)
            assert answer == expected[(verb, group, resource)], (verb, group, resource, namespace)
    assert can_i(cluster, user, "create", "pods", group="", namespace="chart-team-b")
    assert not can_i(cluster, user, "create", "pods", group="", namespace="chart-team-c")
    assert not can_i(cluster, user, "get", "secrets", group="", namespace="chart-team-a")


def test_aggregated_roles_reach_the_builtin_view_and_edit(
    cluster: LocalCluster, installed: Callable[[str, str, dict[str, Any]], None]
) -> None:
    installed("agg", "chart-agg", {})
    ns = "chart-users"
    ensure_namespaces(cluster, ns)
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        for user, role in (("viewer", "view"), ("editor", "edit"), ("owner", "admin"))
    ]
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(bindings))
    # the controller-manager's aggregation controller copies the rules into the built-in roles
    wait_until(
        lambda: can_i(cluster, "editor", "create", "rolloutpools", group=GROUP, namespace=ns),
        what="edit aggregates",
        timeout=60.0,
        interval=0.25,
    )
    wait_until(
        lambda: can_i(cluster, "viewer", "get", "rolloutpools", group=GROUP, namespace=ns),
        what="view aggregates",
        timeout=60.0,
        interval=0.25,
    )
    wait_until(
        lambda: can_i(cluster, "owner", "deletecollection", "rolloutpools", group=GROUP, namespace=ns),
        what="admin aggregates",
        timeout=60.0,
        interval=0.25,
    )
    assert can_i(cluster, "viewer", "get", "rolloutpools/status", group=GROUP, namespace=ns)
    assert not can_i(cluster, "viewer", "create", "rolloutpools", group=GROUP, namespace=ns)
    assert not can_i(cluster, "editor", "patch", "rolloutpools/status", group=GROUP, namespace=ns)
    assert can_i(cluster, "editor", "patch", "rolloutpools/scale", group=GROUP, namespace=ns)
    assert not can_i(cluster, "editor", "get", "rolloutpools", group=GROUP, namespace="default")
