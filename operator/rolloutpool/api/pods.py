"""What a pod's manifest says about it: ready, being deleted, its name (pure).

The operator, the router's discovery and fleet view, and the dev tools read pods through
these, so that "ready" means the same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["has_ready_condition", "is_ready", "is_terminating", "pod_name"]


def has_ready_condition(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's ``Ready`` condition is True, whether or not it is being deleted (pure)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def is_terminating(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is being deleted (it has a ``deletionTimestamp``) (pure)."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's ``Ready`` condition is True and it is not being deleted (pure)."""
    return has_ready_condition(pod) and not is_terminating(pod)


def pod_name(pod: Mapping[str, Any]) -> str:
    """``metadata.name`` ("" when absent) (pure)."""
    return str((pod.get("metadata") or {}).get("name", ""))
