"""The "act" step of a pass: apply the router objects and carry out an engine plan.

Every Kubernetes call is synchronous and runs in a thread (``asyncio.to_thread``). Each
action is idempotent, so a pass interrupted half-way (operator restart) is completed by
the next one: drain start times live in a pod annotation, creations tolerate a 409,
deletions carry the observed uid.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rolloutpool.kube.children import Child, apply_child, create_once, delete_child, patch_annotations
from rolloutpool.kube.port import KubePort
from rolloutpool.reconcile.children import ADMIN_TOKEN_KEY, needs_update
from rolloutpool.reconcile.engines import EnginePlan
from rolloutpool.reconcile.labels import ANNOTATION_DRAIN_STARTED

__all__ = ["Acted", "act_engines", "apply_router"]

_log = logging.getLogger(__name__)


@dataclass
class Acted:
    """What a pass changed, for its log line (the pool's Events come from the status change)."""

    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


def _needs_update(observed: dict[str, Any], desired: dict[str, Any]) -> bool:
    return needs_update(observed=observed, desired=desired)


async def apply_router(kube: KubePort, objects: Sequence[dict[str, Any]], *, namespace: str, pool: str) -> list[Child]:
    """Create the router's admin-token Secret once; create or patch its ServiceAccount, Role, RoleBinding,
    Service and Deployment, in order."""
    done: list[Child] = []
    for desired in objects:
        if desired["kind"] == "Secret":  # created once with a fresh token; never read, never patched
            token = {ADMIN_TOKEN_KEY: secrets.token_urlsafe(32)}
            child = await asyncio.to_thread(create_once, kube, {**desired, "stringData": token})
        else:
            child = await asyncio.to_thread(apply_child, kube, desired, needs_update=_needs_update)
        if child.outcome != "unchanged":
            _log.info("%s %s pool=%s/%s kind=%s", child.outcome.capitalize(), child.name, namespace, pool, child.kind)
        done.append(child)
    return done


async def act_engines(
    kube: KubePort,
    plan: EnginePlan,
    *,
    namespace: str,
    pool: str,
    pods: Mapping[str, Mapping[str, Any]],
    live_sessions: Mapping[str, int],
    now: float,
) -> Acted:
    """Carry out an engine plan: record drain starts and ends, delete, then create."""
    acted = Acted()
    for name in plan.start_drain:
        reason = plan.reasons.get(name, "ScaleDown")
        await asyncio.to_thread(
            patch_annotations, kube, "Pod", namespace, name, {ANNOTATION_DRAIN_STARTED: f"{now:.3f}"}
        )
        live = live_sessions.get(name, 0)
        _log.info("Started drain of %s pool=%s/%s reason=%s live_sessions=%d", name, namespace, pool, reason, live)
    for end in plan.end_drain:
        if end.reason == "Cancelled":
            await asyncio.to_thread(
                patch_annotations, kube, "Pod", namespace, end.name, {ANNOTATION_DRAIN_STARTED: None}
            )
        live = live_sessions.get(end.name, 0)
        _log.info(
            "Ended drain of %s pool=%s/%s reason=%s live_sessions=%d", end.name, namespace, pool, end.reason, live
        )
    for name in plan.delete:
        uid = (pods.get(name, {}).get("metadata") or {}).get("uid")
        if await asyncio.to_thread(delete_child, kube, "Pod", namespace, name, uid=uid):
            acted.deleted.append(name)
            _log.info("Deleted %s pool=%s/%s reason=%s", name, namespace, pool, plan.reasons.get(name, "Unknown"))
    created = await asyncio.gather(
        *(asyncio.to_thread(apply_child, kube, manifest, needs_update=_needs_update) for manifest in plan.create)
    )  # side by side: a pool's pods are independent, and each create is one round trip
    for child in created:
        if child.outcome == "created":
            acted.created.append(child.name)
            _log.info("Created %s pool=%s/%s kind=Pod", child.name, namespace, pool)
    return acted
