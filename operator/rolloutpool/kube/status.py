"""Read a RolloutPool and write its status subresource (I/O, synchronous)."""

from __future__ import annotations

from typing import Any

from rolloutpool.api.status import KIND
from rolloutpool.kube.port import NOT_FOUND, KubeError, KubePort

__all__ = ["patch_pool_status", "read_pool"]


def read_pool(kube: KubePort, namespace: str, name: str) -> dict[str, Any] | None:
    """The RolloutPool object, or None when it is gone."""
    try:
        return kube.get(KIND, namespace, name)
    except KubeError as exc:
        if exc.status == NOT_FOUND:
            return None
        raise


def patch_pool_status(kube: KubePort, namespace: str, name: str, status: dict[str, Any]) -> bool:
    """Write ``status`` through the ``/status`` subresource; False when the pool is gone.

    A JSON merge patch: every list (replicas, conditions) is replaced whole, and a key
    set to None is removed, so the caller sends the status it rebuilt, complete.
    """
    try:
        kube.patch_status(KIND, namespace, name, status)
    except KubeError as exc:
        if exc.status == NOT_FOUND:
            return False
        raise
    return True
