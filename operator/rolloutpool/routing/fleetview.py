"""What one router of a fleet sees: the session ring and the engines it owns (pure).

Inputs are plain pod objects (the pool's engine pods and router pods, as a watch lists
them); the output is a :class:`FleetView`: the ring over the READY router pods, each weighted
by the engines the operator assigned to it (annotation ``rolloutpool.io/router`` on the engine
pod), the peers' URLs, and the replica events of the engines assigned to this router. Every
router computes the same view from the same pods, so they agree on every session's owner.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rolloutpool.routing.discovery import ReplicaEvent, replica_event
from rolloutpool.routing.ring import HashRing

__all__ = ["ANNOTATION_ROUTER", "FleetView", "fleet_view", "pod_url", "static_view"]

ANNOTATION_ROUTER = "rolloutpool.io/router"
"""On an engine pod: the name of the router pod that places sessions on it (written by the operator)."""


@dataclass(frozen=True)
class FleetView:
    """The fleet as one router sees it."""

    ring: HashRing
    """Session owner by session id, over the ready routers weighted by their engines."""
    peers: Mapping[str, str]
    """Base URL of every router on the ring (this one included), by name."""
    engines: Mapping[str, ReplicaEvent] = field(default_factory=dict)
    """The engines assigned to this router, as discovery events (routable or not)."""


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def _assigned(pod: Mapping[str, Any]) -> str | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ROUTER)
    return str(value) if value else None


def pod_url(pod: Mapping[str, Any], *, port_name: str = "http", default_port: int) -> str | None:
    """``http://<podIP>:<port>`` of a pod, or None without an IP (pure)."""
    event = replica_event("ADDED", dict(pod), port_name=port_name, default_port=default_port)
    return event.url


def fleet_view(
    *,
    engine_pods: Iterable[Mapping[str, Any]],
    router_pods: Iterable[Mapping[str, Any]],
    self_name: str,
    router_port: int = 8080,
    engine_port: int = 8000,
) -> FleetView:
    """The view of router ``self_name`` from the pool's pods (pure).

    A router is on the ring when it is Ready, has an IP, is not being deleted and owns at
    least one engine that is not being deleted (its weight). Only engines annotated with
    ``self_name`` are this router's.
    """
    engines = list(engine_pods)
    weights = Counter(owner for pod in engines if (owner := _assigned(pod)) and not _terminating(pod))
    peers: dict[str, str] = {}
    for pod in router_pods:
        name = _name(pod)
        url = pod_url(pod, default_port=router_port)
        if url and _ready(pod) and not _terminating(pod) and weights[name] > 0:
            peers[name] = url
    ring = HashRing({name: weights[name] for name in peers})
    mine = {
        _name(pod): replica_event("ADDED", dict(pod), default_port=engine_port)
        for pod in engines
        if _assigned(pod) == self_name
    }
    return FleetView(ring=ring, peers=peers, engines=mine)


def static_view(
    *, peers: Mapping[str, str], split: Mapping[str, str], engine_urls: Mapping[str, str], self_name: str
) -> FleetView:
    """The view of a fleet given on the command line (no Kubernetes) (pure).

    ``peers``: router name -> URL; ``split``: engine -> router (e.g. from
    :func:`rolloutpool.reconcile.assignment.assign_engines`, the same on every router);
    ``engine_urls``: engine -> URL.
    """
    weights = Counter(split.values())
    ring = HashRing({name: weights[name] for name in peers})
    mine = {
        engine: ReplicaEvent(engine, engine_urls[engine], True, "Ready")
        for engine, owner in split.items()
        if owner == self_name
    }
    return FleetView(ring=ring, peers={n: u for n, u in peers.items() if weights[n] > 0}, engines=mine)
