"""Read a RolloutPool and write its status subresource (I/O, synchronous)."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rolloutpool.api.status import API_GROUP, API_VERSION, PLURAL
from rolloutpool.kube.children import MERGE_PATCH

__all__ = ["patch_pool_status", "read_pool"]


def read_pool(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The RolloutPool object, or None when it is gone."""
    custom = client.CustomObjectsApi(api)
    try:
        raw: Any = custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    pool: dict[str, Any] = raw
    return pool


def patch_pool_status(api: client.ApiClient, namespace: str, name: str, status: dict[str, Any]) -> bool:
    """Write ``status`` through the ``/status`` subresource; False when the pool is gone.

    A JSON merge patch: every list (replicas, conditions) is replaced whole, and a key
    set to None is removed, so the caller sends the status it rebuilt, complete.
    """
    custom = client.CustomObjectsApi(api)
    try:
        custom.patch_namespaced_custom_object_status(
            API_GROUP, API_VERSION, namespace, PLURAL, name, {"status": status}, _content_type=MERGE_PATCH
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True
