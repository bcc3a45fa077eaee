"""One asyncio task per RolloutPool that runs reconcile passes, serialised and debounced.

kopf's ``@kopf.daemon`` and ``@kopf.timer`` would put a finalizer on every pool (kopf
must stop them before the object goes), and a finalizer makes ``kubectl delete rp``
hang whenever the operator is down. Owner references and the garbage collector
already delete the children, so the operator keeps its own loop per pool instead:
watch events *poke* the pool's worker, the worker runs one pass at a time, and a
burst of pokes during a pass causes exactly one more pass. Between pokes the worker
sleeps for the delay the last pass asked for (the periodic status refresh).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["PassFn", "PoolKey", "PoolWorkers"]

_log = logging.getLogger(__name__)

PoolKey = tuple[str, str]
"""(namespace, name) of a RolloutPool."""

PassFn = Callable[[PoolKey], Awaitable[float | None]]
"""One reconcile pass; returns seconds until the next periodic pass, or None when the pool is gone."""


@dataclass
class _Worker:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class PoolWorkers:
    """The running workers, keyed by pool; created at operator startup, closed at cleanup."""

    def __init__(self, run_pass: PassFn, *, error_backoff: float = 5.0) -> None:
        self._run_pass = run_pass
        self._error_backoff = error_backoff
        self._workers: dict[PoolKey, _Worker] = {}
        self._closed = False

    def __contains__(self, key: PoolKey) -> bool:
        return key in self._workers

    def poke(self, key: PoolKey) -> None:
        """Ask for a pass of one pool soon, starting its worker when there is none."""
        if self._closed:
            return
        worker = self._workers.get(key)
        if worker is None:
            worker = self._workers[key] = _Worker()
            worker.task = asyncio.create_task(self._loop(key, worker), name=f"rolloutpool-{key[0]}/{key[1]}")
        worker.wake.set()

    def forget(self, key: PoolKey) -> None:
        """Stop the worker of a deleted pool (its children go with the garbage collector)."""
        worker = self._workers.pop(key, None)
        if worker is not None and worker.task is not None:
            worker.task.cancel()

    async def close(self) -> None:
        """Cancel every worker and wait for them to end."""
        self._closed = True
        tasks = [w.task for w in self._workers.values() if w.task is not None]
        self._workers.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, key: PoolKey, worker: _Worker) -> None:
        namespace, name = key
        while True:
            await worker.wake.wait()
            worker.wake.clear()
            try:
                delay = await self._run_pass(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                status = getattr(exc, "status", None)  # an API error: its status says enough, no traceback
                _log.error(
                    "Failed to reconcile RolloutPool pool=%s/%s error=%s status=%s retry_in=%gs",
                    namespace,
                    name,
                    type(exc).__name__,
                    status,
                    self._error_backoff,
                    exc_info=status is None,
                )
                delay = self._error_backoff
            if delay is None:
                if self._workers.get(key) is worker:
                    del self._workers[key]
                _log.info("Stopped reconciling RolloutPool pool=%s/%s reason=Gone", namespace, name)
                return
            try:
                await asyncio.wait_for(worker.wake.wait(), timeout=delay)
            except TimeoutError:
                worker.wake.set()
