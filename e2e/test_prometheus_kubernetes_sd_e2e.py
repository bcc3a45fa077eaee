"""Prometheus discovers annotated pods through the real local API server (pod role).

Debian's Prometheus has no kubernetes_sd: then a PodDiscoveryBridge lists the pods from the
API server and serves them over HTTP SD with kubernetes_sd's meta labels, and Prometheus
applies the same relabelling. No kubelet runs these pods: a pod object's status is patched to
carry the pod IP 127.0.0.1, where an engine-sim process listens on the annotated port. Prometheus must find the pod,
scrape that address, and label the series ``namespace``, ``pod`` and ``rolloutpool_io_pool``;
an unannotated pod must be dropped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.localcluster.prometheus import local_cluster_prometheus
from rolloutpool.dev.net import free_port
from rolloutpool.metrics.prom import PrometheusSignals

NAMESPACE = "prom-sd"
POOL = "sdpool"


def pod_manifest(name: str, *, port: int, annotated: bool) -> dict[str, Any]:
    """A pod no kubelet will run (its node selector matches no node); Prometheus only reads it."""
    annotations = (
        {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}
        if annotated
        else {}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"rolloutpool.io/pool": POOL, "rolloutpool.io/component": "engine"},
            "annotations": annotations,
        },
        "spec": {
            "nodeSelector": {"rolloutpool.io/no-such-node": "true"},
            "containers": [{"name": "engine", "image": "example.invalid/not-run:0"}],
        },
    }


def give_pod_ip(cluster: LocalCluster, name: str) -> None:
    status = {"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
    cluster.kubectl(
        "patch", "pod", name, "-n", NAMESPACE, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[int]:
    """An engine-sim on 127.0.0.1; yields its port."""
    with ProcessSet(tmp_path / "logs") as processes:
        port = free_port()
        argv = rolloutpool_argv("engine-sim", f"--port={port}", "--kv-capacity-tokens=4096", "--max-model-len=1024")
        processes.start("engine", argv, ready_url=f"http://127.0.0.1:{port}/health")
        yield port


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    cluster.kubectl("create", "namespace", NAMESPACE)
    try:
        yield NAMESPACE
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def test_kubernetes_sd_discovers_annotated_pods_and_labels_their_series(
    cluster: LocalCluster, namespace: str, engine: int
) -> None:
    for name, annotated in (("sdpool-engine-0", True), ("sdpool-plain", False)):
        manifest = pod_manifest(name, port=engine, annotated=annotated)
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))
        give_pod_ip(cluster, name)

    with local_cluster_prometheus(cluster, namespaces=[namespace], scrape_interval_seconds=1.0) as prom:
        deadline = time.monotonic() + 60
        while True:
            active = prom.api("targets?state=active")["activeTargets"]
            up = [t for t in active if t["health"] == "up"]
            if up:
                break
            assert time.monotonic() < deadline, f"no target up: {active}\n{prom.log_tail()}"
            time.sleep(0.5)
        assert len(active) == 1, "the unannotated pod is not scraped"
        target = up[0]
        assert target["scrapeUrl"] == f"http://127.0.0.1:{engine}/metrics"
        labels = target["labels"]
        assert labels["namespace"] == NAMESPACE
        assert labels["pod"] == "sdpool-engine-0"
        assert labels["rolloutpool_io_pool"] == POOL

        with PrometheusSignals(prom.url) as reader:
            deadline = time.monotonic() + 30
            while True:
                signals = reader.read(namespace=NAMESPACE, replicas=["sdpool-engine-0"], window_seconds=15)
                found = signals["sdpool-engine-0"]
                if found is not None and found.kv_usage is not None:
                    break
                assert time.monotonic() < deadline, f"no engine series: {signals}"
                time.sleep(0.5)
        assert found.kv_capacity_tokens == 4096
        pool_series = prom.api(f"query?query=count(vllm:num_requests_waiting{{rolloutpool_io_pool=%22{POOL}%22}})")
        assert pool_series["result"][0]["value"][1] == "1"

        # discovery follows the API server: a deleted pod stops being a target
        cluster.kubectl("delete", "pod", "sdpool-engine-0", "-n", NAMESPACE, "--grace-period=0", "--force")
        deadline = time.monotonic() + 60
        while prom.api("targets?state=active")["activeTargets"]:
            assert time.monotonic() < deadline, "the deleted pod is still a target"
            time.sleep(0.5)
