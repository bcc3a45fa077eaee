"""Watch one RolloutPool and report the per-replica limits the operator wrote into its status."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from rolloutpool.api.status import KIND
from rolloutpool.kube.port import KubePort
from rolloutpool.kube.watch import ThreadWatch
from rolloutpool.routing.discovery import OperatorLimit, operator_limits

__all__ = ["PoolWatch"]


class PoolWatch(ThreadWatch[dict[str, OperatorLimit]]):
    """The operator's caps and quarantine per replica, each time the pool's status changes."""

    what = "rolloutpool"

    def __init__(
        self, api: client.ApiClient | KubePort, *, namespace: str, name: str, timeout_seconds: int = 60
    ) -> None:
        fields = f"metadata.name={name}"
        super().__init__(api, kind=KIND, namespace=namespace, field_selector=fields, timeout_seconds=timeout_seconds)
        self.name = name

    def on_list(self, objects: list[dict[str, Any]]) -> list[dict[str, OperatorLimit]]:
        return [operator_limits(objects[0]) if objects else {}]

    def on_event(self, event_type: str, obj: dict[str, Any]) -> list[dict[str, OperatorLimit]]:
        return [{} if event_type == "DELETED" else operator_limits(obj)]
