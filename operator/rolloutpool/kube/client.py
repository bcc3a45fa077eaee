"""The real :class:`~rolloutpool.kube.port.KubePort`: the kubernetes client's typed APIs (I/O, synchronous)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from rolloutpool.api.status import API_GROUP, API_VERSION, KIND, PLURAL
from rolloutpool.kube.port import KubeError, Listing, WatchEvent, WatchStream

__all__ = ["KINDS", "MERGE_PATCH", "KubeClient"]

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class _Kind:
    """Where one kind lives in the typed client: its API class and the suffix of its methods."""

    api: Callable[[client.ApiClient], Any]
    suffix: str


KINDS: dict[str, _Kind] = {
    "Pod": _Kind(client.CoreV1Api, "namespaced_pod"),
    "Service": _Kind(client.CoreV1Api, "namespaced_service"),
    "ServiceAccount": _Kind(client.CoreV1Api, "namespaced_service_account"),
    "Secret": _Kind(client.CoreV1Api, "namespaced_secret"),
    "Deployment": _Kind(client.AppsV1Api, "namespaced_deployment"),
    "Role": _Kind(client.RbacAuthorizationV1Api, "namespaced_role"),
    "RoleBinding": _Kind(client.RbacAuthorizationV1Api, "namespaced_role_binding"),
}
_CUSTOM = (API_GROUP, API_VERSION)


def _translated(exc: ApiException) -> KubeError:
    return KubeError(int(exc.status or 0), str(exc.reason or ""))


class _Stream:
    """One watch of the typed client, its events as :class:`WatchEvent`."""

    def __init__(self, owner: KubeClient, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]):
        self._owner, self._func, self._args, self._kwargs = owner, func, args, kwargs
        self._watch = watch.Watch()

    def __iter__(self) -> Iterator[WatchEvent]:
        try:
            for raw in self._watch.stream(self._func, *self._args, **self._kwargs):
                yield WatchEvent(str(raw["type"]), self._owner.plain(raw["object"]))
        except ApiException as exc:
            raise _translated(exc) from exc

    def stop(self) -> None:
        self._watch.stop()


class KubeClient:
    """A :class:`KubePort` over one ``ApiClient`` (its connection pool is shared by every call)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def plain(self, obj: Any) -> dict[str, Any]:
        """An object of the typed client (or a dict already) in wire form."""
        data: dict[str, Any] = obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)
        return data

    def _method(self, kind: str, verb: str) -> Callable[..., Any]:
        entry = KINDS[kind]
        method: Callable[..., Any] = getattr(entry.api(self.api), f"{verb}_{entry.suffix}")
        return method

    def _call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return self.plain(func(*args, **kwargs))
        except ApiException as exc:
            raise _translated(exc) from exc

    def _list_call(
        self, kind: str, namespace: str, label_selector: str, field_selector: str
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        kwargs = {k: v for k, v in (("label_selector", label_selector), ("field_selector", field_selector)) if v}
        if kind == KIND:
            custom = client.CustomObjectsApi(self.api)
            return custom.list_namespaced_custom_object, (*_CUSTOM, namespace, PLURAL), kwargs
        return self._method(kind, "list"), (namespace,), kwargs

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        if kind == KIND:
            custom = client.CustomObjectsApi(self.api)
            return self._call(custom.get_namespaced_custom_object, *_CUSTOM, namespace, PLURAL, name)
        return self._call(self._method(kind, "read"), name, namespace)

    def list(self, kind: str, namespace: str, *, label_selector: str = "", field_selector: str = "") -> Listing:
        func, args, kwargs = self._list_call(kind, namespace, label_selector, field_selector)
        listing = self._call(func, *args, **kwargs)
        items = [self.plain(o) for o in listing.get("items") or []]
        return Listing(items, (listing.get("metadata") or {}).get("resourceVersion"))

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind, namespace = str(obj["kind"]), str(obj["metadata"]["namespace"])
        if kind == KIND:
            custom = client.CustomObjectsApi(self.api)
            return self._call(custom.create_namespaced_custom_object, *_CUSTOM, namespace, PLURAL, obj)
        return self._call(self._method(kind, "create"), namespace, obj)

    def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if kind == KIND:
            custom = client.CustomObjectsApi(self.api)
            func = custom.patch_namespaced_custom_object
            return self._call(func, *_CUSTOM, namespace, PLURAL, name, patch, _content_type=MERGE_PATCH)
        return self._call(self._method(kind, "patch"), name, namespace, patch, _content_type=MERGE_PATCH)

    def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        if kind != KIND:
            raise ValueError(f"status writes are for {KIND} objects only, not {kind}")
        custom = client.CustomObjectsApi(self.api)
        func = custom.patch_namespaced_custom_object_status
        return self._call(func, *_CUSTOM, namespace, PLURAL, name, {"status": status}, _content_type=MERGE_PATCH)

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> None:
        options: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            options["preconditions"] = {"uid": uid}
        self._call(self._method(kind, "delete"), name, namespace, body=options)

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
        func, args, kwargs = self._list_call(kind, namespace, label_selector, field_selector)
        kwargs |= {"resource_version": resource_version, "timeout_seconds": timeout_seconds}
        return _Stream(self, func, args, kwargs)

    def close(self) -> None:
        self.api.close()
