"""One reconcile pass's decision from what the pass observed: ``decide(observed, now=...)`` (pure).

The handlers observe (the pool, its engine pods, the router Deployment, the routers' stats and,
when :func:`metrics_query` says a step is due, Prometheus), call :func:`decide`, then act on the
:class:`PassDecision` (apply the router objects, carry out the engine plan, write the status,
post the events, keep the memo, sleep :meth:`PassDecision.next_delay`). Every choice of a pass
is made here: the spec check, the router objects and whether they are due (spec changed, the
Deployment drifted, a resync), the engine plan, the slow loop's caps, the status, the Events
and the requeue delay.

A spec the schema admits but the operator cannot serve changes nothing but the status:
``Ready=False`` with a reason naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from rolloutpool.api.pods import is_ready, is_terminating
from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.api.status import ReplicaTurns, RolloutPoolStatus
from rolloutpool.autoscale import MetricsHealth, ReplicaControl, ReplicaSignals, classify_health
from rolloutpool.reconcile.caps import controls_from_status, parse_spec
from rolloutpool.reconcile.children import desired_engine_pods, needs_update, router_objects
from rolloutpool.reconcile.control import (
    ControlMemo,
    MetricsRead,
    engine_time,
    metrics_due,
    remember_read,
    spec_time_scale,
    spec_window_seconds,
    step_controls,
)
from rolloutpool.reconcile.engines import EnginePlan, plan_engines
from rolloutpool.reconcile.labels import ROUTER_PORT, draining_from_pods
from rolloutpool.reconcile.status import build_status, events_between

__all__ = [
    "MetricsQuery",
    "Observed",
    "PassDecision",
    "PassSettings",
    "Recall",
    "RouterView",
    "decide",
    "health_from_status",
    "metrics_query",
    "pool_gone",
    "previous_status",
    "router_urls",
    "status_wire",
    "unknown_sessions",
]

Event = tuple[str, str, str]
"""(type, reason, message) of one Kubernetes Event on the pool."""


@dataclass(frozen=True)
class RouterView:
    """What the pool's routers said (their stats summed), and whether live sessions are known.

    Known when a router answered, or when no router pod has an address (no router runs, so no
    session is placed). Router pods that exist but all fail to answer leave them unknown: a drain
    then waits for its timeout rather than cut live sessions.
    """

    live_sessions: Mapping[str, int] = field(default_factory=dict)
    queued_sessions: int = 0
    reachable: int = 0
    quarantined: Mapping[str, str] = field(default_factory=dict)
    known: bool = True
    engine_warnings: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """What replicas' engines do not report (``NoCachedTokens``, ``PrefixCachingOff``), by replica."""
    turns: Mapping[str, ReplicaTurns] = field(default_factory=dict)
    """Held turns, kept and let-go prefixes and moves, by replica (summed over the answering routers)."""


@dataclass(frozen=True)
class PassSettings:
    """The operator's knobs that shape a pass."""

    image: str
    status_interval: float = 5.0
    """Seconds between two status refreshes of a pool at rest."""
    busy_interval: float = 1.0
    """Seconds between two passes while replicas are created, drained or replaced."""
    router_resync_seconds: float = 60.0
    """How often router objects are re-checked when nothing about them changed."""


@dataclass(frozen=True)
class Recall:
    """What this operator process remembers of the pool (nothing that must survive a restart)."""

    router_generation: int | None = None
    """Generation whose router objects were last applied (None: apply them on the next pass)."""
    router_applied_at: float = 0.0
    """Monotonic time of the last router apply."""
    control: ControlMemo = field(default_factory=ControlMemo)


@dataclass(frozen=True)
class Observed:
    """Everything one pass read; ``clock`` is monotonic time when it began."""

    pool: Mapping[str, Any]
    pods: Sequence[Mapping[str, Any]]
    deployment: Mapping[str, Any] | None
    routers: RouterView
    recall: Recall
    settings: PassSettings
    clock: float
    metrics: MetricsRead | None = None
    """The Prometheus read of this pass (made when :func:`metrics_query` asked for one)."""
    router_pods: Sequence[Mapping[str, Any]] = ()
    """The pool's router pods (their addresses gave ``routers``)."""


@dataclass(frozen=True)
class PassDecision:
    """What the pass does, in the order the handlers act."""

    status: RolloutPoolStatus
    write_status: bool
    """Whether the status differs from the pool's (only then it is written)."""
    events: tuple[Event, ...]
    """Posted after the status write (none when the pool turned out to be gone)."""
    router: tuple[dict[str, Any], ...]
    """Router objects to apply now, in order; empty when none is due."""
    plan: EnginePlan | None
    """The engine plan; None when the spec cannot be served."""
    spec_error: str | None
    control: ControlMemo
    """The slow loop's memo to keep (a read in this pass updated it)."""
    read_metrics: bool
    generation: int | None
    live_sessions: Mapping[str, int]
    pods: Mapping[str, Mapping[str, Any]]
    """Observed engine pods by name (deletes carry their uid)."""
    starting: bool
    """A pod is not ready or a wanted one is missing: look again soon."""
    next_in: float | None
    """Seconds until the slow loop's next step."""
    settings: PassSettings

    def busy(self, *, acted: bool) -> bool:
        """Whether replicas are being created, drained or replaced (``acted``: the pass created or deleted one)."""
        plan = self.plan
        return acted or bool(plan and (plan.start_drain or plan.end_drain or plan.waiting))

    def next_delay(self, *, acted: bool) -> float:
        """Seconds until the next periodic pass (pure)."""
        settings = self.settings
        delays = [settings.busy_interval if self.busy(acted=acted) else settings.status_interval]
        if self.starting:
            delays.append(max(settings.busy_interval, settings.status_interval / 2))
        recheck = self.plan.recheck_seconds if self.plan else None
        delays += [d for d in (self.next_in, recheck) if d is not None]
        return max(0.1, min(delays))


def pool_gone(pool: Mapping[str, Any] | None) -> bool:
    """Whether the pool is gone or being deleted: the pass stops (pure)."""
    return pool is None or bool((pool.get("metadata") or {}).get("deletionTimestamp"))


def previous_status(pool: Mapping[str, Any]) -> RolloutPoolStatus | None:
    """The status the pool carries, or None when it has none or it does not parse (pure)."""
    raw = pool.get("status")
    if not raw:
        return None
    try:
        return RolloutPoolStatus.model_validate(raw)
    except ValidationError:
        return None


def status_wire(status: RolloutPoolStatus) -> dict[str, Any]:
    """A status in its wire form, as written to and compared with the API server's copy (pure)."""
    wire: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    return wire


def health_from_status(previous: RolloutPoolStatus | None) -> MetricsHealth:
    """``MetricsAvailable`` as the status last recorded it (kept while the spec is invalid) (pure)."""
    for condition in previous.conditions if previous else []:
        if condition.type == "MetricsAvailable":
            return MetricsHealth(condition.status == "True", condition.reason, condition.message)  # type: ignore[arg-type]
    return classify_health(enabled=False, reachable=False, signals={}, now=0.0, stale_after_seconds=0.0)


def unknown_sessions(pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Live sessions to plan with when no router answered: one on every pod, so no drain ends early (pure)."""
    return {str(p["metadata"]["name"]): 1 for p in pods}


def router_urls(router_pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Base URLs of the router pods that have an IP and are not being deleted (pure)."""
    urls = []
    for pod in router_pods:
        ip = (pod.get("status") or {}).get("podIP")
        if ip and not is_terminating(pod):
            host = f"[{ip}]" if ":" in ip else ip
            urls.append(f"http://{host}:{ROUTER_PORT}")
    return sorted(urls)


@dataclass(frozen=True)
class _Planned:
    spec: RolloutPoolSpec | None
    error: str | None
    objects: list[dict[str, Any]] = field(default_factory=list)
    plan: EnginePlan | None = None
    replicas: list[str] = field(default_factory=list)


def _plan(observed: Observed, now: float) -> _Planned:
    """The spec check, the router objects and the engine plan; a ``ValueError`` becomes the spec error."""
    pool, pods, routers = observed.pool, observed.pods, observed.routers
    spec, error = parse_spec(pool=pool)
    if spec is None or error is not None:
        return _Planned(spec, error)
    try:
        objects = router_objects(pool=pool, spec=spec, default_image=observed.settings.image)
        desired = desired_engine_pods(pool=pool, spec=spec, default_image=observed.settings.image)
        plan = plan_engines(
            spec=spec,
            desired=desired,
            observed=pods,
            live_sessions=routers.live_sessions if routers.known else unknown_sessions(pods),
            draining=draining_from_pods(pods),
            now=now,
            drain_timeout_seconds=float(spec.update_strategy.drain_timeout_seconds),
        )
    except ValueError as exc:  # the spec cannot be served after all: report, change nothing
        return _Planned(spec, str(exc))
    replicas = sorted(str(p["metadata"]["name"]) for p in pods if not is_terminating(p))
    return _Planned(spec, None, objects, plan, replicas)


@dataclass(frozen=True)
class MetricsQuery:
    """The Prometheus read a pass must make before :func:`decide`."""

    url: str
    replicas: tuple[str, ...]
    window_seconds: float
    """The rate window of its queries (:func:`~rolloutpool.reconcile.control.spec_window_seconds`)."""


def metrics_query(observed: Observed, *, now: float) -> MetricsQuery | None:
    """What to read from Prometheus in this pass, or None when no slow-loop step is due (pure)."""
    planned = _plan(observed, now)
    if planned.spec is None or planned.error is not None:
        return None
    url = metrics_due(spec=planned.spec, replicas=planned.replicas, memo=observed.recall.control, clock=observed.clock)
    if url is None:
        return None
    return MetricsQuery(url, tuple(planned.replicas), spec_window_seconds(planned.spec))


def _router_due(observed: Observed, objects: Sequence[dict[str, Any]], generation: int | None) -> bool:
    """Apply the router objects when the spec changed, the Deployment drifted, or a resync is due."""
    desired = next(o for o in objects if o["kind"] == "Deployment")
    deployment = observed.deployment
    drifted = deployment is None or needs_update(observed=deployment, desired=desired)
    stale = observed.clock - observed.recall.router_applied_at >= observed.settings.router_resync_seconds
    return drifted or stale or observed.recall.router_generation != generation


def decide(observed: Observed, *, now: float) -> PassDecision:
    """The pass's decision (``now``: wall time; the pool must not be :func:`pool_gone`) (pure)."""
    pool, pods, routers = observed.pool, observed.pods, observed.routers
    generation = (pool.get("metadata") or {}).get("generation")
    previous = previous_status(pool)
    planned = _plan(observed, now)
    spec, error, plan = planned.spec, planned.error, planned.plan
    memo, read = observed.recall.control, False
    controls: Mapping[str, ReplicaControl] = {}
    signals: Mapping[str, ReplicaSignals | None] = {}
    health: MetricsHealth | None = None
    next_in: float | None = None
    router: tuple[dict[str, Any], ...] = ()
    if spec is not None and error is None:
        if metrics_due(spec=spec, replicas=planned.replicas, memo=memo, clock=observed.clock) is not None:
            queued = routers.queued_sessions if routers.known else None
            got = engine_time(
                observed.metrics or MetricsRead(error="metrics were not read"), time_scale=spec_time_scale(spec)
            )
            memo, read = remember_read(spec=spec, read=got, now=now, clock=observed.clock, queued_sessions=queued), True
        try:
            step = step_controls(
                spec=spec,
                replicas=planned.replicas,
                previous=previous,
                memo=memo,
                stepped=read,
                now=now,
                clock=observed.clock,
            )
        except ValueError as exc:  # the spec cannot be served after all: report, change nothing
            error, plan = str(exc), None
        else:
            controls, health, signals, next_in = step.controls, step.health, step.signals, step.next_in
            if _router_due(observed, planned.objects, generation):
                router = tuple(planned.objects)
    if error is not None or health is None:
        controls, health = controls_from_status(previous), memo.health or health_from_status(previous)
    status = build_status(
        pool=pool,
        spec=spec,
        spec_error=error,
        pods=pods,
        live_sessions=dict(routers.live_sessions),
        queued_sessions=routers.queued_sessions,
        controls=controls,
        health=health,
        draining=draining_from_pods(pods),
        previous=previous,
        now=datetime.fromtimestamp(now, tz=UTC),
        signals=signals,
        plan=plan,
        router_deployment=observed.deployment,
        router_quarantined=routers.quarantined if routers.reachable else None,
        engine_warnings=routers.engine_warnings,
        turns=routers.turns,
    )
    return PassDecision(
        status=status,
        write_status=previous is None or status_wire(status) != status_wire(previous),
        events=_events(previous, status, error),
        router=router,
        plan=plan,
        spec_error=error,
        control=memo,
        read_metrics=read,
        generation=generation if isinstance(generation, int) else None,
        live_sessions=dict(routers.live_sessions),
        pods={str(p["metadata"]["name"]): p for p in pods},
        starting=any(not is_ready(p) for p in pods) or bool(plan and plan.missing),
        next_in=next_in,
        settings=observed.settings,
    )


def _events(previous: RolloutPoolStatus | None, status: RolloutPoolStatus, error: str | None) -> tuple[Event, ...]:
    """The Events a status change deserves, and a Warning naming a newly rejected spec."""
    events = [(e.type, e.reason, e.message) for e in events_between(previous, status)]
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    was = next((c for c in previous.conditions if c.type == "Ready"), None) if previous else None
    if error is not None and ready is not None and (was is None or was.reason != ready.reason):
        events.append(("Warning", ready.reason, error))
    return tuple(events)
