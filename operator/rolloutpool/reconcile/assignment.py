"""Which router pod of a fleet owns each engine replica (pure).

With ``spec.router.replicas > 1`` every engine is placed on by exactly one router, so each
engine's live count and cap are kept in one place and caps hold fleet-wide. The operator
computes the assignment on every pass and publishes it as the annotation
``rolloutpool.io/router: <router pod>`` on each engine pod; the routers already watch their
pool's pods, so they read it with the RBAC they have.

:func:`rolloutpool.routing.fleetsplit.assign_engines` decides (the routers run it too, to
foresee the next assignment when a router leaves); this module picks its inputs from the pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rolloutpool.api.pods import is_terminating
from rolloutpool.routing.fleetsplit import assign_engines, natural_key
from rolloutpool.routing.fleetview import ANNOTATION_ROUTER

__all__ = ["ANNOTATION_ROUTER", "assignment_patches", "eligible_routers"]


def _ip(pod: Mapping[str, Any]) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    return str(ip) if ip else None


def eligible_routers(router_pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Router pods that may own engines: they have an address and are not being deleted (pure).

    Not "Ready": a router reports ready only once it has a ready engine, so waiting for its
    readiness before giving it engines would never end. It joins the session ring (and gets
    sessions) only once ready.
    """
    return sorted(
        (str(p["metadata"]["name"]) for p in router_pods if _ip(p) and not is_terminating(p)), key=natural_key
    )


def assignment_patches(
    *, engine_pods: Iterable[Mapping[str, Any]], router_pods: Iterable[Mapping[str, Any]]
) -> dict[str, str]:
    """Engine pod -> router pod for every engine pod whose annotation must change (pure).

    Engine pods being deleted keep theirs. With no eligible router nothing changes (the
    annotations wait for the routers to come back rather than being cleared).
    """
    engines = [p for p in engine_pods if not is_terminating(p)]
    current = {
        str(p["metadata"]["name"]): str(((p.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ROUTER, ""))
        for p in engines
    }
    wanted = assign_engines(engines=current, routers=eligible_routers(router_pods), previous=current)
    return {engine: router for engine, router in wanted.items() if current.get(engine) != router}
