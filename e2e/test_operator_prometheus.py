"""The slow loop against a real Prometheus: metrics available, then Prometheus stopped -> no target.

Real engine simulators serve ``/metrics`` on loopback addresses; their pods (created by the
operator) are given those addresses as pod IPs by the test, which fakes the kubelet until
the process kubelet runs them. Debian's Prometheus discovers the pods through the real API
server (``local_cluster_prometheus``) and scrapes them; the operator reads it every
``autoscaling.intervalSeconds``. Stopping Prometheus must turn ``MetricsAvailable`` False
with ``PrometheusUnreachable`` and withdraw every working-set target the law set (``targetReason`` ``NoMetrics``):
the routers' own target, safe without measurements, applies until Prometheus answers again.
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

from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.localcluster.prometheus import local_cluster_prometheus
from rolloutpool.dev.wait import wait_until
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

CAPACITY, CONTEXT = 65536, 8192
TARGET = 0.8
"""The pool's ``workingSetTarget``: where the law starts each replica (an idle fleet gives it no reason to move)."""


@pytest.fixture
def kube(cluster: LocalCluster) -> Iterator[tuple[client.CoreV1Api, client.CustomObjectsApi]]:
    connection = api(cluster)
    try:
        yield client.CoreV1Api(connection), client.CustomObjectsApi(connection)
    finally:
        connection.close()  # type: ignore[no-untyped-call]


def test_metrics_from_prometheus_then_no_target_when_it_stops(
    cluster: LocalCluster, kube: tuple[client.CoreV1Api, client.CustomObjectsApi], tmp_path: Path
) -> None:
    core, custom = kube
    subnet = f"127.{10 + secrets.randbelow(240)}.{1 + secrets.randbelow(250)}"
    ips = {f"watched-engine-{i}": f"{subnet}.{i + 1}" for i in range(2)}
    pool: dict[str, Any] = copy.deepcopy(yaml.safe_load((EXAMPLES / "simulated-pool.yaml").read_text()))
    pool["metadata"]["name"] = "watched"
    pool["spec"]["replicas"] = 2
    pool["spec"]["engine"].update(maxModelLen=CONTEXT, kvCapacityTokens=CAPACITY)
    pool["spec"]["concurrency"] = {"workingSetTarget": TARGET}
    with (
        namespace(cluster, "op-prometheus") as ns,
        ProcessSet(tmp_path / "engines") as engines,
        local_cluster_prometheus(cluster, namespaces=[ns], scrape_interval_seconds=1.0) as prometheus,
    ):
        for name, ip in ips.items():  # the engine processes the pods stand for, on port 8000 of their IPs
            argv = rolloutpool_argv(
                "engine-sim", f"--host={ip}", "--port=8000", f"--kv-capacity-tokens={CAPACITY}",
                f"--max-model-len={CONTEXT}",
            )  # fmt: skip
            engines.start(name, argv, ready_url=f"http://{ip}:8000/health")
        pool["spec"]["autoscaling"] = {"enabled": True, "prometheusUrl": prometheus.url, "intervalSeconds": 5}
        with OperatorProcess(cluster, ns, tmp_path / "operator.log"):
            apply_pool(cluster, ns, pool)
            wait_until(
                lambda: len(child_pods(core, ns, "watched")) == 2, what="2 engine pods", timeout=30.0, interval=0.1
            )
            for name, ip in ips.items():
                play_kubelet(core, ns, name, ip=ip)
            started = time.monotonic()

            def available() -> dict[str, Any] | None:
                status = pool_status(custom, ns, "watched")
                return status if condition(status, "MetricsAvailable").get("status") == "True" else None

            status = wait_until(
                available, what="MetricsAvailable=True from the real Prometheus", timeout=90, interval=0.1
            )
            print(f"pods ready -> MetricsAvailable=True: {time.monotonic() - started:.1f}s")
            assert condition(status, "MetricsAvailable")["reason"] == "MetricsAvailable"
            entries = status["replicaStatus"]
            assert {e["kvCapacityTokens"] for e in entries} == {CAPACITY}, dumps(entries)
            assert all(e["kvUsage"] == 0.0 for e in entries), dumps(entries)
            # the law took over each replica at the pool's target; nothing pressed or waited, so it holds there
            assert {e.get("target") for e in entries} == {TARGET}, dumps(entries)
            assert all("cap" not in e and not e["quarantined"] for e in entries), dumps(entries)

            prometheus.stop()
            stopped = time.monotonic()

            def blind() -> dict[str, Any] | None:
                status = pool_status(custom, ns, "watched")
                metrics = condition(status, "MetricsAvailable")
                return status if metrics.get("reason") == "PrometheusUnreachable" else None

            status = wait_until(blind, what="MetricsAvailable=False PrometheusUnreachable", timeout=60, interval=0.1)
            print(f"Prometheus stopped -> PrometheusUnreachable and no target: {time.monotonic() - stopped:.1f}s")
            assert condition(status, "MetricsAvailable")["status"] == "False"
            blind_entries = status["replicaStatus"]
            assert all("target" not in e for e in blind_entries), dumps(status)  # the routers' own applies
            assert {e.get("targetReason") for e in blind_entries} == {"NoMetrics"}, dumps(status)
            assert not any(e["quarantined"] for e in status["replicaStatus"])
