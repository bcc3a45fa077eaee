"""Which router of a fleet places sessions on each engine: balanced, stable, minimal movement (pure).

One function, :func:`assign_engines`, computed by the operator (it publishes the result as the
annotation ``rolloutpool.io/router`` on each engine pod) and by every router (to foresee the
operator's next assignment when a router leaves: :func:`rolloutpool.routing.fleetview.fleet_view`).
Every router gets ``floor(E/R)`` or ``ceil(E/R)`` engines; a pass over its own output changes
nothing; an engine moves only when its router is gone or holds more than its quota, and the
``E mod R`` larger quotas go to the routers that already hold the most.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["assign_engines", "natural_key"]


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
