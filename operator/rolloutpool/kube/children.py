"""Create, read, update and delete the children of a RolloutPool (I/O, synchronous).

The operator's only writer of pods, Services, ServiceAccounts, Deployments, Roles and
RoleBindings. Objects travel as plain dicts in their wire form (camelCase), the same
shape the pure builders of :mod:`rolloutpool.reconcile` return. Every call here is a
blocking call of a :class:`~rolloutpool.kube.port.KubePort`: the handlers run them with
``asyncio.to_thread``.

Creation is "create, then compare": a 409 reads the existing object and hands
``(observed, desired)`` to the caller's ``needs_update``; only a difference is patched
(JSON merge patch: lists in the desired object replace the observed ones, fields the
API server defaulted stay). Deletes carry the observed uid as a precondition, so a pod
recreated under the same name in between is never deleted by mistake.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from rolloutpool.kube.port import CONFLICT, NOT_FOUND, KubeError, KubePort

__all__ = [
    "ApplyOutcome",
    "Child",
    "apply_child",
    "create_once",
    "delete_child",
    "list_children",
    "patch_annotations",
    "read_child",
]

ApplyOutcome = Literal["created", "updated", "unchanged"]


@dataclass(frozen=True)
class Child:
    """What an apply did to one object, for logs and events."""

    kind: str
    name: str
    outcome: ApplyOutcome


def read_child(kube: KubePort, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object as the API server has it, or None when it does not exist."""
    try:
        return kube.get(kind, namespace, name)
    except KubeError as exc:
        if exc.status == NOT_FOUND:
            return None
        raise


def list_children(kube: KubePort, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The objects of one kind matching a label selector, in wire form."""
    return kube.list(kind, namespace, label_selector=selector).items


def apply_child(
    kube: KubePort,
    desired: dict[str, Any],
    *,
    needs_update: Callable[[dict[str, Any], dict[str, Any]], bool],
    observed: dict[str, Any] | None = None,
) -> Child:
    """Make one object match ``desired``: create it, or patch it when ``needs_update`` says so.

    ``observed`` saves a read when the caller listed the object already. Idempotent:
    running it twice changes nothing the second time. Pods are only created here (their
    spec is immutable); replacing a pod is the caller's delete-then-create.
    """
    kind = str(desired["kind"])
    meta = desired["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    if observed is None:
        try:
            kube.create(desired)
            return Child(kind, name, "created")
        except KubeError as exc:
            if exc.status != CONFLICT:
                raise
        observed = read_child(kube, kind, namespace, name)
        if observed is None:  # deleted between our create and read: the next pass creates it
            return Child(kind, name, "unchanged")
    if kind == "Pod" or not needs_update(observed, desired):
        return Child(kind, name, "unchanged")
    kube.patch(kind, namespace, name, desired)  # a 404 here (deleted after our read) fails the pass: retried
    return Child(kind, name, "updated")


def create_once(kube: KubePort, desired: dict[str, Any]) -> Child:
    """Create an object unless it exists; an existing one is never read nor changed (a Secret: create-only RBAC)."""
    meta = desired["metadata"]
    try:
        kube.create(desired)
    except KubeError as exc:
        if exc.status != CONFLICT:
            raise
        return Child(str(desired["kind"]), str(meta["name"]), "unchanged")
    return Child(str(desired["kind"]), str(meta["name"]), "created")


def delete_child(kube: KubePort, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
    """Delete one object (background propagation); False when it was already gone or replaced.

    With ``uid`` the API server deletes only that incarnation of the object (a
    precondition): a 409 means someone recreated it meanwhile, and it is left alone.
    """
    try:
        kube.delete(kind, namespace, name, uid=uid)
    except KubeError as exc:
        if exc.status in {NOT_FOUND, CONFLICT}:
            return False
        raise
    return True


def patch_annotations(kube: KubePort, kind: str, namespace: str, name: str, annotations: dict[str, str | None]) -> bool:
    """Set (or, with None, remove) annotations of one object; False when it is gone."""
    try:
        kube.patch(kind, namespace, name, {"metadata": {"annotations": annotations}})
    except KubeError as exc:
        if exc.status == NOT_FOUND:
            return False
        raise
    return True
