"""The demo's two sides as figures: series over time, totals, the headline (pure).

Each side (RolloutPool, and vllm-router's sticky least-loaded over its own engine-sims) is
sampled every couple of seconds: the engines' counters summed over the side's engines, and,
on our side, the router's turn-scheduling gauges. Turns come from the load client: when each
answered and how many tokens it had to prefill again because its prefix had been evicted
(the shortfall of the engine's reported cached tokens against what the previous turn left).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

__all__ = [
    "EngineTotals",
    "Point",
    "RouterGauges",
    "Side",
    "SideSummary",
    "cumulative",
    "headline",
    "ratio_text",
    "summarize",
    "throughput",
]


@dataclass(frozen=True)
class EngineTotals:
    """Counters summed over one side's engines at one instant."""

    generated: float = 0.0
    prompt: float = 0.0
    """Prompt tokens of admitted requests, cached or not."""
    cached: float = 0.0
    """Of ``prompt``, those served from the prefix cache."""
    preemptions: float = 0.0
    lag_s: float = 0.0
    """Simulated seconds the engine-sims fell behind their time scale (CPU short)."""


@dataclass(frozen=True)
class RouterGauges:
    """Our router's turn scheduling at one instant, summed over its replicas."""

    held: int = 0
    """Turns waiting for room in a working set now."""
    kept: int = 0
    let_go: int = 0
    quarantined: int = 0
    """Replicas taking no new sessions (the router's fast loop or the operator's law)."""
    held_total: int = 0
    """Turns ever held (cumulative)."""
    moved_total: int = 0
    """Turns moved once to a replica with room (cumulative)."""


@dataclass(frozen=True)
class Point:
    """One sample of one side: wall seconds since the load began, the engines and (ours) the router."""

    t: float
    engines: EngineTotals
    router: RouterGauges | None = None


@dataclass
class Side:
    """What the demo saw of one side."""

    name: str
    label: str
    points: list[Point] = field(default_factory=list)
    turns: list[tuple[float, int]] = field(default_factory=list)
    """Per answered turn: wall seconds since the load began, tokens re-prefilled."""
    completed: int = 0
    """Rollouts completed inside the load window."""
    errors: int = 0


@dataclass(frozen=True)
class SideSummary:
    """One side's totals over the load window."""

    label: str
    generated: int
    tokens_per_s: float
    """Generated tokens per simulated second, over the sampled window."""
    reprefilled: int
    prefilled: int
    """Prompt tokens not served from cache (new tokens and re-prefill)."""
    preemptions: int
    turns: int
    completed: int
    errors: int
    held_total: int | None
    held_peak: int | None
    moved: int | None
    quarantine_s: float | None
    """Wall seconds during which at least one replica was quarantined (ours only)."""
    lag_pct: float
    """Simulated time the engines lost behind their time scale, in percent of the window."""


def throughput(points: list[Point], *, time_scale: float) -> tuple[list[float], list[float]]:
    """Generated tokens per simulated second between consecutive samples, at each interval's end (pure)."""
    ts: list[float] = []
    rates: list[float] = []
    for a, b in itertools.pairwise(points):
        dt = (b.t - a.t) * time_scale
        if dt > 0:
            ts.append(b.t)
            rates.append(max(0.0, b.engines.generated - a.engines.generated) / dt)
    return ts, rates


def cumulative(turns: list[tuple[float, int]], *, until: float | None = None) -> tuple[list[float], list[int]]:
    """Re-prefilled tokens summed over the turns answered so far, as a step series from 0 (pure)."""
    ts, totals, running = [0.0], [0], 0
    for t, tokens in sorted(turns):
        if until is not None and t > until:
            break
        running += tokens
        ts.append(t)
        totals.append(running)
    if until is not None:
        ts.append(until)
        totals.append(running)
    return ts, totals


def _quarantine_seconds(points: list[Point]) -> float:
    return sum(b.t - a.t for a, b in itertools.pairwise(points) if a.router is not None and a.router.quarantined)


def summarize(side: Side, *, time_scale: float, replicas: int) -> SideSummary:
    """One side's totals: engine counters between the first and last sample, turns from the client (pure)."""
    first, last = (side.points[0], side.points[-1]) if side.points else (Point(0.0, EngineTotals()),) * 2
    window = (last.t - first.t) * time_scale
    e0, e1 = first.engines, last.engines
    generated = e1.generated - e0.generated
    routers = [p.router for p in side.points if p.router is not None]
    held_total = moved = None
    if routers:
        held_total = routers[-1].held_total - routers[0].held_total
        moved = routers[-1].moved_total - routers[0].moved_total
    return SideSummary(
        label=side.label,
        generated=round(generated),
        tokens_per_s=generated / window if window > 0 else 0.0,
        reprefilled=sum(tokens for _, tokens in side.turns),
        prefilled=round((e1.prompt - e1.cached) - (e0.prompt - e0.cached)),
        preemptions=round(e1.preemptions - e0.preemptions),
        turns=len(side.turns),
        completed=side.completed,
        errors=side.errors,
        held_total=held_total,
        held_peak=max((r.held for r in routers), default=None) if routers else None,
        moved=moved,
        quarantine_s=_quarantine_seconds(side.points) if routers else None,
        lag_pct=100.0 * (e1.lag_s - e0.lag_s) / (window * replicas) if window > 0 and replicas else 0.0,
    )


def ratio_text(ours: float, theirs: float) -> str:
    """``ours`` against ``theirs`` as a factor a reader takes in at once ("2.4x", "0.8x", "-") (pure)."""
    if theirs <= 0:
        return "-" if ours <= 0 else "all of it"
    return f"{ours / theirs:.2g}x" if ours / theirs < 10 else f"{ours / theirs:.0f}x"


def headline(ours: SideSummary, peer: SideSummary) -> str:
    """One line a reader takes in at a glance: throughput and re-prefill, ours against the peer (pure)."""
    return (
        f"Same load: {ours.label} generated {ours.generated:,} tokens ({ratio_text(ours.generated, peer.generated)} "
        f"of {peer.label}'s {peer.generated:,}) and re-prefilled {ours.reprefilled:,} tokens "
        f"(vs {peer.reprefilled:,}: {ratio_text(ours.reprefilled, peer.reprefilled)})"
    )
