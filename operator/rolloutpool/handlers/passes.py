"""One reconcile pass of a RolloutPool: observe -> decide (pure ``reconcile.decide``) -> act.

Observe: the pool, its engine pods, its router Deployment and router pods, the routers' live
sessions and their own fast quarantines (``read_router_stats`` on the router pods' IPs) and,
when the slow loop is due (``metrics_url``), Prometheus. Decide: :func:`rolloutpool.reconcile.decide.decide`.
Act: apply the router objects, drain/delete/create engine pods, write the status through the
``/status`` subresource when it changed, post Events for what changed. Every Kubernetes call goes
through the context's :class:`~rolloutpool.kube.port.KubePort`, in a thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from rolloutpool.handlers.acting import act_engines, apply_router
from rolloutpool.handlers.context import OperatorContext, PoolMemory
from rolloutpool.handlers.control import read_metrics
from rolloutpool.handlers.fleet import publish_assignment
from rolloutpool.handlers.workers import PoolKey
from rolloutpool.kube.children import list_children, read_child
from rolloutpool.kube.status import patch_pool_status, read_pool
from rolloutpool.metrics.routerstats import RouterStats
from rolloutpool.reconcile.decide import (
    Observed,
    PassDecision,
    RouterView,
    decide,
    metrics_query,
    pool_gone,
    router_urls,
    status_wire,
)
from rolloutpool.reconcile.labels import engine_selector, router_name, router_selector

__all__ = ["observe", "reconcile_pool"]

_log = logging.getLogger(__name__)


async def observe(context: OperatorContext, memory: PoolMemory, pool: dict[str, Any], *, now: float) -> Observed:
    """Everything a pass decides from: children, router stats, and Prometheus when a step is due."""
    kube, clock = context.kube, time.monotonic()
    meta = pool.get("metadata") or {}
    namespace, name = str(meta["namespace"]), str(meta["name"])
    pods, deployment, router_pods = await asyncio.gather(
        asyncio.to_thread(list_children, kube, "Pod", namespace, engine_selector(name)),
        asyncio.to_thread(read_child, kube, "Deployment", namespace, router_name(name)),
        asyncio.to_thread(list_children, kube, "Pod", namespace, router_selector(name)),
    )
    urls = router_urls(router_pods)
    stats = await asyncio.to_thread(context.router_stats, urls) if urls else RouterStats({}, 0, 0)
    routers = RouterView(
        stats.live_sessions,
        stats.queued_sessions,
        stats.reachable,
        stats.quarantined,
        stats.reachable > 0 or not urls,
        stats.engine_warnings,
        stats.turns,
    )
    observed = Observed(pool, pods, deployment, routers, memory.recall(), context.settings, clock, None, router_pods)
    query = metrics_query(observed, now=now)
    if query is None:
        return observed
    read = await read_metrics(
        context.prometheus, query.url, namespace=namespace, replicas=query.replicas, window_seconds=query.window_seconds
    )
    return dataclasses.replace(observed, metrics=read)


async def reconcile_pool(context: OperatorContext, key: PoolKey) -> float | None:
    """One pass over one pool; returns seconds until the next periodic pass, None when the pool is gone."""
    namespace, name = key
    clock = time.monotonic()
    pool = await asyncio.to_thread(read_pool, context.kube, namespace, name)
    if pool is None or pool_gone(pool):
        return None
    memory = context.remember(key)
    now = time.time()
    observed = await observe(context, memory, pool, now=now)
    decision = decide(observed, now=now)
    await publish_assignment(  # which router pod places on which engine (a fleet of router replicas)
        context.kube, namespace=namespace, pool=name, engine_pods=observed.pods, router_pods=observed.router_pods
    )
    if decision.read_metrics:
        memory.keep_control(decision.control)
        health = decision.control.health
        if health is not None and not health.available:
            _log.info("Read no usable metrics pool=%s/%s reason=%s", namespace, name, health.reason)
    if decision.spec_error is not None:
        _log.warning("Rejected spec of RolloutPool pool=%s/%s error=%r", namespace, name, decision.spec_error)
    created: list[str] = []
    deleted: list[str] = []
    if decision.router:
        await apply_router(context.kube, decision.router, namespace=namespace, pool=name)
        memory.router_generation, memory.router_applied_at = decision.generation, time.monotonic()
    if decision.plan is not None:
        acted = await act_engines(
            context.kube,
            decision.plan,
            namespace=namespace,
            pool=name,
            pods=decision.pods,
            live_sessions=decision.live_sessions,
            now=now,
        )
        created, deleted = acted.created, acted.deleted
    if not await _write(context, pool, decision):
        return None
    acted_any = bool(created or deleted)
    log = _log.info if decision.busy(acted=acted_any) or decision.write_status or memory.passes == 0 else _log.debug
    memory.passes += 1
    status, plan = decision.status, decision.plan
    log(
        "Reconciled RolloutPool pool=%s/%s generation=%s replicas=%d ready=%d created=%d deleted=%d "
        "draining=%d duration_ms=%.0f",
        namespace,
        name,
        decision.generation,
        status.replicas,
        status.ready_replicas,
        len(created),
        len(deleted),
        len(plan.quarantine) if plan else 0,
        (time.monotonic() - clock) * 1000,
    )
    return decision.next_delay(acted=acted_any)


async def _write(context: OperatorContext, pool: dict[str, Any], decision: PassDecision) -> bool:
    """Write the status when it changed and post the Events the change deserves; False when the pool is gone."""
    meta = pool.get("metadata") or {}
    if decision.write_status:
        wire = status_wire(decision.status)
        written = await asyncio.to_thread(patch_pool_status, context.kube, meta["namespace"], meta["name"], wire)
        if not written:
            return False
    for type_, reason, message in decision.events:
        context.post_event(pool, type_, reason, message)
    return True
