"""List-then-watch of one kind of object in a daemon thread, delivered to asyncio.

A :class:`~rolloutpool.kube.port.KubePort` (the real client, or the fake in tests) runs in one
thread per watch: it lists the objects, then watches from that resource version, listing again
on expiry (410), and watching again from the last version seen after a dropped stream.
Subclasses turn the listing and each event into items of their own type; items cross to the
event loop through ``loop.call_soon_threadsafe``.
:meth:`ThreadWatch.stop` ends the stream promptly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from kubernetes import client

from rolloutpool.kube.client import KubeClient
from rolloutpool.kube.port import GONE, KubeError, KubePort, WatchStream

__all__ = ["ThreadWatch"]

_log = logging.getLogger(__name__)
T = TypeVar("T")


class ThreadWatch(Generic[T]):
    """Base of the watches: subclasses say what to list and how to convert."""

    what = "objects"
    retry_seconds = 2.0
    """Pause after a failed list or watch before trying again."""

    def __init__(
        self,
        api: client.ApiClient | KubePort,
        *,
        kind: str,
        namespace: str,
        label_selector: str = "",
        field_selector: str = "",
        timeout_seconds: int = 60,
    ) -> None:
        self.kube: KubePort = KubeClient(api) if isinstance(api, client.ApiClient) else api
        self.kind = kind
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.timeout_seconds = timeout_seconds
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None

    # -- to override ------------------------------------------------------------------

    def on_list(self, objects: list[dict[str, Any]]) -> list[T]:
        """Items for a full listing."""
        raise NotImplementedError

    def on_event(self, event_type: str, obj: dict[str, Any]) -> list[T]:
        """Items for one watch event."""
        raise NotImplementedError

    # -- running ----------------------------------------------------------------------

    def stop(self) -> None:
        """End the watch thread (returns at once; the thread exits within a moment)."""
        self._stop.set()
        if self._stream is not None:
            self._stream.stop()

    def join(self, timeout: float) -> bool:
        """Wait for the watch thread to end after :meth:`stop`; returns whether it did."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    async def events(self) -> AsyncIterator[T]:
        """Items until :meth:`stop`; the first ones describe the full listing."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[T, ...] | None] = asyncio.Queue()

        def emit(items: tuple[T, ...] | None) -> None:
            if not loop.is_closed():  # a watch stopped at shutdown may end after its loop
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(queue.put_nowait, items)

        self._thread = threading.Thread(target=self._run, args=(emit,), name=f"watch-{self.what}", daemon=True)
        self._thread.start()
        try:
            while (items := await queue.get()) is not None:
                for item in items:
                    yield item
        finally:
            self.stop()

    def _run(self, emit: Callable[[tuple[T, ...] | None], None]) -> None:
        selectors = {"label_selector": self.label_selector, "field_selector": self.field_selector}
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    listing = self.kube.list(self.kind, self.namespace, **selectors)
                    resource_version = listing.resource_version
                    emit(tuple(self.on_list(listing.items)))
                self._stream = self.kube.watch(
                    self.kind,
                    self.namespace,
                    resource_version=resource_version,
                    timeout_seconds=self.timeout_seconds,
                    **selectors,
                )
                for event in self._stream:
                    if self._stop.is_set():
                        break
                    obj = event.object
                    resource_version = (obj.get("metadata") or {}).get("resourceVersion", resource_version)
                    emit(tuple(self.on_event(event.type, obj)))
            except KubeError as exc:
                if exc.status == GONE:  # resource version too old: list again
                    resource_version = None
                    continue
                _log.warning("Failed to watch %s status=%s", self.what, exc.status)
                self._stop.wait(self.retry_seconds)
            except Exception as exc:  # a dropped stream or an unreachable API server
                if self._stop.is_set():
                    break
                _log.warning("Lost watch of %s error=%s", self.what, type(exc).__name__)
                self._stop.wait(self.retry_seconds)
        emit(None)
