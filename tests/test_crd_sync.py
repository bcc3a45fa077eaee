"""crds/, the generator and the pydantic models agree."""

from __future__ import annotations

from typing import Any, get_args, get_origin

import yaml

from poolcases import ROOT
from rolloutpool.api import RolloutPoolSpec, RolloutPoolStatus
from rolloutpool.api.crd import build_crd, render_crd

CRD_FILE = ROOT / "crds" / "rolloutpools.rolloutpool.io.yaml"


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_committed_crd_is_generated_output() -> None:
    assert CRD_FILE.read_text() == render_crd(), "run: rolloutpool crd -o crds/rolloutpools.rolloutpool.io.yaml"


def _walk_model(model: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Compare a pydantic model with its schema node field by field; return mismatches."""
    problems = []
    props = schema.get("properties", {})
    aliases = {f.alias or n: f for n, f in model.model_fields.items()}
    if set(aliases) != set(props):
        problems.append(f"{path}: model {sorted(aliases)} != schema {sorted(props)}")
    required = {a for a, f in aliases.items() if f.is_required()}
    if required != set(schema.get("required", [])):
        problems.append(f"{path}: required {sorted(required)} != {schema.get('required', [])}")
    for alias, field in aliases.items():
        node = props.get(alias, {})
        if not node.get("description"):
            problems.append(f"{path}.{alias}: no description")
        annotation = field.annotation
        args = get_args(annotation) or (annotation,)
        models = [a for a in args if hasattr(a, "model_fields")]
        if get_origin(annotation) is list:
            if models:
                problems += _walk_model(models[0], node.get("items", {}), f"{path}.{alias}[]")
        elif models:
            problems += _walk_model(models[0], node, f"{path}.{alias}")
    return problems


def test_schema_matches_models_field_by_field() -> None:
    schema = _schema()
    assert _walk_model(RolloutPoolSpec, schema["properties"]["spec"], "spec") == []
    assert _walk_model(RolloutPoolStatus, schema["properties"]["status"], "status") == []


def test_defaults_agree_with_models() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    defaults = RolloutPoolSpec.model_validate(
        {"replicas": 1, "engine": {"kind": "simulated", "model": "m", "maxModelLen": 1024}}
    )
    assert spec["concurrency"]["properties"]["workingSetTarget"]["default"] == defaults.concurrency.working_set_target
    assert spec["router"]["properties"]["sessionHeader"]["default"] == defaults.router.session_header
    assert spec["autoscaling"]["properties"]["intervalSeconds"]["default"] == defaults.autoscaling.interval_seconds
    # nested sections default to {} so the API server fills their defaults
    for section in ("concurrency", "router", "autoscaling", "updateStrategy"):
        assert spec[section]["default"] == {}
    assert "default" not in spec["engine"]["properties"]["modelShape"]


def test_structural_schema_rules() -> None:
    """Every node has a type (or preserves unknown fields); no JSON-Schema-only keywords remain."""
    forbidden = {"$ref", "anyOf", "title", "$defs", "const", "allOf", "oneOf"}

    def check(node: dict[str, Any], path: str) -> None:
        assert not forbidden & set(node), f"{path}: {forbidden & set(node)}"
        assert (
            "type" in node or node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        ), path
        if isinstance(node.get("exclusiveMinimum"), int | float) and not isinstance(node["exclusiveMinimum"], bool):
            raise AssertionError(f"{path}: exclusiveMinimum must be boolean in OpenAPI v3.0")
        for name, sub in node.get("properties", {}).items():
            check(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            check(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            check(node["additionalProperties"], f"{path}{{}}")

    check(_schema(), "")


def test_crd_names_subresources_and_columns() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    assert crd["spec"]["names"]["shortNames"] == ["rp", "rpool"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert "status" in version["subresources"]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Replicas", "Ready", "Sessions", "Quarantined", "Held", "Leases", "Moves", "Age"]
    wide = {c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1}
    assert wide == {"Held", "Leases", "Moves"}  # kubectl get rp -o wide
