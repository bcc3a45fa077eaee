"""Prometheus configurations of the local Prometheus and the pod targets of the discovery bridge (pure)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from rolloutpool.dev.localcluster.prometheus import (
    StaticTarget,
    find_prometheus,
    http_sd_pods_scrape_config,
    kubernetes_pods_scrape_config,
    pod_targets,
    static_scrape_config,
)


def promtool_accepts(config: dict[str, Any], tmp_path: Path) -> tuple[bool, str]:
    """Whether the installed promtool parses ``config`` (syntax only: no files, no network)."""
    promtool = find_prometheus().with_name("promtool")
    if not promtool.exists():
        pytest.skip("promtool is not installed next to prometheus")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [str(promtool), "check", "config", "--syntax-only", str(path)], capture_output=True, text=True, check=False
    )
    return result.returncode == 0, result.stdout + result.stderr


def test_static_config_labels_each_target(tmp_path: Path) -> None:
    targets = [
        StaticTarget("127.0.0.1:8001", {"namespace": "rl", "pod": "p-engine-0"}),
        StaticTarget("127.0.0.1:8002", {"namespace": "rl", "pod": "p-router-x"}),
    ]
    config = static_scrape_config(targets, scrape_interval_seconds=1.0)
    assert config["global"] == {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    (job,) = config["scrape_configs"]
    assert job["static_configs"] == [
        {"targets": ["127.0.0.1:8001"], "labels": {"namespace": "rl", "pod": "p-engine-0"}},
        {"targets": ["127.0.0.1:8002"], "labels": {"namespace": "rl", "pod": "p-router-x"}},
    ]
    assert static_scrape_config(targets)["global"]["scrape_interval"] == "15s"
    ok, output = promtool_accepts(config, tmp_path)
    assert ok, output


def test_kubernetes_sd_config_with_client_cert_and_namespaces() -> None:
    config = kubernetes_pods_scrape_config(
        api_server="https://127.0.0.1:6443",
        ca_file=Path("/pki/ca.crt"),
        cert_file=Path("/pki/admin.crt"),
        key_file=Path("/pki/admin.key"),
        namespaces=["rl"],
        scrape_interval_seconds=2.5,
    )
    (job,) = config["scrape_configs"]
    assert config["global"]["scrape_interval"] == "2500ms"
    assert job["kubernetes_sd_configs"] == [
        {
            "role": "pod",
            "api_server": "https://127.0.0.1:6443",
            "tls_config": {"ca_file": "/pki/ca.crt", "cert_file": "/pki/admin.crt", "key_file": "/pki/admin.key"},
            "namespaces": {"names": ["rl"]},
        }
    ]
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"__metrics_path__", "__address__", "namespace", "pod", "rolloutpool_io_pool"} <= targets


def test_kubernetes_sd_config_with_a_bearer_token() -> None:
    config = kubernetes_pods_scrape_config(
        api_server="https://k8s", ca_file=Path("/ca"), bearer_token_file=Path("/var/run/token")
    )
    (sd,) = config["scrape_configs"][0]["kubernetes_sd_configs"]
    assert sd["authorization"] == {"type": "Bearer", "credentials_file": "/var/run/token"}
    assert "namespaces" not in sd
    assert sd["tls_config"] == {"ca_file": "/ca"}


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"cert_file": Path("/c")}, {"key_file": Path("/k")}],
)
def test_kubernetes_sd_config_needs_credentials(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"go together|certificate"):
        kubernetes_pods_scrape_config(api_server="https://k8s", ca_file=Path("/ca"), **kwargs)


def test_http_sd_config_shares_the_pod_relabelling(tmp_path: Path) -> None:
    http = http_sd_pods_scrape_config(url="http://127.0.0.1:9/targets", refresh_interval_seconds=1.0)
    kube = kubernetes_pods_scrape_config(api_server="https://k8s", ca_file=Path("/ca"), bearer_token_file=Path("/t"))
    (http_job,), (kube_job,) = http["scrape_configs"], kube["scrape_configs"]
    assert http_job["relabel_configs"] == kube_job["relabel_configs"]
    assert http_job["http_sd_configs"] == [{"url": "http://127.0.0.1:9/targets", "refresh_interval": "1s"}]
    ok, output = promtool_accepts(http, tmp_path)
    assert ok, output


def pod(
    name: str, *, ip: str | None, annotations: dict[str, str] | None = None, ports: Sequence[int] = ()
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "rl",
            "uid": f"uid-{name}",
            "labels": {"rolloutpool.io/pool": "p", "app.kubernetes.io/name": "rolloutpool"},
            "annotations": annotations or {},
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": p} for p in ports]}],
        },
        "status": {"phase": "Running", **({"podIP": ip} if ip else {})},
    }


def test_pod_targets_carry_kubernetes_sd_meta_labels() -> None:
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": "8000", "prometheus.io/path": "/metrics"}
    groups = pod_targets(
        [
            pod("p-engine-0", ip="127.0.0.2", annotations=scrape, ports=[8000]),
            pod("p-engine-1", ip=None, annotations=scrape),  # no IP yet: not a target
            pod("bare", ip="fd00::5"),
        ]
    )
    assert [g["targets"] for g in groups] == [["127.0.0.2:8000"], ["[fd00::5]"]]
    labels = groups[0]["labels"]
    assert labels["__meta_kubernetes_namespace"] == "rl"
    assert labels["__meta_kubernetes_pod_name"] == "p-engine-0"
    assert labels["__meta_kubernetes_pod_ip"] == "127.0.0.2"
    assert labels["__meta_kubernetes_pod_phase"] == "Running"
    assert labels["__meta_kubernetes_pod_node_name"] == "node-1"
    assert labels["__meta_kubernetes_pod_label_rolloutpool_io_pool"] == "p"
    assert labels["__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name"] == "true"
    assert labels["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] == "true"
    assert labels["__meta_kubernetes_pod_annotation_prometheus_io_port"] == "8000"
    assert labels["__meta_kubernetes_pod_container_port_number"] == "8000"
    assert labels["__meta_kubernetes_pod_container_name"] == "engine"
    assert "__meta_kubernetes_pod_annotation_prometheus_io_scrape" not in groups[1]["labels"]
