"""The operator's and the router's view of the Kubernetes API: a small port, the real client behind it.

Objects travel as plain dicts in their wire form (camelCase). Every call is a blocking request:
async callers run them with ``asyncio.to_thread``. Errors the callers act on are
:class:`KubeError` with the HTTP status (404 gone, 409 conflict, 410 watch expired); anything
else (a timeout, a refused connection) propagates as the client raised it.
:class:`rolloutpool.kube.fake.FakeKube` is the in-memory implementation the unit tests use.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["CONFLICT", "GONE", "NOT_FOUND", "KubeError", "KubePort", "Listing", "WatchEvent", "WatchStream"]

NOT_FOUND = 404
CONFLICT = 409
GONE = 410


class KubeError(Exception):
    """An API error answer: ``status`` is its HTTP status (the kubernetes client's ``ApiException`` has it too)."""

    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(f"{status} {reason}".strip())
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Listing:
    """One list answer: its objects and the collection's resource version (to watch from)."""

    items: list[dict[str, Any]]
    resource_version: str | None = None


@dataclass(frozen=True)
class WatchEvent:
    """One watch event: ``ADDED``, ``MODIFIED`` or ``DELETED`` and the object."""

    type: str
    object: dict[str, Any] = field(default_factory=dict)


class WatchStream(Protocol):
    """A running watch: iterate for its events; ``stop`` (from another thread) ends the iteration soon."""

    def __iter__(self) -> Iterator[WatchEvent]:
        """Events until the server ends the stream (410 when the version expired; any error when it drops)."""
        ...

    def stop(self) -> None:
        """End the stream after the event in hand."""
        ...


class KubePort(Protocol):
    """What the operator and the router do with the API server.

    ``kind`` is one of ``Pod``, ``Service``, ``ServiceAccount``, ``Deployment``, ``Role``,
    ``RoleBinding``, ``RolloutPool``. Patches are JSON merge patches.
    """

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        """The object; raises ``KubeError(404)`` when it does not exist."""
        ...

    def list(self, kind: str, namespace: str, *, label_selector: str = "", field_selector: str = "") -> Listing:
        """The objects matching the selectors (``k=v,k2=v2``; ``metadata.name=x``)."""
        ...

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create the object (namespace and name from its metadata); ``KubeError(409)`` when it exists."""
        ...

    def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the object; ``KubeError(404)`` when it does not exist."""
        ...

    def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch ``status`` through the status subresource; ``KubeError(404)`` when gone."""
        ...

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> None:
        """Delete (background propagation); 404 when gone, 409 when ``uid`` names another incarnation."""
        ...

    def watch(
        self,
        kind: str,
        namespace: str,
        *,
        resource_version: str | None,
        timeout_seconds: int,
        label_selector: str = "",
        field_selector: str = "",
    ) -> WatchStream:
        """A stream of the events after ``resource_version``."""
        ...

    def close(self) -> None:
        """Release the connection pool."""
        ...
