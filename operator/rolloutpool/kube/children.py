"""Create, read, update and delete the children of a RolloutPool (I/O, synchronous).

The operator's only writer of pods, Services, ServiceAccounts, Deployments, Roles and
RoleBindings. Objects travel as plain dicts in their wire form (camelCase), the same
shape the pure builders of :mod:`rolloutpool.reconcile` return. Every call here is a
blocking HTTP request: the handlers run them with ``asyncio.to_thread``.

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

from kubernetes import client
from kubernetes.client.exceptions import ApiException

__all__ = [
    "KINDS",
    "ApplyOutcome",
    "Child",
    "apply_child",
    "delete_child",
    "list_children",
    "patch_annotations",
    "read_child",
]

MERGE_PATCH = "application/merge-patch+json"

ApplyOutcome = Literal["created", "updated", "unchanged"]


@dataclass(frozen=True)
class _Kind:
    """Where one kind lives in the typed client: its API class and the suffix of its methods."""

    api: Callable[[client.ApiClient], Any]
    suffix: str


KINDS: dict[str, _Kind] = {
    "Pod": _Kind(client.CoreV1Api, "namespaced_pod"),
    "Service": _Kind(client.CoreV1Api, "namespaced_service"),
    "ServiceAccount": _Kind(client.CoreV1Api, "namespaced_service_account"),
    "Deployment": _Kind(client.AppsV1Api, "namespaced_deployment"),
    "Role": _Kind(client.RbacAuthorizationV1Api, "namespaced_role"),
    "RoleBinding": _Kind(client.RbacAuthorizationV1Api, "namespaced_role_binding"),
}


@dataclass(frozen=True)
class Child:
    """What an apply did to one object, for logs and events."""

    kind: str
    name: str
    outcome: ApplyOutcome


def _method(api: client.ApiClient, kind: str, verb: str) -> Callable[..., Any]:
    entry = KINDS[kind]
    method: Callable[..., Any] = getattr(entry.api(api), f"{verb}_{entry.suffix}")
    return method


def _plain(api: client.ApiClient, obj: Any) -> dict[str, Any]:
    data: dict[str, Any] = obj if isinstance(obj, dict) else api.sanitize_for_serialization(obj)
    return data


def read_child(api: client.ApiClient, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object as the API server has it, or None when it does not exist."""
    try:
        return _plain(api, _method(api, kind, "read")(name, namespace))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def list_children(api: client.ApiClient, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The objects of one kind matching a label selector, in wire form."""
    listing = _plain(api, _method(api, kind, "list")(namespace, label_selector=selector))
    items: list[dict[str, Any]] = listing.get("items") or []
    return items


def apply_child(
    api: client.ApiClient,
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
            _method(api, kind, "create")(namespace, desired)
            return Child(kind, name, "created")
        except ApiException as exc:
            if exc.status != 409:
                raise
        observed = read_child(api, kind, namespace, name)
        if observed is None:  # deleted between our create and read: the next pass creates it
            return Child(kind, name, "unchanged")
    if kind == "Pod" or not needs_update(observed, desired):
        return Child(kind, name, "unchanged")
    _method(api, kind, "patch")(name, namespace, desired, _content_type=MERGE_PATCH)
    return Child(kind, name, "updated")


def delete_child(api: client.ApiClient, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
    """Delete one object (background propagation); False when it was already gone or replaced.

    With ``uid`` the API server deletes only that incarnation of the object (a
    precondition): a 409 means someone recreated it meanwhile, and it is left alone.
    """
    options: dict[str, Any] = {"propagationPolicy": "Background"}
    if uid:
        options["preconditions"] = {"uid": uid}
    try:
        _method(api, kind, "delete")(name, namespace, body=options)
    except ApiException as exc:
        if exc.status in {404, 409}:
            return False
        raise
    return True


def patch_annotations(
    api: client.ApiClient, kind: str, namespace: str, name: str, annotations: dict[str, str | None]
) -> bool:
    """Set (or, with None, remove) annotations of one object; False when it is gone."""
    try:
        _method(api, kind, "patch")(
            name, namespace, {"metadata": {"annotations": annotations}}, _content_type=MERGE_PATCH
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True
