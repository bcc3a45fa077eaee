"""List-then-watch of one kind of object in a daemon thread, delivered to asyncio.

The synchronous kubernetes client runs in one thread per watch: it lists the
objects, then watches from that resource version, listing again on expiry (410) or
a dropped stream. Subclasses turn the listing and each event into items of their
own type; items cross to the event loop through ``loop.call_soon_threadsafe``.
:meth:`ThreadWatch.stop` ends the stream promptly.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

__all__ = ["ThreadWatch"]

_log = logging.getLogger(__name__)
T = TypeVar("T")


class ThreadWatch(Generic[T]):
    """Base of the watches: subclasses say what to list and how to convert."""

    what = "objects"

    def __init__(self, api: client.ApiClient, *, timeout_seconds: int = 60) -> None:
        self.api = api
        self.timeout_seconds = timeout_seconds
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None

    # -- to override ------------------------------------------------------------------

    def list_call(self) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        """The client's list function with its arguments (also used to watch)."""
        raise NotImplementedError

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
        if self._watch is not None:
            self._watch.stop()

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
            loop.call_soon_threadsafe(queue.put_nowait, items)

        self._thread = threading.Thread(target=self._run, args=(emit,), name=f"watch-{self.what}", daemon=True)
        self._thread.start()
        try:
            while (items := await queue.get()) is not None:
                for item in items:
                    yield item
        finally:
            self.stop()

    def _plain(self, obj: Any) -> dict[str, Any]:
        data: dict[str, Any] = obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)
        return data

    def _run(self, emit: Callable[[tuple[T, ...] | None], None]) -> None:
        func, args, kwargs = self.list_call()
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    listing = self._plain(func(*args, **kwargs))
                    resource_version = (listing.get("metadata") or {}).get("resourceVersion")
                    emit(tuple(self.on_list([self._plain(o) for o in listing.get("items") or []])))
                self._watch = watch.Watch()
                for raw in self._watch.stream(
                    func, *args, resource_version=resource_version, timeout_seconds=self.timeout_seconds, **kwargs
                ):
                    if self._stop.is_set():
                        break
                    obj = self._plain(raw["object"])
                    resource_version = (obj.get("metadata") or {}).get("resourceVersion", resource_version)
                    emit(tuple(self.on_event(raw["type"], obj)))
            except ApiException as exc:
                if exc.status == 410:  # resource version too old: list again
                    resource_version = None
                    continue
                _log.warning("Failed to watch %s status=%s", self.what, exc.status)
                self._stop.wait(2.0)
            except Exception as exc:  # a dropped stream or an unreachable API server
                if self._stop.is_set():
                    break
                _log.warning("Lost watch of %s error=%s", self.what, type(exc).__name__)
                self._stop.wait(2.0)
        emit(None)
