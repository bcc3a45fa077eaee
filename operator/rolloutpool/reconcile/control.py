"""The slow control loop's decisions inside a pass: is a step due, what the read says, each replica's
working-set target and quarantine (pure).

Targets and cooldowns come back from the previous status (``controls_from_status``), so an
operator restart neither resets a target nor skips a cooldown. Between two steps of the loop
(``autoscaling.intervalSeconds``) a pass keeps every replica's target as the status has it;
a replica that appears meanwhile starts at the law's initial target (none while Prometheus is
down: the routers keep their own). The operator's process keeps :class:`ControlMemo` between passes;
``now`` is wall time (the law's cooldowns), ``clock`` monotonic time (when the next step is due).
Prometheus' rates are per wall second; :func:`engine_time` puts a time-scaled pool's in engine seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.api.status import RolloutPoolStatus
from rolloutpool.autoscale import RATE_WINDOW_SECONDS, MetricsHealth, ReplicaControl, ReplicaSignals, classify_health
from rolloutpool.reconcile.caps import controls_from_status, plan_controls

__all__ = [
    "ControlMemo",
    "ControlStep",
    "MetricsRead",
    "engine_time",
    "metrics_due",
    "remember_read",
    "spec_time_scale",
    "spec_window_seconds",
    "stale_after_seconds",
    "step_controls",
    "window_seconds",
]

MIN_WINDOW_SECONDS = 30.0
"""The shortest rate window: two scrapes at Prometheus' default interval."""


@dataclass(frozen=True)
class MetricsRead:
    """What one Prometheus read gave: signals per replica, or why there were none."""

    signals: Mapping[str, ReplicaSignals | None] = field(default_factory=dict)
    error: str | None = None
    """The read's failure (Prometheus unreachable, a bad answer); None when it answered."""


@dataclass(frozen=True)
class ControlMemo:
    """What the operator remembers of the slow loop between passes (lost on restart: then a step is due)."""

    control_at: float | None = None
    """Monotonic time of the last step."""
    signals: Mapping[str, ReplicaSignals | None] = field(default_factory=dict)
    """What the last step read (shown in the status until the next step)."""
    health: MetricsHealth | None = None
    """What the last step made of its read (the ``MetricsAvailable`` condition)."""


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


def window_seconds(interval: float, *, time_scale: float = 1.0) -> float:
    """Rate window of the PromQL queries, in the caller's seconds (pure).

    The law's :data:`~rolloutpool.autoscale.RATE_WINDOW_SECONDS` of engine time (``RATE_WINDOW_SECONDS /
    time_scale`` wall seconds for simulated engines that run ``time_scale`` times faster than real time), at least
    two intervals and :data:`MIN_WINDOW_SECONDS`. The simulator takes its rates over the same engine seconds, so its
    figures are the operator's.
    """
    return max(2.0 * interval, RATE_WINDOW_SECONDS / time_scale, MIN_WINDOW_SECONDS)


def spec_window_seconds(spec: RolloutPoolSpec) -> float:
    """:func:`window_seconds` of a pool: its ``autoscaling.intervalSeconds`` and its simulated engines' time scale."""
    return window_seconds(float(spec.autoscaling.interval_seconds), time_scale=spec_time_scale(spec))


def engine_time(read: MetricsRead, *, time_scale: float) -> MetricsRead:
    """A Prometheus read's rates per engine second, the unit of the law's thresholds (pure).

    Prometheus takes ``rate()`` per wall second; a simulated pool's engines run ``time_scale`` times faster than wall
    time, so its preemptions and re-prefilled tokens per wall second are ``time_scale`` times what its engines see
    per second of their own clock. Left as they are, the law cut a time-scaled pool's targets on a tenth of its
    thresholds (the demo, at time scale 10). The bench and the simulator take their rates in engine time already.
    """
    if time_scale == 1.0:
        return read
    scaled = {
        name: None
        if s is None
        else replace(
            s,
            preemptions_per_s=None if s.preemptions_per_s is None else s.preemptions_per_s / time_scale,
            reprefill_tokens_per_s=None if s.reprefill_tokens_per_s is None else s.reprefill_tokens_per_s / time_scale,
        )
        for name, s in read.signals.items()
    }
    return MetricsRead(scaled, read.error)


def spec_time_scale(spec: RolloutPoolSpec) -> float:
    """How much faster than wall time a pool's engines run (a simulated pool's ``timeScale``; 1 for real ones)."""
    simulator = spec.engine.simulator
    return simulator.time_scale if simulator is not None else 1.0


def stale_after_seconds(interval: float) -> float:
    """Age past which the newest sample counts as stale: two intervals plus a scrape or two (pure)."""
    return 2.0 * interval + 30.0


def metrics_due(*, spec: RolloutPoolSpec, replicas: Sequence[str], memo: ControlMemo, clock: float) -> str | None:
    """The Prometheus URL to read in this pass, or None when no step is due (pure).

    A step is due on the first pass with engine pods, then every ``autoscaling.intervalSeconds``.
    """
    autoscaling = spec.autoscaling
    if not autoscaling.enabled or autoscaling.prometheus_url is None or not replicas:
        return None
    interval = float(autoscaling.interval_seconds)
    due = memo.control_at is None or memo.health is None or clock - memo.control_at >= interval
    return autoscaling.prometheus_url if due else None


def remember_read(
    *, spec: RolloutPoolSpec, read: MetricsRead, now: float, clock: float, queued_sessions: int | None
) -> ControlMemo:
    """The memo after a read: its health verdict, its signals with the routers' queue (pure).

    ``queued_sessions`` is the routers' admission queue (None when no router answered): the
    law raises a cap only while sessions wait for it.
    """
    interval = float(spec.autoscaling.interval_seconds)
    health = classify_health(
        enabled=True,
        reachable=read.error is None,
        signals=dict(read.signals),
        now=now,
        stale_after_seconds=stale_after_seconds(interval),
        error=read.error or "",
    )
    signals = read.signals
    if queued_sessions is not None:
        signals = {
            name: None if s is None else replace(s, queued_sessions=queued_sessions) for name, s in signals.items()
        }
    return ControlMemo(control_at=clock, signals=signals, health=health)


def step_controls(
    *,
    spec: RolloutPoolSpec,
    replicas: Sequence[str],
    previous: RolloutPoolStatus | None,
    memo: ControlMemo,
    stepped: bool,
    now: float,
    clock: float,
) -> ControlStep:
    """One pass's targets: a law step over ``memo`` (``stepped``: it was just read), otherwise the kept ones (pure).

    Raises ``ValueError`` naming the spec field when the spec cannot be served.
    """
    autoscaling = spec.autoscaling
    before = controls_from_status(previous)
    if not autoscaling.enabled or autoscaling.prometheus_url is None:
        health = classify_health(enabled=False, reachable=False, signals={}, now=now, stale_after_seconds=0.0)
        controls = plan_controls(
            spec=spec,
            replicas=replicas,
            signals={},
            previous=before,
            health=health,
            now=now,
        )
        return ControlStep(controls, health, {}, stepped=True, next_in=None)
    interval = float(autoscaling.interval_seconds)
    if not replicas:  # nothing to read yet: the first pass with pods steps at once
        health = memo.health or MetricsHealth(False, "MetricsMissing", "no engine pods to read metrics of yet")
        return ControlStep({}, health, {}, stepped=False, next_in=None)
    assert memo.health is not None  # noqa: S101 - a read ran (now or before)
    assert memo.control_at is not None  # noqa: S101
    if stepped:
        controls = plan_controls(
            spec=spec,
            replicas=replicas,
            signals=memo.signals,
            previous=before,
            health=memo.health,
            now=now,
        )
        return ControlStep(controls, memo.health, memo.signals, stepped=True, next_in=interval)
    kept = {name: before[name] for name in replicas if name in before}
    fresh = [name for name in replicas if name not in before]
    if fresh:  # new replicas keep the routers' own target until the next step
        kept |= plan_controls(spec=spec, replicas=fresh, signals={}, previous={}, health=memo.health, now=now)
    return ControlStep(
        kept, memo.health, memo.signals, stepped=False, next_in=max(0.0, interval - (clock - memo.control_at))
    )
