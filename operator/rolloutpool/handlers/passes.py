"""One reconcile pass of a RolloutPool: observe -> decide (pure ``reconcile``) -> act.

Observe: the pool, its engine pods, its router Deployment and router pods, the routers'
live sessions and their own fast quarantines (``read_router_stats`` on the router pods' IPs)
and, when the slow loop is due, Prometheus. Decide: ``parse_spec``, ``router_objects``, ``desired_engine_pods``,
``plan_engines``, ``plan_controls``, ``build_status``, ``events_between`` — all pure.
Act: apply the router objects, drain/delete/create engine pods, write the status through
the ``/status`` subresource when it changed, post Events for what changed.

A spec the schema admits but the operator cannot serve changes nothing but the status:
``Ready=False`` with a reason naming the field.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from pydantic import ValidationError

from rolloutpool.api.status import RolloutPoolStatus
from rolloutpool.autoscale import MetricsHealth, ReplicaControl, ReplicaSignals, classify_health
from rolloutpool.handlers.acting import Acted, act_engines, apply_router
from rolloutpool.handlers.context import OperatorContext, PoolMemory
from rolloutpool.handlers.control import control_step
from rolloutpool.handlers.workers import PoolKey
from rolloutpool.kube.children import list_children, read_child
from rolloutpool.kube.status import patch_pool_status, read_pool
from rolloutpool.metrics.routerstats import RouterStats
from rolloutpool.reconcile.caps import controls_from_status, parse_spec
from rolloutpool.reconcile.children import desired_engine_pods, needs_update, router_objects
from rolloutpool.reconcile.engines import EnginePlan, is_ready, is_terminating, plan_engines
from rolloutpool.reconcile.labels import ROUTER_PORT, draining_from_pods, engine_selector, router_name, router_selector
from rolloutpool.reconcile.status import build_status, events_between

__all__ = ["health_from_status", "previous_status", "reconcile_pool", "router_urls", "status_wire", "unknown_sessions"]

_log = logging.getLogger(__name__)


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


async def _observe(
    context: OperatorContext, namespace: str, name: str
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, RouterStats, bool]:
    """Engine pods, the router Deployment, the routers' stats, and whether live sessions are known.

    Live sessions are known when a router answered, or when no router pod has an address (no
    router runs, so no session is placed). Router pods that exist but all fail to answer leave
    them unknown: a drain then waits for its timeout rather than cut live sessions.
    """
    api = context.api
    pods, deployment, router_pods = await asyncio.gather(
        asyncio.to_thread(list_children, api, "Pod", namespace, engine_selector(name)),
        asyncio.to_thread(read_child, api, "Deployment", namespace, router_name(name)),
        asyncio.to_thread(list_children, api, "Pod", namespace, router_selector(name)),
    )
    urls = router_urls(router_pods)
    stats = await asyncio.to_thread(context.router_stats, urls) if urls else RouterStats({}, 0, 0)
    return pods, deployment, stats, stats.reachable > 0 or not urls


async def _sync_router(
    context: OperatorContext,
    memory: PoolMemory,
    *,
    objects: Sequence[dict[str, Any]],
    deployment: dict[str, Any] | None,
    generation: int | None,
    namespace: str,
    pool: str,
) -> None:
    """Apply the router objects when the spec changed, the Deployment drifted, or a resync is due."""
    desired = next(o for o in objects if o["kind"] == "Deployment")
    drifted = deployment is None or needs_update(observed=deployment, desired=desired)
    stale = time.monotonic() - memory.router_applied_at >= context.router_resync_seconds
    if drifted or stale or memory.router_generation != generation:
        await apply_router(context.api, objects, namespace=namespace, pool=pool)
        memory.router_generation, memory.router_applied_at = generation, time.monotonic()


async def reconcile_pool(context: OperatorContext, key: PoolKey) -> float | None:
    """One pass over one pool; returns seconds until the next periodic pass, None when the pool is gone."""
    namespace, name = key
    clock = time.monotonic()
    pool = await asyncio.to_thread(read_pool, context.api, namespace, name)
    if pool is None or (pool.get("metadata") or {}).get("deletionTimestamp"):
        return None
    memory = context.remember(key)
    now = time.time()
    generation = (pool.get("metadata") or {}).get("generation")
    previous = previous_status(pool)
    spec, error = parse_spec(pool=pool)
    pods, deployment, stats, known = await _observe(context, namespace, name)
    live = dict(stats.live_sessions)
    draining = draining_from_pods(pods)
    plan: EnginePlan | None = None
    acted = Acted()
    controls: Mapping[str, ReplicaControl]
    signals: Mapping[str, ReplicaSignals | None] = {}
    next_in: float | None = None
    if spec is not None and error is None:
        try:
            objects = router_objects(pool=pool, spec=spec, default_image=context.image)
            desired = desired_engine_pods(pool=pool, spec=spec, default_image=context.image)
            plan = plan_engines(
                spec=spec,
                desired=desired,
                observed=pods,
                live_sessions=live if known else unknown_sessions(pods),
                draining=draining,
                now=now,
                drain_timeout_seconds=float(spec.update_strategy.drain_timeout_seconds),
            )
            replicas = sorted(str(p["metadata"]["name"]) for p in pods if not is_terminating(p))
            step = await control_step(
                context.prometheus,
                memory,
                namespace=namespace,
                pool=name,
                spec=spec,
                replicas=replicas,
                previous=previous,
                now=now,
                clock=time.monotonic(),
                queued_sessions=stats.queued_sessions if known else None,
            )
        except ValueError as exc:  # the spec cannot be served after all: report, change nothing
            error, plan = str(exc), None
        else:
            await _sync_router(
                context,
                memory,
                objects=objects,
                deployment=deployment,
                generation=generation,
                namespace=namespace,
                pool=name,
            )
            by_name = {str(p["metadata"]["name"]): p for p in pods}
            acted = await act_engines(
                context.api, plan, namespace=namespace, pool=name, pods=by_name, live_sessions=live, now=now
            )
            controls, health, signals, next_in = step.controls, step.health, step.signals, step.next_in
    if error is not None:
        _log.warning("Rejected spec of RolloutPool pool=%s/%s error=%r", namespace, name, error)
        controls, health = controls_from_status(previous), memory.health or health_from_status(previous)
    status = build_status(
        pool=pool,
        spec=spec,
        spec_error=error,
        pods=pods,
        live_sessions=live,
        queued_sessions=stats.queued_sessions,
        controls=controls,
        health=health,
        draining=draining,
        previous=previous,
        now=datetime.fromtimestamp(now, tz=UTC),
        signals=signals,
        plan=plan,
        router_deployment=deployment,
        router_quarantined=stats.quarantined if stats.reachable else None,
        engine_warnings=stats.engine_warnings,
    )
    if not await _write(context, pool, previous, status, error):
        return None
    took = (time.monotonic() - clock) * 1000
    busy = bool(acted.created or acted.deleted or (plan and (plan.start_drain or plan.end_drain or plan.waiting)))
    changed = status_wire(status) != (status_wire(previous) if previous else None)
    log = _log.info if busy or changed or memory.passes == 0 else _log.debug
    memory.passes += 1
    log(
        "Reconciled RolloutPool pool=%s/%s generation=%s replicas=%d ready=%d created=%d deleted=%d "
        "draining=%d duration_ms=%.0f",
        namespace,
        name,
        generation,
        status.replicas,
        status.ready_replicas,
        len(acted.created),
        len(acted.deleted),
        len(plan.quarantine) if plan else 0,
        took,
    )
    delays = [context.busy_interval if busy else context.status_interval]
    if any(not is_ready(p) for p in pods) or bool(plan and plan.missing):  # starting: look again soon
        delays.append(max(context.busy_interval, context.status_interval / 2))
    delays += [d for d in (next_in, plan.recheck_seconds if plan else None) if d is not None]
    return max(0.1, min(delays))


async def _write(
    context: OperatorContext,
    pool: dict[str, Any],
    previous: RolloutPoolStatus | None,
    status: RolloutPoolStatus,
    error: str | None,
) -> bool:
    """Write the status when it changed and post the Events the change deserves; False when the pool is gone."""
    meta = pool.get("metadata") or {}
    wire = status_wire(status)
    if previous is None or wire != status_wire(previous):
        written = await asyncio.to_thread(patch_pool_status, context.api, meta["namespace"], meta["name"], wire)
        if not written:
            return False
    events = [(e.type, e.reason, e.message) for e in events_between(previous, status)]
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    was = next((c for c in previous.conditions if c.type == "Ready"), None) if previous else None
    if error is not None and ready is not None and (was is None or was.reason != ready.reason):
        events.append(("Warning", ready.reason, error))
    for type_, reason, message in events:
        kopf.event(kopf.Body(cast(kopf.RawBody, pool)), type=type_, reason=reason, message=message)
    return True
