"""Which router pod of a fleet owns each engine replica (pure).

With ``spec.router.replicas > 1`` every engine is placed on by exactly one router, so each
engine's live count and cap are kept in one place and caps hold fleet-wide. The operator
computes the assignment on every pass and publishes it as the annotation
``rolloutpool.io/router: <router pod>`` on each engine pod; the routers already watch their
pool's pods, so they read it with the RBAC they have.

:func:`assign_engines` is balanced (every router gets ``floor(E/R)`` or ``ceil(E/R)`` engines),
stable (a pass over its own output changes nothing) and moves as few engines as balance
allows: an engine moves only when its router is gone or holds more than its quota, and the
``E mod R`` larger quotas go to the routers that already hold the most.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from rolloutpool.api.pods import is_terminating
from rolloutpool.routing.fleetview import ANNOTATION_ROUTER

__all__ = [
    "ANNOTATION_ROUTER",
    "assign_engines",
    "assignment_patches",
    "eligible_routers",
    "natural_key",
]


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key that orders ``x-engine-2`` before ``x-engine-10`` (pure)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def assign_engines(*, engines: Iterable[str], routers: Iterable[str], previous: Mapping[str, str]) -> dict[str, str]:
    """Engine -> router: balanced, stable, minimal movement from ``previous`` (pure).

    ``previous`` is the current assignment (engines whose router is not in ``routers`` are
    reassigned). Without routers the result is empty.
    """
    engine_list = sorted(set(engines), key=natural_key)
    router_list = sorted(set(routers), key=natural_key)
    if not router_list:
        return {}
    base, extra = divmod(len(engine_list), len(router_list))
    kept: dict[str, list[str]] = {r: [] for r in router_list}
    for engine in engine_list:
        owner = previous.get(engine)
        if owner in kept:
            kept[owner].append(engine)
    by_holding = sorted(router_list, key=lambda r: (-len(kept[r]), natural_key(r)))
    quota = {r: base + (1 if i < extra else 0) for i, r in enumerate(by_holding)}
    result: dict[str, str] = {}
    for router, held in kept.items():
        for engine in held[: quota[router]]:
            result[engine] = router
    count = {r: min(len(kept[r]), quota[r]) for r in router_list}
    for engine in engine_list:
        if engine in result:
            continue
        router = max(router_list, key=lambda r: quota[r] - count[r])  # the first of the roomiest
        result[engine] = router
        count[router] += 1
    return result


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
