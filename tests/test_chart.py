"""The Helm chart, rendered by the real helm binary: lint, templates, RBAC, schema, NOTES.

No cluster here: ``helm lint`` and ``helm template`` run offline. ``e2e/test_chart_e2e.py``
sends the same output to a real API server.
"""

from __future__ import annotations

import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from poolcases import ROOT
from rolloutpool.dev.kubelet.decide import DEFAULT_IMAGE_PATTERN, image_matches
from rolloutpool.dev.localcluster.build import ensure_binaries
from rolloutpool.reconcile.labels import DEFAULT_IMAGE, IMAGE_ENV

CHART = ROOT / "charts" / "rolloutpool"
IMAGE = "ghcr.io/rolloutpool/rolloutpool:0.1.0"
RELEASE, NAMESPACE = "rp", "rolloutpool-system"
OPERATOR = "rp-rolloutpool-operator"

# notes/interfaces.md, "RBAC the operator needs": (apiGroup, resource) -> verbs.
OPERATOR_RULES: dict[tuple[str, str], set[str]] = {
    ("rolloutpool.io", "rolloutpools"): {"get", "list", "watch", "patch", "update"},
    ("rolloutpool.io", "rolloutpools/status"): {"get", "patch", "update"},
    ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},
    ("", "services"): {"create", "get", "list", "watch", "patch", "delete"},
    ("", "serviceaccounts"): {"create", "get", "list", "watch", "patch", "delete"},
    ("apps", "deployments"): {"create", "get", "list", "watch", "patch", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"create", "get", "list", "watch", "patch", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"create", "get", "list", "watch", "patch", "delete"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    ("", "secrets"): {"create"},  # each pool's router admin token: created, never read, listed or changed
}
READ = {"get", "list", "watch"}
WRITE = {"create", "update", "patch", "delete"}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "cluster": {"watch": {"scope": "cluster"}},
    "namespaces": {"watch": {"scope": "namespaces", "namespaces": ["team-a", "team-b"]}},
    "monitoring": {
        "monitoring": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}},
        "dashboard": {"enabled": True},
    },
}


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_binaries(log=lambda _msg: None).helm


@pytest.fixture(autouse=True)
def _helm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))


def run_helm(helm: Path, *args: str, values: dict[str, Any] | None = None, tmp: Path | None = None):
    argv = [str(helm), *args]
    if values:
        assert tmp is not None
        file = tmp / "values.yaml"
        file.write_text(yaml.safe_dump(values))
        argv += ["--values", str(file)]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


def render(helm: Path, tmp: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=values, tmp=tmp)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def rule_map(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs of a Role/ClusterRole; a pair listed twice is an error."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule  # no resourceNames or nonResourceURLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert (group, resource) not in out, f"{group}/{resource} listed twice"
                out[(group, resource)] = set(rule["verbs"])
    return out


def every_rule(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for doc in docs:
        if doc["kind"] in {"Role", "ClusterRole"}:
            yield from doc["rules"]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = find(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


# -- files --------------------------------------------------------------------------------------


def test_chart_crd_is_the_top_level_crd_byte_for_byte() -> None:
    name = "rolloutpools.rolloutpool.io.yaml"
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [name]
    assert (CHART / "crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
        f"run: cp crds/{name} charts/rolloutpool/crds/"
    )


def test_notes_name_the_image_and_what_to_do_on_image_pull_backoff(helm: Path, tmp_path: Path) -> None:
    def notes(values: dict[str, Any]) -> str:
        result = run_helm(
            helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client",
            values=values, tmp=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout.split("NOTES:", 1)[1]

    default = notes({})
    assert f"every pod it creates pull {IMAGE}." in default
    assert "ImagePullBackOff" in default
    assert "The default image is not published yet" in default
    assert "--reuse-values \\\n       --set image.repository=REGISTRY/rolloutpool" in default
    assert "rolloutpool image build --archive rolloutpool.oci.tar" in default
    own = notes(
        {"image": {"repository": "registry.example/ml/rp", "tag": "0.2.0"}, "imagePullSecrets": [{"name": "a"}]}
    )
    assert "every pod it creates pull registry.example/ml/rp:0.2.0." in own
    assert "Check that registry.example/ml/rp:0.2.0 was pushed" in own
    assert "not published" not in own
    assert "(now: a)" in own


def test_chart_version_image_and_dockerfile_agree() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == version
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert f"{values['image']['repository']}:{version}" == IMAGE
    # the operator's fallback image, and the process kubelet runs it as a local process
    assert IMAGE == DEFAULT_IMAGE
    assert image_matches(IMAGE, patterns=[DEFAULT_IMAGE_PATTERN])
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["rolloutpool"]' in dockerfile
    assert "USER 65532:65532" in dockerfile
    assert "python:3.11-slim" in dockerfile


# -- lint and render ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_helm_lint_strict_is_clean(helm: Path, tmp_path: Path, case: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), values=VALUE_SETS[case], tmp=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout
    assert "[ERROR]" not in result.stdout


def test_default_render_is_cluster_scoped_operator(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {})
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole"] * 4 + ["ClusterRoleBinding", "Deployment", "ServiceAccount"]
    (deployment,) = find(docs, "Deployment", OPERATOR)
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == OPERATOR
    assert set(spec["selector"]["matchLabels"].items()) <= set(spec["template"]["metadata"]["labels"].items())
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}

    container = operator_container(docs)
    assert container["image"] == IMAGE
    assert container["command"] == [
        "rolloutpool",
        "operator",
        "--liveness-port=8081",
        "--liveness-host=$(POD_IP)",
        "--all-namespaces",
        "--standalone",
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env[IMAGE_ENV]["value"] == IMAGE
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert container["ports"] == [{"name": "healthz", "containerPort": 8081, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 65532
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]  # noqa: S108 - the pod's emptyDir
    (volume,) = pod["volumes"]
    assert volume["name"] == "tmp"
    assert "emptyDir" in volume


def test_engines_and_routers_get_the_image_the_operator_runs(helm: Path, tmp_path: Path) -> None:
    values = {"image": {"repository": "registry.example/rp", "tag": "0.2.0-rc1", "pullPolicy": "Always"}}
    container = operator_container(render(helm, tmp_path, values))
    assert container["image"] == "registry.example/rp:0.2.0-rc1"
    assert {"name": IMAGE_ENV, "value": "registry.example/rp:0.2.0-rc1"} in container["env"]
    assert container["imagePullPolicy"] == "Always"


def test_cluster_scope_binds_a_cluster_role_with_exactly_the_agreed_rules(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, VALUE_SETS["cluster"])
    assert not find(docs, "Role")
    assert not find(docs, "RoleBinding")
    (role,) = find(docs, "ClusterRole", OPERATOR)
    assert rule_map(role) == OPERATOR_RULES
    (binding,) = find(docs, "ClusterRoleBinding", OPERATOR)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]


def test_namespaced_scope_has_a_role_per_watched_namespace_and_no_cluster_grant(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, VALUE_SETS["namespaces"])
    assert not find(docs, "ClusterRoleBinding")
    assert not find(docs, "ClusterRole", OPERATOR)
    roles, bindings = find(docs, "Role"), find(docs, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for role in roles:
        assert rule_map(role) == OPERATOR_RULES
    for binding in bindings:
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": OPERATOR}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]
    command = operator_container(docs)["command"]
    assert command == [
        "rolloutpool",
        "operator",
        "--liveness-port=8081",
        "--liveness-host=$(POD_IP)",
        "--namespace=team-a",
        "--namespace=team-b",
        "--standalone",
    ]


def test_namespaced_scope_without_a_list_watches_the_release_namespace(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {"watch": {"scope": "namespaces"}})
    assert [r["metadata"]["namespace"] for r in find(docs, "Role")] == [NAMESPACE]
    assert f"--namespace={NAMESPACE}" in operator_container(docs)["command"]


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_no_role_has_wildcards_or_reads_secrets(helm: Path, tmp_path: Path, case: str) -> None:
    docs = render(helm, tmp_path, VALUE_SETS[case])
    rules = list(every_rule(docs))
    assert rules
    for rule in rules:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], rule
        assert not {"configmaps", "nodes", "pods/exec"} & set(rule["resources"]), rule
        if "secrets" in rule["resources"]:  # the routers' admin tokens: create only, never a read
            assert (rule["resources"], rule["verbs"]) == (["secrets"], ["create"]), rule
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def test_aggregated_roles_view_edit_admin(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, {})
    roles = {}
    for level in ("view", "edit", "admin"):
        (role,) = find(docs, "ClusterRole", f"rp-rolloutpool-{level}")
        assert role["metadata"]["labels"][f"rbac.authorization.k8s.io/aggregate-to-{level}"] == "true"
        roles[level] = rule_map(role)
        # status is written by the operator only
        assert roles[level][("rolloutpool.io", "rolloutpools/status")] == READ
        assert {group for group, _ in roles[level]} == {"rolloutpool.io"}
    assert roles["view"][("rolloutpool.io", "rolloutpools")] == READ
    assert roles["edit"][("rolloutpool.io", "rolloutpools")] == READ | WRITE
    assert roles["admin"][("rolloutpool.io", "rolloutpools")] == READ | WRITE | {"deletecollection"}
    off = render(helm, tmp_path, {"rbac": {"aggregateToDefaultRoles": False}})
    assert [r["metadata"]["name"] for r in find(off, "ClusterRole")] == [OPERATOR]


def test_monitors_and_dashboard_render_when_enabled(helm: Path, tmp_path: Path) -> None:
    assert not find(render(helm, tmp_path, {}), "ConfigMap")
    docs = render(helm, tmp_path, VALUE_SETS["monitoring"])
    (pod_monitor,) = find(docs, "PodMonitor")
    assert pod_monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = pod_monitor["spec"]
    assert spec["namespaceSelector"] == {"any": True}
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "rolloutpool-operator"
    assert spec["podTargetLabels"][0] == "rolloutpool.io/pool"
    assert spec["podMetricsEndpoints"][0]["port"] == "http"
    (service_monitor,) = find(docs, "ServiceMonitor")
    assert service_monitor["spec"]["selector"]["matchLabels"]["rolloutpool.io/component"] == "router"
    (dashboard,) = find(docs, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["rolloutpool.json"] == (CHART / "dashboards" / "rolloutpool.json").read_text().strip()

    scoped = render(helm, tmp_path, {**VALUE_SETS["monitoring"], **VALUE_SETS["namespaces"]})
    (pod_monitor,) = find(scoped, "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


# -- schema and NOTES ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"watch": {"scope": "galaxy"}}, "at '/watch/scope': value must be one of 'cluster', 'namespaces'"),
        ({"replicaCount": 2}, "additional properties 'replicaCount' not allowed"),
        ({"watch": {"namespaces": ["Not_A_Namespace"]}}, "at '/watch/namespaces/0'"),
        ({"operator": {"livenessPort": 0}}, "at '/operator/livenessPort'"),
        ({"operator": {"securityContext": {"readOnlyRootFilesystem": False}}}, "readOnlyRootFilesystem"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy'"),
        (
            {"monitoring": {"podMonitor": {"enabled": True, "interval": "often"}}},
            "at '/monitoring/podMonitor/interval'",
        ),
    ],
    ids=["scope", "unknown-key", "namespace-name", "port", "read-only-root", "pull-policy", "interval"],
)
def test_schema_rejects_bad_values_with_a_clear_error(
    helm: Path, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), values=values, tmp=tmp_path)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


def test_notes_say_what_to_apply_next(helm: Path, tmp_path: Path) -> None:
    result = run_helm(
        helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client",
        values=VALUE_SETS["namespaces"], tmp=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl apply -n team-a -f examples/simulated-pool.yaml" in notes
    assert "kubectl get rp -n team-a -w" in notes
    assert "kubectl wait -n team-a --for=condition=Ready rp/sim-grpo" in notes
    assert f"rollout status deployment/{OPERATOR}" in notes
    assert "team-a, team-b (and nowhere else)" in notes
