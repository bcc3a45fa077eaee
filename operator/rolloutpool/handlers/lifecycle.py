"""kopf registrations: startup settings and clients, cleanup, and the watch events that poke workers.

Every handler here is a few lines: the work happens in the pool's worker
(:mod:`rolloutpool.handlers.workers`), which runs :func:`rolloutpool.handlers.passes.reconcile_pool`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

import kopf

from rolloutpool.api.status import API_GROUP, PLURAL
from rolloutpool.handlers.context import OperatorContext
from rolloutpool.handlers.passes import reconcile_pool
from rolloutpool.handlers.workers import PoolKey, PoolWorkers
from rolloutpool.kube.client import KubeClient
from rolloutpool.kube.pods import api_client
from rolloutpool.metrics.prom import PrometheusSignals
from rolloutpool.metrics.routerstats import RouterStats, read_router_stats
from rolloutpool.reconcile.labels import DEFAULT_IMAGE, IMAGE_ENV, LABEL_MANAGED_BY, LABEL_POOL, MANAGED_BY

__all__ = ["PrometheusReaders", "cleanup", "on_child_event", "on_pool_event", "on_router_object_event", "startup"]

_log = logging.getLogger(__name__)
_CHILD_LABELS: dict[str, Any] = {LABEL_POOL: kopf.PRESENT, LABEL_MANAGED_BY: MANAGED_BY}


class PrometheusReaders:
    """One :class:`PrometheusSignals` per Prometheus URL, reused across passes, closed at cleanup."""

    def __init__(self, *, timeout_seconds: float = 5.0) -> None:
        self.timeout_seconds = timeout_seconds
        self._readers: dict[str, PrometheusSignals] = {}

    def __call__(self, url: str) -> PrometheusSignals:
        reader = self._readers.get(url)
        if reader is None:
            reader = self._readers[url] = PrometheusSignals(url, timeout_seconds=self.timeout_seconds)
        return reader

    def close(self) -> None:
        """Close every reader's HTTP session."""
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()


def _router_stats(urls: Sequence[str]) -> RouterStats:
    return read_router_stats(urls, timeout_seconds=2.0)


def _post_event(pool: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    kopf.event(kopf.Body(cast(kopf.RawBody, pool)), type=type_, reason=reason, message=message)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Set kopf's settings and put the clients and the pool workers in ``memo``."""
    # no kopf state in the object: event handlers keep none, and the status schema would prune it
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="rolloutpool.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="rolloutpool.io", key="last-handled-configuration"
    )
    settings.persistence.finalizer = "rolloutpool.io/operator"  # unused: no handler needs a finalizer
    settings.posting.level = logging.INFO  # only our kopf.event() calls post Events (posting.loggers is off)
    # fixed resources (our CRD is installed first) and exact namespaces: no cluster-wide list/watch of
    # namespaces and CRDs, so the operator needs no RBAC beyond the agreed least-privilege rules
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300  # the API server ends each watch after 5 min; kopf re-lists
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    kubeconfig = memo.get("kubeconfig") or os.environ.get("KUBECONFIG")
    api = await asyncio.to_thread(api_client, kubeconfig)
    context: OperatorContext | None = None

    async def run_pass(key: PoolKey) -> float | None:
        assert context is not None  # noqa: S101 - set below, before any poke
        return await reconcile_pool(context, key)

    context = OperatorContext(
        kube=KubeClient(api),
        prometheus=PrometheusReaders(),
        router_stats=_router_stats,
        workers=PoolWorkers(run_pass),
        image=os.environ.get(IMAGE_ENV, DEFAULT_IMAGE),
        post_event=_post_event,
        status_interval=float(memo.get("status_interval") or 5.0),
    )
    memo.context = context
    _log.info("Started operator kubeconfig=%s image=%s", kubeconfig or "<in-cluster>", context.image)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the workers, then close the clients."""
    context: OperatorContext | None = memo.get("context")
    if context is None:
        return
    await context.workers.close()
    prometheus = context.prometheus
    if isinstance(prometheus, PrometheusReaders):
        await asyncio.to_thread(prometheus.close)
    await asyncio.to_thread(context.kube.close)
    _log.info("Stopped operator pools=%d", len(context.memory))


@kopf.on.event(API_GROUP, PLURAL)
async def on_pool_event(
    type: str, name: str, namespace: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """A pool appeared, changed or went: start, poke or stop its worker.

    The operator's own status writes also arrive here; they poke nobody (same generation).
    """
    context: OperatorContext = memo.context
    key = (namespace or "", name)
    if type == "DELETED":
        context.workers.forget(key)
        context.memory.pop(key, None)
        return
    generation = body.get("metadata", {}).get("generation")
    memory = context.remember(key)
    if key not in context.workers or generation != memory.seen_generation:
        memory.seen_generation = generation
        context.workers.poke(key)


@kopf.on.event("pods", labels=_CHILD_LABELS)
@kopf.on.event("apps", "deployments", labels=_CHILD_LABELS)
async def on_child_event(labels: kopf.Labels, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A child changed (pod ready, deleted, failed; router Deployment edited): reconcile its pool soon."""
    context: OperatorContext = memo.context
    key = (namespace or "", str(labels[LABEL_POOL]))
    if key in context.workers:  # a child whose pool is gone starts no worker (the GC collects it)
        context.workers.poke(key)


@kopf.on.event("services", labels=_CHILD_LABELS)
@kopf.on.event("serviceaccounts", labels=_CHILD_LABELS)
@kopf.on.event("rbac.authorization.k8s.io", "roles", labels=_CHILD_LABELS)
@kopf.on.event("rbac.authorization.k8s.io", "rolebindings", labels=_CHILD_LABELS)
async def on_router_object_event(labels: kopf.Labels, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A router Service, ServiceAccount, Role or RoleBinding was edited or deleted: re-apply them all soon.

    (The Deployment is compared on every pass already; these are re-applied only on an event or once a minute.)
    """
    context: OperatorContext = memo.context
    key = (namespace or "", str(labels[LABEL_POOL]))
    if key in context.workers:
        context.remember(key).router_generation = None  # the next pass applies the router objects
        context.workers.poke(key)
