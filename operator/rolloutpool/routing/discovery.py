"""Replica discovery from Kubernetes pods, as pure decisions on pod objects (pure).

A pod is a routable replica when it has an IP, is not being deleted, and its
``Ready`` condition is True. Anything else (pending, unready, terminating, deleted)
removes it from placement; its sessions are re-placed on their next turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ReplicaEvent", "replica_event"]


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


def _ready(status: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


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
    url = f"http://{ip}:{_port(pod, port_name, default_port)}"
    if not _ready(status):
        return ReplicaEvent(name, url, False, "NotReady")
    return ReplicaEvent(name, url, True, "Ready")
