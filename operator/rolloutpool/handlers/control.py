"""The slow control loop inside a pass: read Prometheus when due, then let the pure law decide.

Caps and cooldowns come back from the previous status (``controls_from_status``), so an
operator restart neither resets a cap nor skips a cooldown. Between two steps of the loop
(``autoscaling.intervalSeconds``) a pass keeps every replica's cap as the status has it;
a replica that appears meanwhile starts at the law's initial cap (its floor while Prometheus is
down).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.api.status import RolloutPoolStatus
from rolloutpool.autoscale import MetricsHealth, ReplicaControl, ReplicaSignals, classify_health
from rolloutpool.handlers.context import PoolMemory, SignalsReader
from rolloutpool.metrics.prom import PrometheusUnreachable
from rolloutpool.reconcile.caps import controls_from_status, plan_controls

__all__ = ["ControlStep", "control_step", "stale_after_seconds", "window_seconds"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControlStep:
    """Caps and quarantine per replica, and whether the law had metrics to act on."""

    controls: dict[str, ReplicaControl]
    health: MetricsHealth
    signals: Mapping[str, ReplicaSignals | None]
    stepped: bool
    """Whether the law ran in this pass (else the previous caps were kept)."""
    next_in: float | None
    """Seconds until the next step is due; None without autoscaling."""


def window_seconds(interval: float) -> float:
    """Rate window of the PromQL queries: two intervals, at least 30 s (two default scrapes) (pure)."""
    return max(2.0 * interval, 30.0)


def stale_after_seconds(interval: float) -> float:
    """Age past which the newest sample counts as stale: two intervals plus a scrape or two (pure)."""
    return 2.0 * interval + 30.0


async def _read(
    prometheus: Callable[[str], SignalsReader], url: str, *, namespace: str, replicas: Sequence[str], interval: float
) -> tuple[Mapping[str, ReplicaSignals | None], str | None]:
    try:
        reader = prometheus(url)
        signals = await asyncio.to_thread(
            reader.read, namespace=namespace, replicas=replicas, window_seconds=window_seconds(interval)
        )
    except (PrometheusUnreachable, ValueError) as exc:
        return {}, str(exc) or type(exc).__name__
    return signals, None


async def control_step(
    prometheus: Callable[[str], SignalsReader],
    memory: PoolMemory,
    *,
    namespace: str,
    pool: str,
    spec: RolloutPoolSpec,
    replicas: Sequence[str],
    previous: RolloutPoolStatus | None,
    now: float,
    clock: float,
    queued_sessions: int | None = None,
) -> ControlStep:
    """One pass's caps: a law step when due (reading Prometheus first), otherwise the kept ones.

    ``prometheus`` gives the reader of a URL; ``now`` is wall time (the law's cooldowns),
    ``clock`` monotonic time (when the next step is due). ``queued_sessions`` is the
    routers' admission queue (None when no router answered): the law raises a cap only
    while sessions wait for it.

    Raises ``ValueError`` naming the spec field when the spec cannot be served.
    """
    autoscaling = spec.autoscaling
    before = controls_from_status(previous)
    capacities = {
        entry.name: entry.kv_capacity_tokens
        for entry in (previous.replica_status if previous else [])
        if entry.kv_capacity_tokens is not None
    }
    if not autoscaling.enabled or autoscaling.prometheus_url is None:
        health = classify_health(enabled=False, reachable=False, signals={}, now=now, stale_after_seconds=0.0)
        controls = plan_controls(
            spec=spec,
            replicas=replicas,
            signals={},
            previous=before,
            kv_capacity_tokens=capacities,
            health=health,
            now=now,
        )
        return ControlStep(controls, health, {}, stepped=True, next_in=None)
    interval = float(autoscaling.interval_seconds)
    if not replicas:  # nothing to read yet: the first pass with pods steps at once
        health = memory.health or MetricsHealth(False, "MetricsMissing", "no engine pods to read metrics of yet")
        return ControlStep({}, health, {}, stepped=False, next_in=None)
    due = memory.control_at is None or memory.health is None or clock - memory.control_at >= interval
    if due:
        signals, error = await _read(
            prometheus, autoscaling.prometheus_url, namespace=namespace, replicas=replicas, interval=interval
        )
        memory.health = classify_health(
            enabled=True,
            reachable=error is None,
            signals=dict(signals),
            now=now,
            stale_after_seconds=stale_after_seconds(interval),
            error=error or "",
        )
        if queued_sessions is not None:
            signals = {
                name: None if s is None else replace(s, queued_sessions=queued_sessions) for name, s in signals.items()
            }
        memory.signals, memory.control_at = signals, clock
        if not memory.health.available:
            _log.info("Read no usable metrics pool=%s/%s reason=%s", namespace, pool, memory.health.reason)
        controls = plan_controls(
            spec=spec,
            replicas=replicas,
            signals=signals,
            previous=before,
            kv_capacity_tokens=capacities,
            health=memory.health,
            now=now,
        )
        return ControlStep(controls, memory.health, signals, stepped=True, next_in=interval)
    assert memory.health is not None  # noqa: S101 - not due means a step ran before
    kept = {name: before[name] for name in replicas if name in before}
    fresh = [name for name in replicas if name not in before]
    if fresh:  # new replicas start at the law's initial cap (blind: the floor) until the next step
        kept |= plan_controls(
            spec=spec, replicas=fresh, signals={}, previous={}, kv_capacity_tokens={}, health=memory.health, now=now
        )
    assert memory.control_at is not None  # noqa: S101
    return ControlStep(
        kept, memory.health, memory.signals, stepped=False, next_in=max(0.0, interval - (clock - memory.control_at))
    )
