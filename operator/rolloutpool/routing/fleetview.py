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

An engine whose router is not on the ring keeps its points, so that a router's change moves its
sessions once, not twice:

- its router is gone (deleted, not ready) and the operator has not reassigned it yet: owned by
  the router the operator will give it, foreseen with the operator's own
  :func:`~rolloutpool.routing.fleetsplit.assign_engines` over the ready routers (without this the
  keys went to the next points on the ring, then moved again on the reassignment);
- the operator has handed it to a router that is not ready yet (a replacement pod starting): owned
  by the router that owned it in the previous view, until the new one is ready.

Only the second depends on the previous view; a router that starts during such a hand-over may
disagree about those keys for a few seconds (a forwarded request is served where it lands).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rolloutpool.api.pods import is_ready, is_terminating, pod_name
from rolloutpool.routing.discovery import ReplicaEvent, replica_event
from rolloutpool.routing.fleetsplit import assign_engines
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
    previous: FleetView | None = None,
) -> FleetView:
    """The view of router ``self_name`` from the pool's pods and its ``previous`` view (pure).

    A router is on the ring when it is Ready, has an IP, is not being deleted and owns at least
    one engine's points: those of the engines assigned to it, of engines handed from it to a
    router not ready yet, and of orphaned engines the operator will give it (module docstring).
    Only engines annotated with ``self_name`` are this router's to place sessions on.
    """
    engines = list(engine_pods)
    peers: dict[str, str] = {}
    for pod in router_pods:
        url = pod_url(pod, default_port=router_port)
        if url and is_ready(pod):
            peers[pod_name(pod)] = url
    before = previous.owners if previous is not None else {}
    owners: dict[str, str] = {}
    orphans: list[str] = []
    live: list[str] = []
    for pod in engines:
        name, assigned, leaving = pod_name(pod), _assigned(pod), is_terminating(pod)
        if not leaving:
            live.append(name)
        if assigned in peers:
            owners[name] = assigned
        elif assigned is not None and before.get(name) in peers:
            owners[name] = before[name]  # handed to a router that is not ready yet
        elif not leaving:
            orphans.append(name)
    if orphans and peers:
        foreseen = assign_engines(engines=live, routers=peers, previous=owners)
        owners.update((name, foreseen[name]) for name in orphans)
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
    :func:`rolloutpool.routing.fleetsplit.assign_engines`, the same on every router);
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
