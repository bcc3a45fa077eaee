"""The slow control loop's law: measured pressure -> each replica's working-set target and quarantine (pure).

The routers schedule turns by each replica's working set (:mod:`rolloutpool.routing.workingset`):
generating sessions' contexts and the idle prefixes they keep must fit ``target`` of the replica's KV
capacity, and a returning turn whose prefix was let go waits for room under it. The target is the one
number worth tuning from outside. Too high, and the engine evicts prefixes the routers kept (their
estimate of the working set was generous: kept sessions re-prefill) or preempts generating requests;
too low, and turns wait while the cache has room. So the law:

- lowers the target (``x decrease_factor``, at most once per cooldown) when the replica re-prefills kept
  prefixes faster than ``reprefill_tokens_per_s`` or preempts faster than ``preemptions_per_s`` (or a
  waiting queue builds on a full cache); pressure ``severe_factor`` times over a threshold also
  quarantines the replica for the step (no new sessions: ``ReplicasQuarantined``);
- raises it (``+ step``, once per cooldown, up to ``maximum``) while turns wait for room or new sessions
  queue and none of that pressure shows;
- otherwise holds it. Without signals it publishes nothing (``target`` None): the routers' own target,
  which is safe by construction, applies.

The operator runs it every ``autoscaling.intervalSeconds`` on signals read from Prometheus;
``rolloutpool simulate`` runs the same function on the signals a scrape would have seen. Nothing here
does I/O or reads a clock: ``now`` is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Literal

from rolloutpool.routing.pressure import PressureReason
from rolloutpool.routing.weights import law_holds

__all__ = [
    "RATE_WINDOW_SECONDS",
    "HealthReason",
    "LawParams",
    "MetricsHealth",
    "ReplicaControl",
    "ReplicaSignals",
    "classify_health",
    "decide_replica",
    "pressure_reason",
]

RATE_WINDOW_SECONDS: Final = 120.0
"""Engine seconds over which the law's rates and means are taken (``rate(...[2m])``): long enough that one evicted
session is no storm. The operator's queries take it over the engines' time scale
(:func:`rolloutpool.reconcile.control.window_seconds`), the simulator and the bench in engine time."""

HealthReason = Literal[
    "MetricsAvailable", "AutoscalingDisabled", "PrometheusUnreachable", "MetricsMissing", "MetricsStale"
]


@dataclass(frozen=True)
class ReplicaSignals:
    """What one replica showed over the last control interval (any field may be unknown)."""

    kv_usage: float | None = None
    """``vllm:kv_cache_usage_perc`` or ``gpu_cache_usage_perc``, 0..1; idle cached prefixes count as free."""
    preemptions_per_s: float | None = None
    """``rate(vllm:num_preemptions_total)`` over the window."""
    waiting: float | None = None
    """``vllm:num_requests_waiting`` (includes preempted requests)."""
    prefix_hit_ratio: float | None = None
    """``rate(prefix_cache_hits) / rate(prefix_cache_queries)`` over the window."""
    reprefill_tokens_per_s: float | None = None
    """``rate(rolloutpool_router_reprefilled_tokens_total)``: prefixes the routers kept, lost to eviction."""
    kv_capacity_tokens: int | None = None
    """``num_gpu_blocks * block_size`` from ``vllm:cache_config_info``."""
    live_sessions: int | None = None
    """The routers' live sessions on the replica."""
    held_turns: float | None = None
    """Turns the routers hold for room on the replica (``rolloutpool_router_held_turns``)."""
    queued_sessions: int | None = None
    """New sessions waiting in the routers' admission queue (fleet-wide, ``rolloutpool_router_queue_depth``)."""
    sampled_at: float | None = None
    """Unix time of the newest sample these values come from."""
    weight_updates: float | None = None
    """Flushing weight-sync operations the engines ran over the window (``vllm:rl_weight_update_*``)."""


@dataclass(frozen=True)
class ReplicaControl:
    """The law's decision for one replica; kept in the pool's status so it survives a restart."""

    target: float | None
    """The working-set target the routers apply; None: theirs (autoscaling off, or no signals)."""
    changed_at: float | None = None
    """Unix time of the last change (cooldown)."""
    quarantined: bool = False
    reason: str | None = None
    """Why quarantined (a :class:`~rolloutpool.routing.pressure.PressureReason`) or why the target last moved."""


@dataclass(frozen=True)
class LawParams:
    """Knobs of the law, from ``spec.autoscaling``."""

    initial: float = 0.9
    """Where a replica's target starts (``targetKvUsage``, the routers' own default)."""
    minimum: float = 0.5
    maximum: float = 1.0
    """The target stays in ``minimum..maximum`` (the working set never passes the KV capacity); the operator sets it
    to the pool's working-set target unless ``autoscaling.maxTarget`` says otherwise."""
    step: float = 0.02
    """Raise per cooldown while turns wait and nothing presses."""
    decrease_factor: float = 0.9
    """Cut under pressure."""
    cooldown_seconds: float = 60.0
    reprefill_tokens_per_s: float = 2000.0
    """Kept prefixes re-prefilled faster than this (tokens/s over the window) is pressure: the routers' working set
    is larger than they estimate. A prefix let go on purpose is not counted here."""
    preemptions_per_s: float = 0.05
    """Preemption rate above which a replica is under pressure (0.05/s: more than six in a 2-minute window; at 0.01/s
    the demo's few preemptions cut its targets and cost 8 % of its throughput in the simulator)."""
    waiting_threshold: float = 1.0
    """Waiting requests above which a replica is under pressure..."""
    queue_kv_usage: float = 0.9
    """...while its KV usage is at least this (when known): a queue with free KV blocks is not KV pressure."""
    severe_factor: float = 5.0
    """Pressure this many times over a threshold quarantines the replica for the step."""
    rate_window_seconds: float = RATE_WINDOW_SECONDS
    """Window of the rates the law expects (:data:`RATE_WINDOW_SECONDS`, engine seconds)."""

    def __post_init__(self) -> None:
        if not 0 < self.minimum <= self.initial <= self.maximum <= 2:
            raise ValueError("need 0 < minimum <= initial <= maximum <= 2")
        if not 0 < self.decrease_factor < 1 or self.step < 0:
            raise ValueError("decrease_factor must be in (0, 1) and step >= 0")

    @classmethod
    def at_target(cls, target: float, *, maximum: float | None = None, **knobs: float) -> LawParams:
        """The law of a pool whose working-set target is ``target``: each replica starts there, and the law never
        raises it past ``maximum`` (None: the target itself, the default of ``autoscaling.maxTarget``) (pure)."""
        ceiling = target if maximum is None else maximum
        return cls(initial=min(ceiling, target), maximum=ceiling, **knobs)


@dataclass(frozen=True)
class MetricsHealth:
    """Whether the law had signals to act on; becomes the ``MetricsAvailable`` condition."""

    available: bool
    reason: HealthReason
    message: str


def pressure_reason(signals: ReplicaSignals, params: LawParams) -> PressureReason | None:
    """The pressure a replica shows, most telling first, or None (pure).

    Re-prefill of kept prefixes and preemptions are eviction the working set should have prevented; a waiting
    queue is the symptom that follows, and counts only while the KV cache is at least ``queue_kv_usage`` full
    (when the usage is known): requests that wait while blocks are free wait for compute or ``max_num_seqs``,
    which a lower target does not relieve. Cache churn of finished sessions and the re-prefill of prefixes let go
    on purpose are not pressure.
    """
    if (signals.reprefill_tokens_per_s or 0.0) > params.reprefill_tokens_per_s:
        return PressureReason.EVICTING
    if (signals.preemptions_per_s or 0.0) > params.preemptions_per_s:
        return PressureReason.PREEMPTING
    full = signals.kv_usage is None or signals.kv_usage >= params.queue_kv_usage
    if (signals.waiting or 0.0) > params.waiting_threshold and full:
        return PressureReason.QUEUEING
    return None


def _severe(signals: ReplicaSignals, params: LawParams) -> bool:
    reprefill = (signals.reprefill_tokens_per_s or 0.0) / max(params.reprefill_tokens_per_s, 1e-9)
    preempt = (signals.preemptions_per_s or 0.0) / max(params.preemptions_per_s, 1e-9)
    return max(reprefill, preempt) >= params.severe_factor


def decide_replica(
    *,
    previous: ReplicaControl | None,
    signals: ReplicaSignals | None,
    params: LawParams,
    now: float,
) -> ReplicaControl:
    """Next working-set target and quarantine of one replica (pure); see the module docstring."""
    if signals is None:  # blind: the routers' own target applies
        return ReplicaControl(target=None, reason="NoMetrics")
    if previous is None or previous.target is None:
        previous = ReplicaControl(target=params.initial)
    current = min(params.maximum, max(params.minimum, previous.target or params.initial))
    cooled = previous.changed_at is None or now - previous.changed_at >= params.cooldown_seconds
    reason = pressure_reason(signals, params)
    keep = replace(previous, target=current, quarantined=False)
    if law_holds(weight_updates=signals.weight_updates, reason=reason):  # the re-prefill burst of a weight update
        return replace(keep, reason="WeightUpdate")
    if reason is not None:
        quarantined = _severe(signals, params)
        cut = max(params.minimum, round(current * params.decrease_factor, 4))
        if not cooled or cut >= current:
            return replace(keep, quarantined=quarantined, reason=reason)
        return ReplicaControl(target=cut, changed_at=now, quarantined=quarantined, reason=reason)
    waiting = (signals.held_turns or 0.0) > 0 or (signals.queued_sessions or 0) > 0
    raised = min(params.maximum, round(current + params.step, 4))
    if waiting and cooled and raised > current:
        return ReplicaControl(target=raised, changed_at=now, reason="Raised")
    return keep


def classify_health(
    *,
    enabled: bool,
    reachable: bool,
    signals: dict[str, ReplicaSignals | None],
    now: float,
    stale_after_seconds: float,
    error: str = "",
) -> MetricsHealth:
    """``MetricsAvailable`` from what the read returned (pure)."""
    if not enabled:
        return MetricsHealth(
            False, "AutoscalingDisabled", "autoscaling is disabled; the routers keep their own working-set target"
        )
    if not reachable:
        return MetricsHealth(False, "PrometheusUnreachable", f"Prometheus query failed: {error}".rstrip(": "))
    missing = sorted(name for name, s in signals.items() if s is None or s.kv_usage is None)
    if missing:
        return MetricsHealth(False, "MetricsMissing", f"no engine metrics for {', '.join(missing)}")
    stale = sorted(
        name
        for name, s in signals.items()
        if s is not None and (s.sampled_at is None or now - s.sampled_at > stale_after_seconds)
    )
    if stale:
        age = f"{stale_after_seconds:.0f}s"
        return MetricsHealth(False, "MetricsStale", f"metrics older than {age} for {', '.join(stale)}")
    return MetricsHealth(True, "MetricsAvailable", f"fresh metrics for {len(signals)} replicas")
