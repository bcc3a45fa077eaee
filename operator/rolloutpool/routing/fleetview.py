"""What one router of a fleet sees: who owns each session, and the engines it owns (pure).

Inputs are plain pod objects (the pool's engine pods and router pods, as a watch lists them);
the output is a :class:`FleetView`. The session ring's points belong to ENGINES, not to routers:
each engine assigned to a ready router (annotation ``rolloutpool.io/router``, written by the
operator) puts its points on the ring, and a session is owned by the router of the engine whose
point follows the session's hash. So

- a router's share of sessions is its share of engines (the sessions it owns fit on its engines);
- when the operator moves an engine to another router, exactly the keys of that engine's points
  move with it, and nothing else: a dead router's engines go to the survivors and only the dead
  router's sessions change owner (a ring over routers weighted by engine counts would also shuffle
  keys between the survivors whenever their weights change);
- every router computes the same view from the same pods, so they agree on every owner.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rolloutpool.api.pods import is_ready, pod_name
from rolloutpool.routing.discovery import ReplicaEvent, replica_event
from rolloutpool.routing.ring import HashRing

__all__ = ["ANNOTATION_ROUTER", "FleetView", "fleet_view", "pod_url", "static_view"]

ANNOTATION_ROUTER = "rolloutpool.io/router"
"""On an engine pod: the name of the router pod that places sessions on it (written by the operator)."""


@dataclass(frozen=True)
class FleetView:
    """The fleet as one router sees it."""

    owners: Mapping[str, str]
    """Engine -> router for every engine on the ring (those assigned to a ready router)."""
    peers: Mapping[str, str]
    """Base URL of every router on the ring (this one included), by name."""
    engines: Mapping[str, ReplicaEvent] = field(default_factory=dict)
    """The engines assigned to this router, as discovery events (routable or not)."""
    ring: HashRing = field(init=False, compare=False, repr=False)
    """The session ring: one unit of weight per engine in ``owners``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ring", HashRing(dict.fromkeys(self.owners, 1)))

    def owner(self, session_id: str) -> str | None:
        """The router owning ``session_id``; None on an empty ring (pure)."""
        engine = self.ring.owner(session_id)
        return None if engine is None else self.owners[engine]


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

    A router is on the ring when it is Ready, has an IP, is not being deleted and is assigned
    at least one engine; each engine assigned to such a router is on the ring. Only engines
    annotated with ``self_name`` are this router's.
    """
    engines = list(engine_pods)
    peers: dict[str, str] = {}
    for pod in router_pods:
        url = pod_url(pod, default_port=router_port)
        if url and is_ready(pod):
            peers[pod_name(pod)] = url
    owners = {pod_name(pod): owner for pod in engines if (owner := _assigned(pod)) in peers}
    mine = {
        pod_name(pod): replica_event("ADDED", dict(pod), default_port=engine_port)
        for pod in engines
        if _assigned(pod) == self_name
    }
    used = set(owners.values())
    return FleetView(owners=owners, peers={n: u for n, u in peers.items() if n in used}, engines=mine)


def static_view(
    *, peers: Mapping[str, str], split: Mapping[str, str], engine_urls: Mapping[str, str], self_name: str
) -> FleetView:
    """The view of a fleet given on the command line (no Kubernetes) (pure).

    ``peers``: router name -> URL; ``split``: engine -> router (e.g. from
    :func:`rolloutpool.reconcile.assignment.assign_engines`, the same on every router);
    ``engine_urls``: engine -> URL.
    """
    owners = {engine: router for engine, router in split.items() if router in peers}
    mine = {
        engine: ReplicaEvent(engine, engine_urls[engine], True, "Ready")
        for engine, owner in split.items()
        if owner == self_name
    }
    used = set(owners.values())
    return FleetView(owners=owners, peers={n: u for n, u in peers.items() if n in used}, engines=mine)
