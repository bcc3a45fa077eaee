"""Replica discovery from Kubernetes pods and the operator's limits, as pure decisions (pure).

A pod is a routable replica when it has an IP, is not being deleted, and its
``Ready`` condition is True. Anything else (pending, unready, terminating, deleted)
removes it from placement; its sessions are re-placed on their next turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rolloutpool.api.pods import has_ready_condition
from rolloutpool.api.status import RolloutPoolStatus

__all__ = ["OperatorLimit", "ReplicaEvent", "operator_limits", "replica_event"]


@dataclass(frozen=True)
class ReplicaEvent:
    """What discovery says about one replica."""

    name: str
    url: str | None
    """``http://<podIP>:<port>`` when routable."""
    routable: bool
    reason: str
    """Why it is (not) routable: Ready, NotReady, NoIP, Terminating, Deleted; ``Synced`` (no name)
    marks the end of a full listing."""


def _port(pod: dict[str, Any], port_name: str, default: int) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == port_name and port.get("containerPort"):
                return int(port["containerPort"])
    return default


def replica_event(
    event_type: str, pod: dict[str, Any], *, port_name: str = "http", default_port: int = 8000
) -> ReplicaEvent:
    """Turn one watch event (ADDED, MODIFIED, DELETED) on a pod into a replica event (pure)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    name = str(meta.get("name", ""))
    ip = status.get("podIP")
    if event_type == "DELETED":
        return ReplicaEvent(name, None, False, "Deleted")
    if meta.get("deletionTimestamp"):
        return ReplicaEvent(name, None, False, "Terminating")
    if not ip:
        return ReplicaEvent(name, None, False, "NoIP")
    host = f"[{ip}]" if ":" in ip else ip  # an IPv6 address needs brackets in a URL
    url = f"http://{host}:{_port(pod, port_name, default_port)}"
    if not has_ready_condition(pod):
        return ReplicaEvent(name, url, False, "NotReady")
    return ReplicaEvent(name, url, True, "Ready")


@dataclass(frozen=True)
class OperatorLimit:
    """What the operator decided for one replica (from the RolloutPool status)."""

    target: float | None
    """The working-set target its control law set (None: the router's own)."""
    quarantined: bool
    """No new sessions (a drain, or the law under severe pressure)."""
    reason: str | None


def operator_limits(pool: dict[str, Any]) -> dict[str, OperatorLimit]:
    """Per-replica limits from a RolloutPool object's ``status.replicaStatus`` (pure).

    A status that does not parse gives no limits (the router's own stay in force).
    """
    try:
        status = RolloutPoolStatus.model_validate((pool or {}).get("status") or {})
    except ValidationError:
        return {}
    return {r.name: OperatorLimit(r.target, r.quarantined, r.reason) for r in status.replica_status}
