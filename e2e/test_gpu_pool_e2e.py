"""The GPU-cluster example against a real kube-apiserver: the pool and its rendered engine pod pass server dry-run."""

from __future__ import annotations

import copy
import json

import yaml

from poolcases import EXAMPLES, load_example
from rolloutpool.api import RolloutPool
from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.reconcile.children import engine_pod

EXAMPLE = "qwen3-8b-h100-pvc.yaml"


def test_qwen3_h100_pool_and_its_engine_pod_pass_server_dry_run(cluster: LocalCluster) -> None:
    result = cluster.kubectl("apply", "--dry-run=server", "-f", str(EXAMPLES / EXAMPLE), "-o", "json", check=False)
    assert result.returncode == 0, result.stderr
    served = json.loads(result.stdout)["spec"]["engine"]
    assert served["modelVolume"]["persistentVolumeClaim"]["claimName"] == "models"
    assert served["podTemplate"]["spec"]["terminationGracePeriodSeconds"] == 120

    # the pod the operator would create, validated by the API server's own pod validation
    priority = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "rollout-high"},
        "value": 1000,
    }
    assert cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(priority), check=False).returncode == 0
    manifest = copy.deepcopy(load_example(EXAMPLE))
    manifest["metadata"].update(namespace="default", uid="0b7c-uid", generation=1)
    pool = RolloutPool.model_validate(manifest)
    pod = engine_pod(pool=manifest, spec=pool.spec, index=0, default_image="rolloutpool:dev")
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-o", "json", "-f", "-", input_text=yaml.safe_dump(pod), check=False
    )
    assert result.returncode == 0, result.stderr
    created = json.loads(result.stdout)["spec"]
    assert created["priorityClassName"] == "rollout-high"
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == "models" for v in created["volumes"])

    bad = copy.deepcopy(load_example(EXAMPLE))
    bad["spec"]["engine"]["modelVolume"]["hostPath"] = {"path": "/mnt/models"}
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input_text=yaml.safe_dump(bad), check=False)
    assert result.returncode != 0
    assert "exactly one of persistentVolumeClaim and hostPath" in result.stderr
