"""Watch a pool's engine pods and router pods and report the fleet as one router sees it.

Two list-then-watch streams (the router's Role already allows ``get/list/watch`` on pods)
keep a full copy of each set of pods; every change yields a new
:class:`rolloutpool.routing.fleetview.FleetView` (bursts are coalesced into one view),
starting once both have been listed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from kubernetes import client

from rolloutpool.kube.port import KubePort
from rolloutpool.kube.watch import ThreadWatch
from rolloutpool.routing.fleetview import FleetView, fleet_view

__all__ = ["FleetWatch", "PodSnapshots"]

Snapshot = dict[str, dict[str, Any]]


class PodSnapshots(ThreadWatch[Snapshot]):
    """Every pod matching ``selector`` in ``namespace``, by name, after each change."""

    what = "pods"

    def __init__(
        self, api: client.ApiClient | KubePort, *, namespace: str, selector: str, timeout_seconds: int = 60
    ) -> None:
        super().__init__(api, kind="Pod", namespace=namespace, label_selector=selector, timeout_seconds=timeout_seconds)
        self._pods: Snapshot = {}

    def on_list(self, objects: list[dict[str, Any]]) -> list[Snapshot]:
        self._pods = {str(o["metadata"]["name"]): o for o in objects}
        return [dict(self._pods)]

    def on_event(self, event_type: str, obj: dict[str, Any]) -> list[Snapshot]:
        name = str(obj["metadata"]["name"])
        if event_type == "DELETED":
            self._pods.pop(name, None)
        else:
            self._pods[name] = obj
        return [dict(self._pods)]


class FleetWatch:
    """The fleet views of router ``self_name`` from its pool's engine pods and router pods."""

    def __init__(
        self,
        api: client.ApiClient | KubePort,
        *,
        namespace: str,
        engine_selector: str,
        router_selector: str,
        self_name: str,
        timeout_seconds: int = 60,
    ) -> None:
        self.self_name = self_name
        self.engines = PodSnapshots(api, namespace=namespace, selector=engine_selector, timeout_seconds=timeout_seconds)
        self.routers = PodSnapshots(api, namespace=namespace, selector=router_selector, timeout_seconds=timeout_seconds)

    async def views(self) -> AsyncIterator[FleetView]:
        """A view after each change, once both kinds of pods are listed; until :meth:`stop`."""
        queue: asyncio.Queue[tuple[str, Snapshot]] = asyncio.Queue()

        async def pump(kind: str, watch: PodSnapshots) -> None:
            async for snapshot in watch.events():
                queue.put_nowait((kind, snapshot))

        tasks = [asyncio.create_task(pump(k, w)) for k, w in (("engines", self.engines), ("routers", self.routers))]
        latest: dict[str, Snapshot] = {}
        view: FleetView | None = None
        try:
            while True:
                kind, snapshot = await queue.get()
                latest[kind] = snapshot
                while not queue.empty():  # a burst of events makes one view
                    kind, snapshot = queue.get_nowait()
                    latest[kind] = snapshot
                if len(latest) == 2:
                    view = fleet_view(
                        engine_pods=latest["engines"].values(),
                        router_pods=latest["routers"].values(),
                        self_name=self.self_name,
                        previous=view,
                    )
                    yield view
        finally:
            self.stop()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def stop(self) -> None:
        """End both watch threads."""
        self.engines.stop()
        self.routers.stop()

    def join(self, timeout: float) -> bool:
        """Wait for both watch threads after :meth:`stop`."""
        return self.engines.join(timeout) and self.routers.join(timeout)
