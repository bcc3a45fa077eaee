"""The whole product on one machine, as a user runs it, and the faults it must survive.

One ``LocalStack`` for the module (real control plane, process kubelet, Prometheus, the
chart installed with ``helm``; always stopped, and no process may be left afterwards), one
simulated pool (``rolloutpool demo``'s) applied with ``kubectl``. The tests run in file
order; each starts by waiting until the pool is quiet (ready, no sessions, nothing
quarantined) and leaves it that way, except the last, which uninstalls everything.

Recorded for the closing note: ``docs/img/fullstack-get-rp-w.txt`` (``kubectl get rp -w``
through a quarantine and its release) and ``docs/img/fullstack-describe-rp.txt``.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from fullstack_kit import (
    LoadRun,
    RpWatch,
    condition,
    diagnosis,
    engine_pods,
    http_json,
    isolated_stack,
    live_by_replica,
    pod_pids,
    pod_ready,
    processes_under,
    router_metrics,
    router_pod,
    wait_until,
)
from rolloutpool.demo import POOL, demo_pool
from rolloutpool.reconcile.caps import parse_spec, replica_caps
from rolloutpool.stack import LocalStack

DOCS = Path(__file__).resolve().parent.parent / "docs" / "img"
TIME_SCALE = 10.0
IN_FLIGHT = 36
SA = "system:serviceaccount:rolloutpool-system:rolloutpool-operator"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    directory = tmp_path_factory.mktemp("fullstack")
    with isolated_stack(directory) as running:
        yield running
    assert processes_under(str(directory)) == [], "processes of the stack left running"


@pytest.fixture(scope="module")
def manifest(stack: LocalStack) -> dict[str, Any]:
    """The demo's pool, applied with ``kubectl apply``; ``kubectl wait`` for ``Ready`` must succeed."""
    pool = demo_pool(prometheus_url=stack.prometheus_url, time_scale=TIME_SCALE)
    assert stack.apply(yaml.safe_dump(pool)) == f"rolloutpool.rolloutpool.io/{POOL} created"
    waited = stack.cluster.kubectl("wait", "--for=condition=Ready", f"rp/{POOL}", "--timeout=110s", check=False)
    assert "condition met" in waited.stdout, f"{waited.stderr}\n{diagnosis(stack)}"
    return pool


def _kubectl(stack: LocalStack, *args: str) -> str:
    return stack.cluster.kubectl(*args).stdout


def _router(stack: LocalStack) -> str:
    url: str = wait_until("a ready router pod", lambda: stack.router_url(POOL), timeout=120)
    return url


def _quiet(stack: LocalStack, timeout: float = 150) -> dict[str, Any]:
    """Wait until the pool is ready with every engine ready, no live session and nothing quarantined."""

    def check() -> dict[str, Any] | None:
        pool = stack.pool(POOL)
        status = pool.get("status") or {}
        pods = engine_pods(stack, POOL)
        url = stack.router_url(POOL)
        ok = (
            condition(pool, "Ready").get("status") == "True"
            and condition(pool, "ReplicasQuarantined").get("status") == "False"
            and status.get("liveSessions") == 0
            and len(pods) == 3
            and all(pod_ready(p) for p in pods.values())
            and url is not None
            and sum(live_by_replica(router_metrics(url)).values()) == 0
        )
        return pool if ok else None

    pool: dict[str, Any] = wait_until("the pool quiet", check, timeout=timeout, interval=1.0)
    return pool


def _floor(manifest: dict[str, Any]) -> int:
    spec, error = parse_spec(pool=manifest)
    assert spec is not None, error
    caps = replica_caps(spec=spec, kv_capacity_tokens=manifest["spec"]["engine"]["kvCapacityTokens"])
    assert caps is not None
    return caps.floor


def _jwt_subject(kubeconfig: Path) -> str:
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    payload = token.split(".")[1]
    return str(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["sub"])


def test_helm_installed_operator_runs_under_its_own_account_and_the_pool_becomes_ready(
    stack: LocalStack, manifest: dict[str, Any]
) -> None:
    (operator,) = stack.get_json("pods", "-n", stack.namespace, "-l", "app.kubernetes.io/component=operator")["items"]
    assert operator["spec"]["serviceAccountName"] == "rolloutpool-operator"
    assert pod_ready(operator)
    home = stack.directory / "cluster" / "kubelet" / "pods"
    (directory,) = home.glob(f"{stack.namespace}_{operator['metadata']['name']}_*")
    log = (directory / "logs" / "operator.log").read_text()
    assert f"Started operator kubeconfig={directory / 'kubeconfig'}" in log, log[:3000]
    assert "Activity 'login_via_client' succeeded" in log, log[:3000]
    assert _jwt_subject(directory / "kubeconfig") == SA  # the pod's token is its ServiceAccount's
    for verb, resource, allowed in [
        ("get", "secrets", "no"),
        ("list", "secrets", "no"),
        ("create", "pods", "yes"),
        ("patch", "rolloutpools.rolloutpool.io/status", "yes"),
        ("delete", "nodes", "no"),
    ]:
        answer = stack.cluster.kubectl("auth", "can-i", verb, resource, f"--as={SA}", "-A", check=False)
        assert answer.stdout.strip() == allowed, (verb, resource, answer.stdout, answer.stderr)

    pods = engine_pods(stack, POOL)
    assert sorted(pods) == [f"{POOL}-engine-{i}" for i in range(3)]
    routers = router_pod(stack, POOL)
    assert len(routers) == 1
    for pod in [*pods.values(), *routers]:
        assert pod["status"]["phase"] == "Running", pod["metadata"]["name"]
        assert pod_ready(pod), pod["metadata"]["name"]
        assert pod_pids(stack, pod), f"no process runs {pod['metadata']['name']}"
    pool = stack.pool(POOL)
    assert condition(pool, "Ready")["reason"] == "Ready"
    assert pool["status"]["readyReplicas"] == 3
    assert http_json("GET", f"{_router(stack)}/v1/models")["data"], "the router serves no model"


def test_load_quarantines_a_replica_and_the_quarantine_clears_when_sessions_end(
    stack: LocalStack, manifest: dict[str, Any], tmp_path: Path
) -> None:
    _quiet(stack)
    url = _router(stack)
    quarantined = '{.status.conditions[?(@.type=="ReplicasQuarantined")].status}'
    with RpWatch(stack, tmp_path / "get-rp-w.txt") as watch:
        load = LoadRun(url, in_flight=IN_FLIGHT, seconds=240, time_scale=TIME_SCALE, prefix="pressure")
        try:
            wait_until(
                "ReplicasQuarantined=True",
                lambda: _kubectl(stack, "get", "rp", POOL, "-o", f"jsonpath={quarantined}") == "True",
                timeout=200,
                interval=1.0,
            )
            at_quarantine = stack.pool(POOL)
            describe_quarantined = _kubectl(stack, "describe", "rp", POOL)
        finally:
            load.stop()
        stopped = time.monotonic()
        cleared = stack.cluster.kubectl(
            "wait", "--for=condition=ReplicasQuarantined=False", f"rp/{POOL}", "--timeout=110s"
        )
        assert "condition met" in cleared.stdout
        print(f"load stopped -> ReplicasQuarantined=False: {time.monotonic() - stopped:.1f}s")
        released = _quiet(stack)  # sessions released, or expired when the client gave up on them
        print(f"load stopped -> no live session: {time.monotonic() - stopped:.1f}s")
        describe_released = _kubectl(stack, "describe", "rp", POOL)
        time.sleep(3)  # the watch prints the last status change
        excerpt = watch.stop()

    held = [r for r in at_quarantine["status"]["replicaStatus"] if r["quarantined"]]
    assert held, at_quarantine["status"]
    assert all(r["reason"] for r in held), at_quarantine["status"]
    message = condition(at_quarantine, "ReplicasQuarantined")
    assert message["reason"] == "KVPressure", message
    assert held[0]["name"] in message["message"], message
    assert not any(r["quarantined"] for r in released["status"]["replicaStatus"])
    assert "ReplicaQuarantined" in describe_released, describe_released
    assert "ReplicaReleased" in describe_released, describe_released
    lines = excerpt.splitlines()
    assert lines[0].split() == ["NAME", "REPLICAS", "READY", "SESSIONS", "QUARANTINED", "AGE"], excerpt
    column = [line.split()[4] for line in lines[1:]]
    assert "1" in column or "2" in column, excerpt
    assert column[-1] == "0", excerpt
    stamp = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, e2e/test_fullstack_e2e.py"
    (DOCS / "fullstack-get-rp-w.txt").write_text(
        f"# kubectl get rp -w  ({stamp}: {IN_FLIGHT} rollouts, then the load stops)\n{excerpt}"
    )
    (DOCS / "fullstack-describe-rp.txt").write_text(
        f"# kubectl describe rp {POOL}  ({stamp})\n\n## while a replica is quarantined\n\n{describe_quarantined}"
        f"\n## after the load stopped and the quarantine cleared\n\n{describe_released}"
    )
