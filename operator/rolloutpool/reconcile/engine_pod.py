"""The GPU-cluster fields of an engine pod, and the ``podTemplate`` overlay (pure).

Precedence, lowest first (each step may override the one before):

1. the generated pod (``children.engine_pod``): probes, ports, the downward-API env,
   caches on emptyDirs, ``nvidia.com/gpu`` from ``gpusPerReplica``;
2. the typed fields of ``engine``: ``modelVolume`` (mounted at ``mountPath``; vLLM then
   serves that path under ``engine.model`` as its served name), ``hfTokenSecret``
   (``HF_TOKEN``), ``env`` (after the generated variables, so a name given twice takes
   the user's value), ``envFrom``, ``resources`` (merged over the generated requests
   and limits), ``shmSize``, ``affinity``, ``priorityClassName``, ``imagePullSecrets``,
   ``nodeSelector``, ``tolerations``;
3. ``engine.podTemplate``, merged last: maps key by key, lists of named items by
   ``name``, other lists replaced. What the operator relies on (the ``engine``
   container's name, ``rolloutpool.io/`` labels, pod name and namespace) is refused by
   the spec's validation.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from rolloutpool.api.spec import EngineSpec

__all__ = ["MODEL_VOLUME", "apply_engine_fields", "merge_overlay"]

MODEL_VOLUME = "model"
"""Name of the model-weights volume and its mount."""

_NAMED_LISTS = frozenset({"containers", "initContainers", "volumes", "env", "volumeMounts", "ports", "envFrom"})


def merge_overlay(base: Any, overlay: Any, *, key: str = "") -> Any:
    """``overlay`` merged over ``base``: maps recursively, named lists by ``name``, the rest replaced (pure)."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = dict(base)
        for k, value in overlay.items():
            out[k] = merge_overlay(base[k], value, key=k) if k in base else copy.deepcopy(value)
        return out
    if (
        key in _NAMED_LISTS
        and isinstance(base, list)
        and isinstance(overlay, list)
        and all(isinstance(i, dict) and "name" in i for i in (*base, *overlay))
    ):
        merged = [copy.deepcopy(i) for i in base]
        index = {item["name"]: n for n, item in enumerate(merged)}
        for item in overlay:
            if item["name"] in index:
                merged[index[item["name"]]] = merge_overlay(merged[index[item["name"]]], item, key="")
            else:
                merged.append(copy.deepcopy(item))
        return merged
    return copy.deepcopy(overlay)


def _set_env(container: dict[str, Any], extra: list[Mapping[str, Any]]) -> None:
    env = [e for e in container.get("env", []) if e.get("name") not in {x.get("name") for x in extra}]
    container["env"] = env + [copy.deepcopy(dict(e)) for e in extra]


def _mount_model(spec: dict[str, Any], container: dict[str, Any], engine: EngineSpec) -> None:
    source = engine.model_volume
    if source is None or engine.kind != "vllm":
        return
    if source.persistent_volume_claim is not None:
        claim = source.persistent_volume_claim
        volume: dict[str, Any] = {
            "name": MODEL_VOLUME,
            "persistentVolumeClaim": {"claimName": claim.claim_name, "readOnly": claim.read_only},
        }
        read_only = claim.read_only
    else:
        assert source.host_path is not None  # noqa: S101 - the spec's validator guarantees one source
        volume = {"name": MODEL_VOLUME, "hostPath": {"path": source.host_path.path, "type": "Directory"}}
        read_only = True
    spec.setdefault("volumes", []).append(volume)
    mount: dict[str, Any] = {"name": MODEL_VOLUME, "mountPath": source.mount_path, "readOnly": read_only}
    if source.sub_path:
        mount["subPath"] = source.sub_path
    container.setdefault("volumeMounts", []).append(mount)
    args = container["args"]
    args[0] = source.mount_path  # serve the mounted weights...
    args.insert(1, f"--served-model-name={engine.model}")  # ...under the model's name


def _container_fields(container: dict[str, Any], engine: EngineSpec) -> None:
    extra_env: list[Mapping[str, Any]] = []
    if engine.hf_token_secret is not None:
        ref = {"name": engine.hf_token_secret.name, "key": engine.hf_token_secret.key}
        extra_env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    extra_env += engine.env
    if extra_env:
        _set_env(container, extra_env)
    if engine.env_from:
        container["envFrom"] = copy.deepcopy(engine.env_from)
    if engine.resources:
        container["resources"] = merge_overlay(container.get("resources", {}), engine.resources)


def _pod_fields(spec: dict[str, Any], engine: EngineSpec) -> None:
    if engine.shm_size:
        for vol in spec.get("volumes", []):
            if vol.get("name") == "dshm":
                vol["emptyDir"] = {"medium": "Memory", "sizeLimit": engine.shm_size}
    if engine.affinity:
        spec["affinity"] = copy.deepcopy(engine.affinity)
    if engine.priority_class_name:
        spec["priorityClassName"] = engine.priority_class_name
    if engine.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in engine.image_pull_secrets]


def apply_engine_fields(pod: dict[str, Any], engine: EngineSpec) -> dict[str, Any]:
    """The typed GPU-cluster fields and then ``podTemplate`` applied to a generated engine pod (pure).

    ``pod`` is the manifest ``children.engine_pod`` built, before its spec hash.
    """
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "engine")
    _mount_model(spec, container, engine)
    _container_fields(container, engine)
    _pod_fields(spec, engine)
    if engine.pod_template:
        overlay = engine.pod_template
        meta = overlay.get("metadata") or {}
        for field in ("labels", "annotations"):
            if meta.get(field):
                pod["metadata"][field] = {**pod["metadata"].get(field, {}), **meta[field]}
        pod["spec"] = merge_overlay(pod["spec"], overlay.get("spec") or {})
    return pod
