"""Publish which router pod owns each engine (the fleet of ``spec.router.replicas`` routers).

One call per reconcile pass: the pure :func:`rolloutpool.reconcile.assignment.assignment_patches`
decides, and each engine pod whose owner changes gets its ``rolloutpool.io/router`` annotation
patched. Router pods watch their pool's pods, so they see the change within a moment. The
assignment is published for any number of routers (a single router simply ignores it), so
scaling the router Deployment up finds it in place.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from rolloutpool.kube.children import list_children, patch_annotations
from rolloutpool.kube.port import KubePort
from rolloutpool.reconcile.assignment import ANNOTATION_ROUTER, assignment_patches
from rolloutpool.reconcile.labels import router_selector

__all__ = ["publish_assignment"]

_log = logging.getLogger(__name__)


async def publish_assignment(
    kube: KubePort,
    *,
    namespace: str,
    pool: str,
    engine_pods: Sequence[Mapping[str, Any]],
    router_pods: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, str]:
    """Patch the engine pods whose router changes; returns engine -> router of the patches made.

    ``router_pods`` may come from the pass's own observation; without them they are listed here.
    """
    if router_pods is None:
        router_pods = await asyncio.to_thread(list_children, kube, "Pod", namespace, router_selector(pool))
    patches = assignment_patches(engine_pods=engine_pods, router_pods=router_pods)
    done: dict[str, str] = {}
    for engine, router in sorted(patches.items()):
        if await asyncio.to_thread(patch_annotations, kube, "Pod", namespace, engine, {ANNOTATION_ROUTER: router}):
            done[engine] = router
    if done:
        _log.info(
            "Assigned engines to routers pool=%s/%s assignment=%s",
            namespace,
            pool,
            ",".join(f"{e}:{r}" for e, r in done.items()),
        )
    return done
