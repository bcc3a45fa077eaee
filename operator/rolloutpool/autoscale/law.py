"""The slow control loop's law: measured pressure -> each replica's cap and quarantine (pure).

The operator runs it every ``autoscaling.intervalSeconds`` on signals read from Prometheus;
``rolloutpool simulate`` runs the same function on the signals a scrape would have seen.
Nothing here does I/O or reads a clock: ``now`` is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final, Literal

from rolloutpool.routing.eviction_budget import (
    IDLE_PREFIX_USAGE,
    REPREFILL_BUDGET_TOKENS_PER_S,
    STEP_HEADROOM_RATIO,
    reads_cheaply,
)
from rolloutpool.routing.pressure import PressureReason, pressure_reason_named
from rolloutpool.routing.weights import law_holds

__all__ = [
    "RATE_WINDOW_SECONDS",
    "HealthReason",
    "LawParams",
    "MetricsHealth",
    "ReplicaControl",
    "ReplicaSignals",
    "cheap_cache_reads",
    "classify_health",
    "decide_replica",
    "decide_unobserved",
    "initial_cap",
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
    kv_usage_mean: float | None = None
    """``kv_usage`` averaged over the rate window (``avg_over_time``): one instant's gauge swings 0.2-0.6 within a
    minute on long contexts, a mean does not, and does not depend on the scrape interval."""
    preemptions_per_s: float | None = None
    """``rate(vllm:num_preemptions_total)`` over the interval."""
    waiting: float | None = None
    """``vllm:num_requests_waiting`` (includes preempted requests)."""
    prefix_hit_ratio: float | None = None
    """``rate(prefix_cache_hits) / rate(prefix_cache_queries)`` over the interval."""
    reprefill_tokens_per_s: float | None = None
    """``rate(rolloutpool_router_reprefilled_tokens_total)``: live sessions' prefixes lost to eviction."""
    kv_capacity_tokens: int | None = None
    """``num_gpu_blocks * block_size`` from ``vllm:cache_config_info``."""
    live_sessions: int | None = None
    """The router's live sessions on the replica."""
    queued_sessions: int | None = None
    """New sessions waiting in the router's admission queue (fleet-wide, ``rolloutpool_router_queue_depth``)."""
    sampled_at: float | None = None
    """Unix time of the newest sample these values come from."""
    kv_cap: int | None = None
    """Sessions the measured contexts make room for: 90 % of the KV capacity over the 90th percentile of finished
    sessions' final contexts (:meth:`rolloutpool.routing.admission_kv.KvProjection.measured_floor`), the
    conservative floor with a measurement in place of ``maxModelLen``; the slow start jumps to it (after only
    ``LawParams.jump_cooldown_seconds`` while the cache is mostly free and nothing is evicted). None: unknown."""
    weight_updates: float | None = None
    """Flushing weight-sync operations the engines ran over the window (``vllm:rl_weight_update_*``)."""
    mean_itl_seconds: float | None = None
    """The engine's mean inter-token latency over the window (``rate(vllm:inter_token_latency_seconds_sum)`` over
    ``rate(..._count)``, engine seconds): the mean step a generated token took."""


@dataclass(frozen=True)
class ReplicaControl:
    """The law's decision for one replica; kept in the pool's status so it survives a restart."""

    cap: int | None
    """None: the operator sets no cap (autoscaling off); the router admits by projected KV tokens under
    ``maxSessionsPerReplica``. The law never decides None; it starts a replica without a cap at :func:`initial_cap`."""
    changed_at: float | None = None
    """Unix time of the last cap change (cooldown)."""
    quarantined: bool = False
    reason: str | None = None
    """Why quarantined (a :class:`~rolloutpool.routing.pressure.PressureReason`) or why the cap last moved."""
    limit: int | None = None
    """The cap the law does not pass without probing (the cliff it learned): where pressure last showed, one step
    over a storm's cut, or one step over where early eviction stopped the climb; None before any sign."""
    limit_at: float | None = None
    """Unix time the limit was learned or last probed."""


@dataclass(frozen=True)
class LawParams:
    """Knobs of the law, from ``spec.concurrency`` and ``spec.autoscaling``."""

    floor: int
    """Conservative cap: ``kv_capacity // max_model_len`` (never evicts); the cap never goes below it."""
    ceiling: int
    """``maxSessionsPerReplica`` (or a large default); the cap never goes above it."""
    initial: int | None = None
    """Where the law starts (clamped to floor..ceiling): the spec's cap from ``expectedResidency`` and ``headroom``
    (the cap the pool would have without autoscaling); None: the floor. A guess, not knowledge: the law moves
    from it on measurements alone, and falls back to the floor whenever it is blind."""
    target_kv_usage: float = 0.85
    cooldown_seconds: float = 60.0
    decrease_factor: float = 0.85
    """Multiplicative cut under severe pressure (``severe_factor``); milder pressure steps back once."""
    increase_step: int = 1
    tolerance: float = 0.05
    """Band under ``target_kv_usage`` in which the cap holds (anti-flap)."""
    reprefill_tokens_per_s: float = REPREFILL_BUDGET_TOKENS_PER_S
    """Re-prefill rate of live sessions (tokens/s, over ``rate_window_seconds``) above which a replica is under
    pressure. Some eviction pays for itself through bigger decode batches: the default is ~10 % of an 8B model's
    prefill rate on one H100, about where the simulator's throughput-vs-cap curves peak."""
    preemptions_per_s: float = 0.01
    """Preemption rate above which a replica is under pressure (0.01/s: more than one in a 2-minute window)."""
    waiting_threshold: float = 1.0
    """Waiting requests above which a replica is under pressure..."""
    queue_kv_usage: float = 0.9
    """...while its KV usage is at least this (when known): a queue with free KV blocks is not KV pressure."""
    rate_window_seconds: float = RATE_WINDOW_SECONDS
    """Window of the rates the law expects (:data:`RATE_WINDOW_SECONDS`, engine seconds)."""
    slow_start_factor: float = 1.05
    """Before any pressure was seen, raises are multiplicative by this factor (at least ``increase_step``) while KV
    usage is under ``slow_start_near_usage``. Gentle, because eviction shows minutes after the cap that caused it
    (admitted sessions grow): x1.15 overshot into the long rollouts of a bimodal mix (0.88 of the best fixed cap at
    3x); short contexts need no fast climb, the jump to the measured floor (``ReplicaSignals.kv_cap``) lifts them."""
    slow_start_near_usage: float = 0.5
    """KV usage from which the slow start climbs by ``slow_start_near_factor`` instead: nearer the cliff, whose
    signal lags the cap by minutes, a fast climb overshoots into a storm."""
    slow_start_near_factor: float = 1.05
    jump_usage: float = 0.5
    """KV usage under which the slow start's jump to the measured floor (``ReplicaSignals.kv_cap``) waits only
    ``jump_cooldown_seconds``, while no eviction and no preemption at all is measured over the window: short contexts
    leave the cache mostly free while sessions queue behind the cap, and a 60 s wait between the jumps cost
    ``tool-chat`` at 4x 2 % of sticky least-loaded's throughput (0.977). Raises by the slow start's own factor keep
    ``cooldown_seconds``: a faster x1.05 climb overshot into the long rollouts of ``bimodal`` and ``agentic-grpo``."""
    jump_cooldown_seconds: float = 15.0
    """At most ``cooldown_seconds``."""
    probe_seconds: float = 300.0
    """After this long without pressure just under the learned limit, the law probes one step higher."""
    severe_factor: float = 5.0
    """Pressure this many times over a threshold is severe: the cut is multiplicative, otherwise one step."""
    quarantine_on: Literal["any", "severe", "never"] = "severe"
    """Which pressure quarantines: any, only severe (default; the router's fast loop covers the rest), or never
    (caps only). A quarantine held for a whole rate window drains a replica far below its cap."""
    quarantine_holds: bool = False
    """Keep quarantining while pressure lasts after a cut; False: only the step that cuts quarantines (the cut
    itself stops new sessions until enough finish; the rate window outlasts the pressure by minutes)."""
    warning_fraction: float = 0.25
    """Eviction at this fraction of a pressure threshold stops the additive climb (probes only from there)."""
    idle_eviction_usage: float = IDLE_PREFIX_USAGE
    """Before any limit was learned, eviction measured under its threshold while the KV usage averaged under this over
    the rate window (``ReplicaSignals.kv_usage_mean``) is eviction of idle prefixes: the cache is oversubscribed by
    sessions in their tool calls, while the running ones hold a quarter of it. A re-prefill then lands on an engine
    with room and costs little (on ``rolloutpool bench``'s default fleet sticky least-loaded evicts 60 % of its
    prefill and serves the most; the window means there were 0.16-0.22 at the median). Then the slow start climbs by
    ``idle_eviction_factor`` every ``idle_eviction_cooldown_seconds`` and early eviction does not stop it
    (``warning_fraction``). Where contexts are long the cache runs fuller before anything is evicted (the H100
    fleet's 3x-4x points: medians 0.47-0.65), so the fast climb stays out of the storms it would overshoot into; the
    lowest means there (0.23-0.27, ``bimodal``) come close to this mark."""
    idle_eviction_factor: float = 1.15
    """The slow start's factor while eviction is of idle prefixes (``idle_eviction_usage``)."""
    idle_eviction_cooldown_seconds: float = 15.0
    """At most ``cooldown_seconds``."""
    settle_seconds: float = 300.0
    """After a cut, pressure within this long holds the cap instead of cutting again: a cut only
    stops new sessions, the resident ones take minutes to finish (about a median trajectory's life)."""
    binding_slack: int = 1
    """The cap is raised only while it binds: live sessions at least ``cap - binding_slack`` and new sessions
    queued in the router (each when known). A cap nobody waits for stays put, and keeps the replicas balanced."""
    step_floor_seconds: float | None = None
    """What a step of the engine costs whatever it holds (overhead + one read of the weights, engine seconds), as the
    router's ``--step-floor``; None: unknown (real vLLM), and :func:`cheap_cache_reads` is off."""
    cache_read_seconds: float | None = None
    """One read of the replica's whole KV cache over HBM (capacity x KV bytes per token / bandwidth, engine seconds);
    None: unknown."""
    headroom_ratio: float = STEP_HEADROOM_RATIO
    """Steps under this multiple of ``step_floor_seconds`` leave the engine room to compute (the router's mark)."""


@dataclass(frozen=True)
class MetricsHealth:
    """Whether the law had signals to act on; becomes the ``MetricsAvailable`` condition."""

    available: bool
    reason: HealthReason
    message: str


def pressure_reason(signals: ReplicaSignals, params: LawParams) -> PressureReason | None:
    """The pressure a replica shows, most telling first, or None (pure).

    Re-prefill of live sessions and preemptions are eviction; a waiting queue is the symptom
    that follows, and counts only while the KV cache is at least ``queue_kv_usage`` full (when
    the usage is known): requests that wait while blocks are free wait for compute or
    ``max_num_seqs``, which a cut cap does not relieve. Cache churn of finished sessions is not
    pressure: it shows in none of these; nor does KV usage near the target by itself; nor does
    re-prefill while the steps have room (cheap cache reads and the measured steps under the
    headroom mark, as the router's eviction budget reads them).
    """
    reprefill = signals.reprefill_tokens_per_s or 0.0
    if reprefill > params.reprefill_tokens_per_s and not _steps_have_room(signals, params):
        return PressureReason.EVICTING
    if (signals.preemptions_per_s or 0.0) > params.preemptions_per_s:
        return PressureReason.PREEMPTING
    full = signals.kv_usage is None or signals.kv_usage >= params.queue_kv_usage
    if (signals.waiting or 0.0) > params.waiting_threshold and full:
        return PressureReason.QUEUEING
    return None


def _clamp(cap: int, params: LawParams) -> int:
    return max(params.floor, min(params.ceiling, cap))


def cheap_cache_reads(params: LawParams) -> bool:
    """Whether a step that reads the replica's whole KV cache still stays under ``headroom_ratio`` times the step
    floor (pure): the weights dominate every step, so however many sessions the cache holds, only prefill can make
    steps dear, and the measured inter-token latency shows it (False when either cost is unknown).

    Then eviction is paid in re-prefill alone: an evicted session's next turn re-prefills in steps that are paid for
    anyway while the engine has room, and a session held back costs its whole rollout. On ``rolloutpool bench``'s
    fleet (65,536 KV tokens on the H100 preset) a full read costs 0.34 of the floor and sticky least-loaded, which
    evicts 60 % of its prefill, serves the most; on the H100 fleet (the preset's whole cache) it costs 2 floors, and
    there eviction of long contexts is a storm that only a cap prevents.
    """
    return reads_cheaply(
        step_floor_seconds=params.step_floor_seconds,
        cache_read_seconds=params.cache_read_seconds,
        headroom_ratio=params.headroom_ratio,
    )


def _steps_have_room(signals: ReplicaSignals, params: LawParams) -> bool:
    """Cheap cache reads (:func:`cheap_cache_reads`) and the replica's mean inter-token latency measured under
    ``headroom_ratio`` x the step floor: a re-prefill rides in steps paid for anyway (unknown latency: no room)."""
    itl, floor = signals.mean_itl_seconds, params.step_floor_seconds
    return cheap_cache_reads(params) and itl is not None and floor is not None and itl < params.headroom_ratio * floor


def initial_cap(params: LawParams) -> int:
    """The cap a replica starts from before the law has decided anything (pure): ``params.initial`` (else the
    floor), or the ceiling where cache reads are cheap (:func:`cheap_cache_reads`): there a cap protects against
    preemption and dear steps, which the law sees when they come, not against eviction."""
    if cheap_cache_reads(params):
        return params.ceiling
    return _clamp(params.initial if params.initial is not None else params.floor, params)


def decide_unobserved(*, previous: ReplicaControl | None, params: LawParams, now: float) -> ReplicaControl:
    """A replica with no metrics of its own while Prometheus answers for the others (a new pod) (pure).

    It starts at :func:`initial_cap`; one the law already moved keeps its cap up to that start and
    drops to it from above, unquarantined. (Prometheus itself down or stale is blindness: then
    :func:`decide_replica` without signals falls back to the floor.)
    """
    start = initial_cap(params)
    if previous is None or previous.cap is None:
        return ReplicaControl(cap=start)
    return _without_signals(previous, held=previous.cap, most=start, now=now)


def _without_signals(previous: ReplicaControl, *, held: int, most: int, now: float) -> ReplicaControl:
    """No signals: keep ``held`` (unquarantined) up to ``most``, else drop to it; a change restarts the cooldown."""
    if held <= most and not previous.quarantined:
        return previous if held == previous.cap else replace(previous, cap=held)
    return ReplicaControl(
        cap=min(held, most), changed_at=now, quarantined=False, reason="NoMetrics",
        limit=previous.limit, limit_at=previous.limit_at,
    )  # fmt: skip


def _cut(
    *, previous: ReplicaControl, current: int, signals: ReplicaSignals, reason: str, params: LawParams, now: float
) -> ReplicaControl:
    """Under pressure: cut below the cap where the pressure showed, unless the last cut is still taking effect."""
    since = math.inf if previous.changed_at is None else now - previous.changed_at
    cut_last = pressure_reason_named(previous.reason) is not None
    live = signals.live_sessions
    severe = _severe(signals, params)
    quarantine = params.quarantine_on == "any" or (severe and params.quarantine_on == "severe")
    hold = ReplicaControl(
        cap=current, changed_at=previous.changed_at, quarantined=quarantine and params.quarantine_holds, reason=reason,
        limit=previous.limit, limit_at=previous.limit_at,
    )  # fmt: skip
    if live is not None and live > current:
        return hold  # the last cut has not taken effect yet: sessions above the cap are still finishing
    if cut_last and since < max(params.cooldown_seconds, params.settle_seconds):
        return hold  # a cut is settling: its sessions still have to finish before it shows
    if severe:
        # far past the cliff (typically the first overshoot, seen minutes late): cut multiplicatively and
        # climb back only by probes, one step per probe_seconds
        cut = _clamp(min(math.floor(current * params.decrease_factor), current - 1), params)
        limit = cut + params.increase_step
    else:
        # just past it (a probe, drift, noise): one step back; this cap is the new limit
        cut = _clamp(current - params.increase_step, params)
        limit = current
    if cut >= current:  # at the floor: nothing to cut (the router's fast quarantine still acts)
        return replace(hold, limit=max(current, params.floor + 1), limit_at=now)
    return ReplicaControl(cap=cut, changed_at=now, quarantined=quarantine, reason=reason, limit=limit, limit_at=now)


def _eviction_ratio(signals: ReplicaSignals, params: LawParams) -> float:
    """The larger of re-prefill and preemption rates, each over its pressure threshold."""
    reprefill = (signals.reprefill_tokens_per_s or 0.0) / max(params.reprefill_tokens_per_s, 1e-9)
    preempt = (signals.preemptions_per_s or 0.0) / max(params.preemptions_per_s, 1e-9)
    return max(reprefill, preempt)


def _severe(signals: ReplicaSignals, params: LawParams) -> bool:
    """Pressure ``severe_factor`` times over a threshold: a storm, not the edge of the cliff."""
    return _eviction_ratio(signals, params) >= params.severe_factor


def decide_replica(
    *,
    previous: ReplicaControl | None,
    signals: ReplicaSignals | None,
    params: LawParams,
    now: float,
) -> ReplicaControl:
    """Next cap and quarantine of one replica (pure).

    Starts at ``params.initial`` (else the floor). Under pressure it cuts the cap: one step back
    at the edge of the cliff (the cap becomes the learned ``limit``), multiplicatively under severe pressure (then the
    limit is one step over the cut, and the way back is by probes). The cutting step
    quarantines (by default only under severe pressure, see ``quarantine_on``). Without
    pressure, with KV usage under the target band and the cap binding (live sessions at it and
    new sessions queued), it raises: multiplicatively before any sign of pressure (slow
    start), then additively up to one step under the limit, where it holds and probes one step
    higher every ``probe_seconds``; eviction under the threshold (``warning_fraction`` of it)
    ends the climb where it is, since eviction lags the cap by minutes (admitted sessions
    grow), unless it is eviction of idle prefixes from a cache that stayed mostly free (then
    the slow start climbs faster, ``idle_eviction_usage``). Inside the band it holds. A cap
    changes at most once per cooldown, except that a cut never waits for a raise's cooldown;
    a cut waits ``settle_seconds`` after the previous cut, and while live sessions still
    exceed the cap. Without signals the replica falls back to the floor, unquarantined.
    """
    if previous is None or previous.cap is None:
        previous = ReplicaControl(cap=initial_cap(params))
    current = _clamp(initial_cap(params) if previous.cap is None else previous.cap, params)
    if signals is None:  # blind: the floor
        return _without_signals(previous, held=current, most=params.floor, now=now)
    reason = pressure_reason(signals, params)
    if law_holds(weight_updates=signals.weight_updates, reason=reason):  # the re-prefill burst of a weight update
        return replace(previous, cap=current, quarantined=False, reason="WeightUpdate")
    if reason is not None:
        return _cut(previous=previous, current=current, signals=signals, reason=reason, params=params, now=now)
    return _raise(previous=previous, current=current, signals=signals, params=params, now=now)


def _raise(
    *, previous: ReplicaControl, current: int, signals: ReplicaSignals, params: LawParams, now: float
) -> ReplicaControl:
    """Without pressure: raise while the cap binds and KV usage is under the band, up to the learned limit."""
    keep = ReplicaControl(
        cap=current, changed_at=previous.changed_at, quarantined=False, reason=previous.reason,
        limit=previous.limit, limit_at=previous.limit_at,
    )  # fmt: skip
    usage = signals.kv_usage
    early = previous.limit is None and _jumps(current, signals, params)
    idle = previous.limit is None and (_evicts_idle(signals, params) or _rides_free(signals, params))
    cooldown = params.cooldown_seconds
    if early:
        cooldown = min(params.jump_cooldown_seconds, cooldown)
    if idle:
        cooldown = min(params.idle_eviction_cooldown_seconds, cooldown)
    cooled = previous.changed_at is None or now - previous.changed_at >= cooldown
    binding = (signals.live_sessions is None or signals.live_sessions >= current - params.binding_slack) and (
        signals.queued_sessions is None or signals.queued_sessions > 0
    )
    if usage is None or usage >= params.target_kv_usage - params.tolerance or not cooled or not binding:
        return keep
    step = params.increase_step
    limit = previous.limit
    climbing = limit is None or current + step < limit
    if climbing and not idle and _eviction_ratio(signals, params) >= params.warning_fraction:
        # live prefixes start to go, under the threshold: the cliff is near and its signal lags the cap by
        # minutes (sessions grow after admission), so stop climbing here and only probe from now on
        return replace(keep, limit=min(limit or current + step, current + step), limit_at=now, reason="Nearing")
    if limit is None:
        near = usage >= params.slow_start_near_usage
        factor = params.slow_start_near_factor if near else params.slow_start_factor
        if idle:
            factor = params.idle_eviction_factor
        raised = _clamp(max(current + step, math.floor(current * factor)), params)
        if signals.kv_cap is not None:  # contexts far shorter than the cap assumes: no need to climb
            raised = max(raised, _clamp(signals.kv_cap, params))
        reason_raise, limit_at = "Raised", previous.limit_at
    elif current + step < limit:
        raised = _clamp(min(current + step, limit - 1), params)
        reason_raise, limit_at = "Raised", previous.limit_at
    elif previous.limit_at is None or now - previous.limit_at >= params.probe_seconds:
        raised = _clamp(current + step, params)  # probe: the limit may have moved up
        limit = max(limit, raised)
        reason_raise, limit_at = "Probed", now
    else:
        return keep
    if raised <= current:
        return keep
    return ReplicaControl(
        cap=raised, changed_at=now, quarantined=False, reason=reason_raise, limit=limit, limit_at=limit_at
    )


def _evicts_idle(signals: ReplicaSignals, params: LawParams) -> bool:
    """Whether the replica evicts idle prefixes only: some re-prefill, under its threshold, no preemption, and the KV
    usage under ``idle_eviction_usage`` on average over the window (see there; an unknown signal is not idle). Not
    within a window that saw a weight update: a drained, flushed and reloaded engine reads empty, and the update's
    re-prefill is no eviction (the router's budget leaves those samples out alike)."""
    mean, reprefill, preemptions = signals.kv_usage_mean, signals.reprefill_tokens_per_s, signals.preemptions_per_s
    if mean is None or reprefill is None or preemptions is None or (signals.weight_updates or 0.0) > 0.0:
        return False
    below = reprefill < params.reprefill_tokens_per_s
    return mean < params.idle_eviction_usage and preemptions == 0.0 and reprefill > 0.0 and below


def _rides_free(signals: ReplicaSignals, params: LawParams) -> bool:
    """Whether the replica's eviction rides in steps that have room (:func:`_steps_have_room`) and nothing is
    preempted: the slow start climbs as for idle prefixes (unknown preemptions: no)."""
    return signals.preemptions_per_s == 0.0 and _steps_have_room(signals, params)


def _jumps(current: int, signals: ReplicaSignals, params: LawParams) -> bool:
    """Whether the slow start's jump to the measured floor may come early: the floor is past the slow start's own
    step, the cache under ``jump_usage`` and no eviction or preemption at all measured (unknown rates are not zero).
    The caller checks that no limit was learned (the slow start) and that the cap binds.
    """
    floor, usage = signals.kv_cap, signals.kv_usage
    if floor is None or usage is None or usage >= params.jump_usage:
        return False
    if floor <= max(current + params.increase_step, math.floor(current * params.slow_start_factor)):
        return False
    if signals.reprefill_tokens_per_s is None or signals.preemptions_per_s is None:
        return False
    return _eviction_ratio(signals, params) == 0.0


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
            False, "AutoscalingDisabled", "autoscaling is disabled; the routers admit by projected KV tokens"
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
