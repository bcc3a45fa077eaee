"""``plan --simulate``'s decisions: which caps to try per fleet size, and which cap and fleet to recommend (pure).

For each candidate replica count the trainer's ``in_flight`` rollouts are spread over the fleet and a
coarse grid of fixed caps runs, from the conservative floor (``KV tokens // maxModelLen``) to just past
the in-flight rollouts per replica (where a cap stops binding), spaced geometrically (throughput
against the cap rises to a peak where the live contexts fill the KV cache, then falls as they evict
each other: the peak sits a small multiple above the floor, however many rollouts are in flight),
then the caps halfway to the best one's neighbours. The recommendation is the fewest replicas whose
best cap reaches the target throughput: the user's, or by default ``knee`` of the best fleet's (more
replicas past that buy little).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["FleetPoint", "PlanChoice", "choose_fleet", "coarse_caps", "fleet_point", "refine_caps"]

_PLATEAU = 0.99
"""Caps within this share of the best cap's throughput are on its plateau."""


def coarse_caps(*, floor: int, in_flight: int, replicas: int, points: int) -> list[int]:
    """At most ``points`` fixed caps, geometrically from ``floor`` to just past the rollouts per replica (pure)."""
    if floor < 1 or in_flight < 1 or replicas < 1 or points < 2:
        raise ValueError("floor, in_flight and replicas must be at least 1, points at least 2")
    top = max(floor + 1, math.ceil(in_flight / replicas) + 2)
    ratio = top / floor
    inner = {round(floor * ratio ** (i / (points - 1))) for i in range(1, points - 1)}
    return sorted({floor, top} | inner)


def refine_caps(fixed: Mapping[int, float], *, floor: int) -> list[int]:
    """Caps halfway between the best cap and each coarse neighbour, not run yet (pure)."""
    if not fixed:
        return []
    best = max(fixed, key=lambda c: (fixed[c], -c))
    ordered = sorted(fixed)
    i = ordered.index(best)
    halves = []
    if i > 0:
        halves.append((ordered[i - 1] + best) // 2)
    if i + 1 < len(ordered):
        halves.append((best + ordered[i + 1]) // 2)
    return sorted({c for c in halves if c >= floor and c not in fixed})


@dataclass(frozen=True)
class FleetPoint:
    """One fleet size: every fixed cap tried, the best one, and the peers beside it."""

    replicas: int
    in_flight: int
    floor: int
    """Conservative cap per replica."""
    fixed: dict[int, float]
    """Fleet tokens/s per fixed cap."""
    best_cap: int
    tokens_per_s: float
    """The best fixed cap's fleet tokens/s."""
    plateau_cap: int
    """The smallest cap within 1 % of the best (caps above it buy nothing measurable)."""
    adaptive_tokens_per_s: float | None
    adaptive_mean_target: float | None
    uncapped_tokens_per_s: float | None
    """Sticky least-loaded (vllm-router's, no cap) on the same rollouts."""

    @property
    def tokens_per_s_per_replica(self) -> float:
        """The best fixed cap's tokens/s per replica."""
        return self.tokens_per_s / self.replicas


def fleet_point(
    *,
    replicas: int,
    in_flight: int,
    floor: int,
    fixed: Mapping[int, float],
    adaptive: tuple[float, float | None] | None = None,
    uncapped: float | None = None,
) -> FleetPoint:
    """The fleet size's summary from its runs (pure); ``adaptive``: (tokens/s, mean working-set target)."""
    if not fixed:
        raise ValueError(f"no fixed-cap run for {replicas} replicas")
    best = max(fixed, key=lambda c: (fixed[c], -c))
    plateau = min(c for c, v in fixed.items() if v >= _PLATEAU * fixed[best])
    return FleetPoint(
        replicas=replicas,
        in_flight=in_flight,
        floor=floor,
        fixed=dict(sorted(fixed.items())),
        best_cap=best,
        tokens_per_s=fixed[best],
        plateau_cap=plateau,
        adaptive_tokens_per_s=None if adaptive is None else adaptive[0],
        adaptive_mean_target=None if adaptive is None else adaptive[1],
        uncapped_tokens_per_s=uncapped,
    )


@dataclass(frozen=True)
class PlanChoice:
    """The answer: how many replicas, which cap, and whether the target is met."""

    replicas: int
    cap: int
    tokens_per_s: float
    target_tokens_per_s: float
    target: str
    """How the target was set (the user's figure, or the knee of the best fleet's)."""
    met: bool


def choose_fleet(points: Iterable[FleetPoint], *, target_tokens_per_s: float | None, knee: float) -> PlanChoice:
    """The fewest replicas whose best cap reaches the target; if none does, the fastest fleet, ``met`` False (pure).

    ``target_tokens_per_s`` None: the target is ``knee`` x the best fleet's throughput.
    """
    fleets = sorted(points, key=lambda p: p.replicas)
    if not fleets:
        raise ValueError("no fleet was simulated")
    if not 0 < knee <= 1:
        raise ValueError("knee must be in (0, 1]")
    fastest = max(fleets, key=lambda p: (p.tokens_per_s, -p.replicas))
    if target_tokens_per_s is None:
        target = knee * fastest.tokens_per_s
        how = f"{knee:g} x the best fleet's {fastest.tokens_per_s:,.0f} tok/s ({fastest.replicas} replicas)"
    else:
        target = target_tokens_per_s
        how = f"--target-tokens-per-s {target_tokens_per_s:g}"
    for p in fleets:
        if p.tokens_per_s >= target:
            return PlanChoice(p.replicas, p.best_cap, p.tokens_per_s, target, how, met=True)
    return PlanChoice(fastest.replicas, fastest.best_cap, fastest.tokens_per_s, target, how, met=False)
