"""Watch the engine pods of a pool and report replica events."""

from __future__ import annotations

import os
from typing import Any

from kubernetes import client, config

from rolloutpool.kube.port import KubePort
from rolloutpool.kube.watch import ThreadWatch
from rolloutpool.routing.discovery import ReplicaEvent, replica_event

__all__ = ["PodWatch", "api_client"]


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An API client from a kubeconfig file, else the in-cluster service account, else ``$KUBECONFIG``.

    The last fallback is how pods run by the process kubelet (which writes each pod a
    kubeconfig from its ServiceAccount's token) reach the API server.
    """
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        if not os.environ.get("KUBECONFIG"):
            raise
        return config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
    return client.ApiClient()


class PodWatch(ThreadWatch[ReplicaEvent]):
    """Replica events for the pods matching ``selector`` in ``namespace``.

    A full listing reports every pod, a deletion for each pod that vanished since the
    previous listing, then ``Synced``.
    """

    what = "pods"

    def __init__(
        self,
        api: client.ApiClient | KubePort,
        *,
        namespace: str,
        selector: str,
        port_name: str = "http",
        default_port: int = 8000,
        timeout_seconds: int = 60,
    ) -> None:
        super().__init__(api, kind="Pod", namespace=namespace, label_selector=selector, timeout_seconds=timeout_seconds)
        self.selector = selector
        self.port_name = port_name
        self.default_port = default_port
        self._known: set[str] = set()

    def _event(self, event_type: str, pod: dict[str, Any]) -> ReplicaEvent:
        return replica_event(event_type, pod, port_name=self.port_name, default_port=self.default_port)

    def on_list(self, objects: list[dict[str, Any]]) -> list[ReplicaEvent]:
        events = [self._event("ADDED", pod) for pod in objects]
        listed = {e.name for e in events}
        events += [ReplicaEvent(gone, None, False, "Deleted") for gone in sorted(self._known - listed)]
        self._known = listed
        return [*events, ReplicaEvent("", None, False, "Synced")]

    def on_event(self, event_type: str, obj: dict[str, Any]) -> list[ReplicaEvent]:
        event = self._event(event_type, obj)
        (self._known.discard if event_type == "DELETED" else self._known.add)(event.name)
        return [event]
