"""The core/v1 pieces the engine spec passes through: their CRD schema and their checks (pure).

``engine.env``, ``engine.resources`` and ``engine.podTemplate`` stay plain maps in Python
(the operator copies them into the pod), but the API server can only run CEL on fields
its schema declares: unknown fields kept by ``x-kubernetes-preserve-unknown-fields`` are
invisible to CEL. So each schema below declares exactly the parts a rule reads (an env
var's ``name``, the ``limits`` and ``requests`` maps, the template's metadata and its
containers' names) and keeps the rest free-form. Each check function rejects what its
schema rejects, with the same bounds, so that pydantic and the API server agree
(``tests/data/invalid_pools.yaml`` runs against both).

Bounds exist for CEL's cost estimate as much as for sanity: a rule over a list or map is
charged for its largest possible size, which the API server derives from
``maxItems``, ``maxProperties`` and ``maxLength``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "ENV_NAME_MAX_LENGTH",
    "ENV_VAR_SCHEMA",
    "EXTRA_ARG_MAX_LENGTH",
    "GPU_LIMIT_MESSAGE",
    "GPU_LIMIT_RULE",
    "POD_TEMPLATE_MAX_LABELS",
    "POD_TEMPLATE_SCHEMA",
    "RESERVED_ENV",
    "RESOURCES_SCHEMA",
    "check_env",
    "check_gpu_limit",
    "check_pod_template",
    "check_resources",
]

EXTRA_ARG_MAX_LENGTH = 32 * 1024
"""Longest ``engine.extraArgs`` item: room for a chat template given inline, not for a megabyte."""

ENV_NAME_MAX_LENGTH = 253
"""Longest name of an ``engine.env`` variable."""

POD_TEMPLATE_MAX_LABELS = 64
"""Most labels (and, separately, annotations) ``engine.podTemplate.metadata`` may add."""

RESERVED_ENV = ("POD_IP", "POD_NAME", "POD_NAMESPACE")
"""Variables the operator sets from the downward API; ``engine.env`` may not override them."""

_GPU = "nvidia.com/gpu"
_LABEL_PREFIX = "rolloutpool.io/"

ENV_VAR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": ENV_NAME_MAX_LENGTH}},
    "additionalProperties": True,  # value, valueFrom: passed through
    "x-kubernetes-validations": [
        {
            "rule": "!(self.name in [" + ", ".join(f"'{n}'" for n in RESERVED_ENV) + "])",
            "message": f"engine.env may not set {', '.join(RESERVED_ENV)}: the operator sets them",
            "fieldPath": ".name",
        }
    ],
}
"""A core/v1 EnvVar: a name, not one the operator sets; the rest passed through."""

_QUANTITIES: dict[str, Any] = {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}}

RESOURCES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"limits": _QUANTITIES, "requests": _QUANTITIES},
    "additionalProperties": True,  # claims: passed through
}
"""A core/v1 ResourceRequirements: ``limits`` and ``requests`` map names to quantities (integers or strings)."""

GPU_LIMIT_RULE = (
    "self.kind != 'vllm' || !has(self.resources) || !has(self.resources.limits)"
    f" || !('{_GPU}' in self.resources.limits)"
    f" || string(self.resources.limits['{_GPU}']) == string(self.gpusPerReplica)"
)
"""CEL on the engine: a vllm engine's GPU limit, when given, is ``gpusPerReplica``."""

GPU_LIMIT_MESSAGE = f"engine.resources may only limit {_GPU} to engine.gpusPerReplica (which sets it)"
"""What pydantic and the API server say when ``GPU_LIMIT_RULE`` fails."""

_STRING_MAP: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {"type": "string"},
    "maxProperties": POD_TEMPLATE_MAX_LABELS,
}

POD_TEMPLATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "metadata": {
            "type": "object",
            "x-rolloutpool-optional": True,  # no ``default: {}``: absent stays absent, as in pydantic
            "properties": {
                "labels": {
                    **_STRING_MAP,
                    "x-kubernetes-validations": [
                        {
                            "rule": f"self.all(k, !k.startsWith('{_LABEL_PREFIX}'))",
                            "message": f"engine.podTemplate.metadata.labels may not start with {_LABEL_PREFIX}"
                            " (the operator selects pods by them)",
                        }
                    ],
                },
                "annotations": _STRING_MAP,
            },
        },
        "spec": {
            "type": "object",
            "x-rolloutpool-optional": True,
            "properties": {
                "containers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {"type": "string", "minLength": 1}},
                        "additionalProperties": True,
                    },
                }
            },
            "additionalProperties": True,
        },
    },
}
"""A partial core/v1 PodTemplateSpec: ``metadata`` (labels and annotations only) and a free-form ``spec`` whose
containers have names. Other keys are unknown fields: the API server refuses them (kubectl's strict field
validation) or drops them, so the operator never sees them."""


def check_env(env: list[dict[str, Any]]) -> None:
    """Reject what ``ENV_VAR_SCHEMA`` rejects (pure)."""
    for var in env:
        name = var.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("engine.env entries need a name")
        if len(name) > ENV_NAME_MAX_LENGTH:
            raise ValueError(f"engine.env names are at most {ENV_NAME_MAX_LENGTH} characters")
        if name in RESERVED_ENV:
            raise ValueError(f"engine.env may not set {name}: the operator sets it")


def check_resources(resources: Mapping[str, Any]) -> None:
    """Reject what ``RESOURCES_SCHEMA`` rejects (pure)."""
    for part in ("limits", "requests"):
        quantities = resources.get(part)
        if quantities is None:
            continue
        if not isinstance(quantities, dict):
            raise ValueError(f"engine.resources.{part} must be a map of quantities")
        for name, value in quantities.items():
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise ValueError(
                    f"engine.resources.{part} values are integer or string quantities, not {name}: {value!r}"
                )


def check_gpu_limit(kind: str, gpus_per_replica: int, resources: Mapping[str, Any] | None) -> None:
    """Reject what ``GPU_LIMIT_RULE`` rejects (pure)."""
    gpu = ((resources or {}).get("limits") or {}).get(_GPU)
    if kind == "vllm" and gpu is not None and str(gpu) != str(gpus_per_replica):
        raise ValueError(GPU_LIMIT_MESSAGE)


def _check_string_map(meta: Mapping[str, Any], field: str) -> dict[str, Any]:
    values = meta.get(field) or {}
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise ValueError(f"engine.podTemplate.metadata.{field} must map names to strings")
    if len(values) > POD_TEMPLATE_MAX_LABELS:
        raise ValueError(f"engine.podTemplate.metadata.{field}: at most {POD_TEMPLATE_MAX_LABELS} entries")
    return values


def check_pod_template(template: Mapping[str, Any]) -> None:
    """Reject overlays that ``POD_TEMPLATE_SCHEMA`` rejects, which would break what the operator relies on (pure)."""
    unknown = set(template) - {"metadata", "spec"}
    if unknown:
        raise ValueError(f"engine.podTemplate may only have metadata and spec, not {sorted(unknown)}")
    meta = template.get("metadata") or {}
    if not isinstance(meta, dict) or set(meta) - {"labels", "annotations"}:
        raise ValueError("engine.podTemplate.metadata may only set labels and annotations")
    labels = _check_string_map(meta, "labels")
    _check_string_map(meta, "annotations")
    if any(str(k).startswith(_LABEL_PREFIX) for k in labels):
        raise ValueError(
            f"engine.podTemplate.metadata.labels may not start with {_LABEL_PREFIX} (the operator selects pods by them)"
        )
    spec = template.get("spec") or {}
    if not isinstance(spec, dict):
        raise ValueError("engine.podTemplate.spec must be an object")
    containers = spec.get("containers") or []
    if not isinstance(containers, list):
        raise ValueError("engine.podTemplate.spec.containers must be a list")
    for container in containers:
        if not isinstance(container, dict) or not isinstance(container.get("name"), str) or not container["name"]:
            raise ValueError("engine.podTemplate.spec.containers entries need a name")
