"""Watch one RolloutPool and report the per-replica limits the operator wrote into its status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from rolloutpool.api.status import API_GROUP, API_VERSION, PLURAL
from rolloutpool.kube.watch import ThreadWatch
from rolloutpool.routing.discovery import OperatorLimit, operator_limits

__all__ = ["PoolWatch"]


class PoolWatch(ThreadWatch[dict[str, OperatorLimit]]):
    """The operator's caps and quarantine per replica, each time the pool's status changes."""

    what = "rolloutpool"

    def __init__(self, api: client.ApiClient, *, namespace: str, name: str, timeout_seconds: int = 60) -> None:
        super().__init__(api, timeout_seconds=timeout_seconds)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.name = name

    def list_call(self) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        args = (API_GROUP, API_VERSION, self.namespace, PLURAL)
        return self.custom.list_namespaced_custom_object, args, {"field_selector": f"metadata.name={self.name}"}

    def on_list(self, objects: list[dict[str, Any]]) -> list[dict[str, OperatorLimit]]:
        return [operator_limits(objects[0]) if objects else {}]

    def on_event(self, event_type: str, obj: dict[str, Any]) -> list[dict[str, OperatorLimit]]:
        return [{} if event_type == "DELETED" else operator_limits(obj)]
