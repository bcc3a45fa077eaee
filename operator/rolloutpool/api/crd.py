"""The RolloutPool CustomResourceDefinition, generated from the pydantic models (pure).

The pydantic JSON schema is turned into a Kubernetes structural schema: references
inlined, ``Optional`` unions collapsed, titles dropped, exclusive bounds rewritten in
OpenAPI v3.0 form, free-form maps marked ``x-kubernetes-preserve-unknown-fields``,
and nested objects given ``default: {}`` so the API server fills their defaults.
``crds/rolloutpools.rolloutpool.io.yaml`` is this function's output, committed; a
test fails when the two differ.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.api.status import API_GROUP, API_VERSION, KIND, PLURAL, RolloutPoolStatus

__all__ = ["CRD_NAME", "build_crd", "render_crd", "structural_schema"]

CRD_NAME = f"{PLURAL}.{API_GROUP}"

_DROP = {"title"}


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = copy.deepcopy(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        merged = _convert(target, defs)
        merged.update({k: v for k, v in node.items() if k not in _DROP})
        return _finish(merged)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"unions other than Optional[X] cannot be expressed: {options}")
        inner = _convert(options[0], defs)
        inner.update({k: v for k, v in node.items() if k not in _DROP})
        inner["x-rolloutpool-optional"] = True
        return _finish(inner)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict) and value:
                out[key] = _convert(value, defs)
            elif value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            # ``False`` (extra="forbid") is the API server's pruning already.
        elif key == "$defs":
            continue
        else:
            out[key] = value
    return _finish(out)


def _finish(node: dict[str, Any]) -> dict[str, Any]:
    if node.get("default", 0) is None:
        del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for exclusive, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(exclusive), int | float) and not isinstance(node[exclusive], bool):
            node[plain] = node[exclusive]
            node[exclusive] = True
    minimum = node.get("minimum")
    if node.get("type") == "number" and isinstance(minimum, float) and not minimum.is_integer():
        # kube-apiserver truncates a fractional minimum when the value is a JSON integer
        # (0 passes `minimum: 0.01`); a CEL rule compares as double and closes the gap.
        rule = {"rule": f"self >= {minimum!r}", "message": f"must be greater than or equal to {minimum!r}"}
        rules = node.setdefault("x-kubernetes-validations", [])
        if rule not in rules:
            rules.append(rule)
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    if node.get("type") == "object" and "properties" not in node and "additionalProperties" not in node:
        node["x-kubernetes-preserve-unknown-fields"] = True
    if node.get("type") == "object" and "properties" in node:
        required = set(node.get("required", []))
        for name, prop in node["properties"].items():
            optional = prop.get("x-rolloutpool-optional", False)
            nested = prop.get("type") == "object" and "properties" in prop
            if nested and name not in required and "default" not in prop and not optional:
                prop["default"] = {}
    return node


def structural_schema(model: type[RolloutPoolSpec] | type[RolloutPoolStatus]) -> dict[str, Any]:
    """A Kubernetes structural schema for one pydantic model (pure)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema = _convert(raw, raw.get("$defs", {}))
    _strip_markers(schema)
    return schema


def _strip_markers(node: Any) -> None:
    if isinstance(node, dict):
        node.pop("x-rolloutpool-optional", None)
        for value in node.values():
            _strip_markers(value)
    elif isinstance(node, list):
        for value in node:
            _strip_markers(value)


_PRINTER_COLUMNS = [
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas", "description": "Desired replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas", "description": "Ready replicas"},
    {"name": "Sessions", "type": "integer", "jsonPath": ".status.liveSessions", "description": "Live sessions"},
    {
        "name": "Quarantined",
        "type": "integer",
        "jsonPath": ".status.quarantinedReplicas",
        "description": "Replicas receiving no new sessions",
    },
    {
        "name": "Held",
        "type": "integer",
        "jsonPath": ".status.heldTurns",
        "description": "Turns paused until their replica's working set has room",
        "priority": 1,
    },
    {
        "name": "Leases",
        "type": "integer",
        "jsonPath": ".status.keptSessions",
        "description": "Idle sessions whose prefix is kept (leases held)",
        "priority": 1,
    },
    {
        "name": "Moves",
        "type": "integer",
        "jsonPath": ".status.moves",
        "description": "Sessions moved once because their prefix was gone on their replica",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition manifest (pure)."""
    spec_schema = structural_schema(RolloutPoolSpec)
    spec_schema["description"] = "Desired state of a RolloutPool."
    status_schema = structural_schema(RolloutPoolStatus)
    status_schema["description"] = "Observed state of a RolloutPool, written by the operator."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["rp", "rpool"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "description": "A pool of vLLM replicas serving RL rollouts behind a session router.",
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": _PRINTER_COLUMNS,
                }
            ],
        },
    }


def render_crd() -> str:
    """The CRD as the YAML text committed under ``crds/`` (pure)."""
    header = "# Generated by `rolloutpool crd` from operator/rolloutpool/api; do not edit by hand.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)
