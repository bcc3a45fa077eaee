"""The CRD against a real kube-apiserver: install, examples, printer columns, validation, scale."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from poolcases import EXAMPLES, invalid_cases, load_example
from rolloutpool.api import RolloutPool
from rolloutpool.dev.localcluster.cluster import LocalCluster


def _apply(cluster: LocalCluster, manifest: dict[str, Any], *extra: str):
    return cluster.kubectl("apply", *extra, "-f", "-", input_text=yaml.safe_dump(manifest), check=False)


def _get(cluster: LocalCluster, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "rolloutpool", name, "-o", "json").stdout
    data: dict[str, Any] = json.loads(out)
    return data


def test_example_pools_are_accepted_and_listed(cluster: LocalCluster) -> None:
    for name in ("simulated-pool.yaml", "vllm-pool.yaml"):
        result = cluster.kubectl("apply", "-f", str(EXAMPLES / name), check=False)
        assert result.returncode == 0, result.stderr
    table = cluster.kubectl("get", "rp").stdout
    header = table.splitlines()[0].split()
    assert header == ["NAME", "REPLICAS", "READY", "SESSIONS", "QUARANTINED", "AGE"]
    assert "sim-grpo" in table
    assert "qwen3-8b-grpo" in table
    assert "sim-grpo" in cluster.kubectl("get", "rpool").stdout


def test_gpu_example_keeps_its_core_v1_fields_as_written(cluster: LocalCluster) -> None:
    """env, resources and podTemplate have declared parts for CEL; the rest must come back untouched."""
    example = load_example("qwen3-8b-h100-pvc.yaml")
    result = _apply(cluster, example)
    assert result.returncode == 0, result.stderr
    served = _get(cluster, example["metadata"]["name"])["spec"]["engine"]
    for field in ("env", "envFrom", "resources", "podTemplate", "extraArgs"):
        assert served[field] == example["spec"]["engine"][field], field


def test_server_fills_the_same_defaults_as_the_models(cluster: LocalCluster) -> None:
    minimal = {
        "apiVersion": "rolloutpool.io/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": "minimal", "namespace": "default"},
        "spec": {"replicas": 2, "engine": {"kind": "simulated", "model": "m", "maxModelLen": 4096}},
    }
    assert _apply(cluster, minimal).returncode == 0
    served = _get(cluster, "minimal")["spec"]

    def prune(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: prune(v) for k, v in node.items() if v not in ({}, [], None)}
        return node

    expected = prune(RolloutPool.model_validate(minimal).spec.model_dump(by_alias=True, exclude_none=True))
    assert served == expected


@pytest.mark.parametrize("case", invalid_cases(), ids=lambda c: c.id)
def test_invalid_manifest_rejected_naming_field(cluster: LocalCluster, case) -> None:
    result = _apply(cluster, case.manifest)
    assert result.returncode != 0, f"accepted: {case.id}"
    assert case.field in result.stderr, result.stderr
    # and nothing was created
    missing = cluster.kubectl("get", "rp", case.manifest["metadata"]["name"], check=False)
    assert missing.returncode != 0


def test_scale_subresource_changes_spec_replicas(cluster: LocalCluster) -> None:
    assert _apply(cluster, load_example("simulated-pool.yaml")).returncode == 0
    cluster.kubectl("scale", "rp/sim-grpo", "--replicas=7")
    assert _get(cluster, "sim-grpo")["spec"]["replicas"] == 7
    bad = cluster.kubectl("scale", "rp/sim-grpo", "--replicas=-1", check=False)
    assert bad.returncode != 0
    assert _get(cluster, "sim-grpo")["spec"]["replicas"] == 7


def test_status_subresource_feeds_printer_columns(cluster: LocalCluster) -> None:
    assert _apply(cluster, load_example("simulated-pool.yaml")).returncode == 0
    status = {"status": {"replicas": 4, "readyReplicas": 3, "liveSessions": 42, "quarantinedReplicas": 1}}
    cluster.kubectl("patch", "rp/sim-grpo", "--subresource=status", "--type=merge", "-p", json.dumps(status))
    row = next(line for line in cluster.kubectl("get", "rp").stdout.splitlines() if line.startswith("sim-grpo"))
    assert row.split()[2:5] == ["3", "42", "1"]
    # a spec write through the main resource does not touch status, and vice versa
    spec_patch = json.dumps({"spec": {"replicas": 5}, "status": {"liveSessions": 0}})
    cluster.kubectl("patch", "rp/sim-grpo", "--type=merge", "-p", spec_patch)
    obj = _get(cluster, "sim-grpo")
    assert obj["spec"]["replicas"] == 5
    assert obj["status"]["liveSessions"] == 42
