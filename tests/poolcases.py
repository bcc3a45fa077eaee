"""Shared test data: the example manifests and the invalid-manifest cases."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class InvalidCase:
    id: str
    manifest: dict[str, Any]
    field: str


def load_example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return data


def _walk(spec: dict[str, Any], dotted: str) -> tuple[dict[str, Any], str]:
    *parents, leaf = dotted.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    return node, leaf


def invalid_cases() -> list[InvalidCase]:
    raw = yaml.safe_load((ROOT / "tests" / "data" / "invalid_pools.yaml").read_text())
    base = load_example("simulated-pool.yaml")
    cases = []
    for entry in raw:
        manifest = copy.deepcopy(base)
        manifest["metadata"]["name"] = f"bad-{entry['id']}"
        for dotted, value in (entry.get("set") or {}).items():
            node, leaf = _walk(manifest["spec"], dotted)
            node[leaf] = value
        for dotted, length in (entry.get("long") or {}).items():
            node, leaf = _walk(manifest["spec"], dotted)
            node[leaf] = ["a" * n for n in length] if isinstance(length, list) else "a" * length
        for dotted in entry.get("unset") or []:
            node, leaf = _walk(manifest["spec"], dotted)
            node.pop(leaf)
        cases.append(InvalidCase(id=entry["id"], manifest=manifest, field=entry["field"]))
    return cases
