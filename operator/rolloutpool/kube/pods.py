"""Watch the pods of a pool and report replica events (kubernetes client, in a thread).

The synchronous kubernetes client runs in one daemon thread per watch: it lists the
pods matching a label selector, then watches from that resource version, restarting
on expiry (410) or a dropped stream. Events cross to the event loop through
``loop.call_soon_threadsafe``; :meth:`PodWatch.stop` ends the stream promptly.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from rolloutpool.routing.discovery import ReplicaEvent, replica_event

__all__ = ["PodWatch", "api_client"]

_log = logging.getLogger(__name__)


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An API client from a kubeconfig file, or the in-cluster service account."""
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


class PodWatch:
    """Replica events for the pods matching ``selector`` in ``namespace``."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str,
        selector: str,
        port_name: str = "http",
        default_port: int = 8000,
        timeout_seconds: int = 60,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.selector = selector
        self.port_name = port_name
        self.default_port = default_port
        self.timeout_seconds = timeout_seconds
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None

    def stop(self) -> None:
        """End the watch thread (returns at once; the thread exits within a moment)."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def join(self, timeout: float) -> bool:
        """Wait for the watch thread to end after :meth:`stop`; returns whether it did."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    async def events(self) -> AsyncIterator[ReplicaEvent]:
        """Replica events until :meth:`stop`; the first ones describe every existing pod."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[ReplicaEvent | None] = asyncio.Queue()

        def emit(event: ReplicaEvent | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        self._thread = threading.Thread(target=self._run, args=(emit,), name="pod-watch", daemon=True)
        self._thread.start()
        try:
            while (event := await queue.get()) is not None:
                yield event
        finally:
            self.stop()

    def _convert(self, event_type: str, pod: Any) -> ReplicaEvent:
        data = pod if isinstance(pod, dict) else self.core.api_client.sanitize_for_serialization(pod)
        return replica_event(event_type, data, port_name=self.port_name, default_port=self.default_port)

    def _run(self, emit: Any) -> None:
        resource_version: str | None = None
        known: set[str] = set()
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    pods: Any = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
                    resource_version = pods.metadata.resource_version
                    listed: set[str] = set()
                    for pod in pods.items:
                        listed.add(pod.metadata.name)
                        emit(self._convert("ADDED", pod))
                    for gone in sorted(known - listed):  # deleted while we were not watching
                        emit(ReplicaEvent(gone, None, False, "Deleted"))
                    known = listed
                    emit(ReplicaEvent("", None, False, "Synced"))
                self._watch = watch.Watch()
                for raw in self._watch.stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    label_selector=self.selector,
                    resource_version=resource_version,
                    timeout_seconds=self.timeout_seconds,
                ):
                    if self._stop.is_set():
                        break
                    pod = raw["object"]
                    resource_version = pod.metadata.resource_version
                    event = self._convert(raw["type"], pod)
                    (known.discard if raw["type"] == "DELETED" else known.add)(event.name)
                    emit(event)
            except ApiException as exc:
                if exc.status == 410:  # resource version too old: list again
                    resource_version = None
                    continue
                _log.warning("Failed to watch pods namespace=%s status=%s", self.namespace, exc.status)
                self._stop.wait(2.0)
            except Exception as exc:  # a dropped stream or an unreachable API server
                if self._stop.is_set():
                    break
                _log.warning("Lost pod watch namespace=%s error=%s", self.namespace, type(exc).__name__)
                self._stop.wait(2.0)
        emit(None)
