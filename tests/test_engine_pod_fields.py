"""vLLM pools for GPU clusters: model volume, token Secret, env, resources, shm, scheduling, podTemplate."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from poolcases import load_example
from rolloutpool.api import RolloutPool
from rolloutpool.reconcile.children import engine_pod
from rolloutpool.reconcile.engine_pod import merge_overlay

EXAMPLE = "qwen3-8b-h100-pvc.yaml"


def _pod(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest = copy.deepcopy(manifest)
    manifest["metadata"].update(namespace="team-a", uid="u-1", generation=1)
    pool = RolloutPool.model_validate(manifest)
    return engine_pod(pool=manifest, spec=pool.spec, index=0, default_image="ours:1")


def _engine(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "engine")


def test_example_pod_mounts_the_model_and_serves_it_under_its_name() -> None:
    pod = _pod(load_example(EXAMPLE))
    engine = _engine(pod)
    assert engine["args"][:2] == ["/models/qwen3-8b", "--served-model-name=Qwen/Qwen3-8B"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mount = next(m for m in engine["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/models/qwen3-8b", "readOnly": True, "subPath": "qwen3-8b"}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}


def test_example_pod_has_the_token_env_resources_and_scheduling_fields() -> None:
    pod = _pod(load_example(EXAMPLE))
    engine, spec = _engine(pod), pod["spec"]
    env = {e["name"]: e for e in engine["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert env["VLLM_LOGGING_LEVEL"]["value"] == "INFO"
    assert "POD_IP" in env  # the generated variables stay
    assert engine["envFrom"] == [{"configMapRef": {"name": "vllm-tuning", "optional": True}}]
    assert engine["resources"]["requests"] == {"cpu": "8", "memory": "64Gi"}
    assert engine["resources"]["limits"]["memory"] == "96Gi"
    assert str(engine["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    assert spec["priorityClassName"] == "rollout-high"
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert "podAntiAffinity" in spec["affinity"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_pod_template_is_merged_last_by_name_and_keeps_the_rest() -> None:
    pod = _pod(load_example(EXAMPLE))
    engine = _engine(pod)
    assert engine["startupProbe"]["failureThreshold"] == 120
    assert engine["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}  # merged, not replaced
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    assert pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert pod["metadata"]["labels"]["rolloutpool.io/pool"] == "qwen3-8b-h100"
    assert "rolloutpool.io/spec-hash" in pod["metadata"]["annotations"]


def test_a_changed_overlay_changes_the_spec_hash() -> None:
    manifest = load_example(EXAMPLE)
    before = _pod(manifest)["metadata"]["annotations"]["rolloutpool.io/spec-hash"]
    manifest["spec"]["engine"]["podTemplate"]["spec"]["terminationGracePeriodSeconds"] = 60
    assert _pod(manifest)["metadata"]["annotations"]["rolloutpool.io/spec-hash"] != before


def test_merge_overlay_merges_named_lists_and_replaces_others() -> None:
    base = {"containers": [{"name": "a", "args": ["x"]}], "tolerations": [{"key": "k"}]}
    overlay = {"containers": [{"name": "a", "args": ["y"]}, {"name": "b"}], "tolerations": [{"key": "z"}]}
    assert merge_overlay(base, overlay) == {
        "containers": [{"name": "a", "args": ["y"]}, {"name": "b"}],
        "tolerations": [{"key": "z"}],
    }


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"modelVolume": {"persistentVolumeClaim": {"claimName": "m"}, "hostPath": {"path": "/m"}}}, "exactly one"),
        ({"modelVolume": {"mountPath": "/models"}}, "exactly one"),
        ({"podTemplate": {"metadata": {"labels": {"rolloutpool.io/pool": "x"}}}}, "rolloutpool.io/"),
        ({"podTemplate": {"metadata": {"name": "x"}}}, "labels and annotations"),
        ({"podTemplate": {"kind": "Pod"}}, "only have metadata and spec"),
        ({"resources": {"limits": {"nvidia.com/gpu": 2}}}, "limit nvidia.com/gpu to engine.gpusPerReplica"),
        ({"env": [{"name": "POD_IP", "value": "1.2.3.4"}]}, "operator sets it"),
        ({"shmSize": "lots"}, "shm_size|shmSize|pattern"),
    ],
)
def test_invalid_gpu_fields_are_rejected(patch: dict[str, Any], message: str) -> None:
    manifest = load_example(EXAMPLE)
    manifest["spec"]["engine"].update(patch)
    with pytest.raises(ValidationError, match=message):
        RolloutPool.model_validate(manifest)


def test_host_path_weights_are_mounted_read_only() -> None:
    manifest = load_example(EXAMPLE)
    manifest["spec"]["engine"]["modelVolume"] = {"hostPath": {"path": "/mnt/models/qwen3-8b"}}
    pod = _pod(manifest)
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "model")
    assert volume["hostPath"] == {"path": "/mnt/models/qwen3-8b", "type": "Directory"}
    assert _engine(pod)["args"][0] == "/models"
