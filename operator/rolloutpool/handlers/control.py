"""The slow control loop's read of Prometheus (I/O).

Whether a step is due, what a read means and the caps are decided in
:mod:`rolloutpool.reconcile.control` (through :func:`rolloutpool.reconcile.decide.decide`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from rolloutpool.handlers.context import SignalsReader
from rolloutpool.metrics.prom import PrometheusUnreachable
from rolloutpool.reconcile.control import MetricsRead

__all__ = ["read_metrics"]


async def read_metrics(
    prometheus: Callable[[str], SignalsReader],
    url: str,
    *,
    namespace: str,
    replicas: Sequence[str],
    window_seconds: float,
) -> MetricsRead:
    """One Prometheus read for the slow loop, its rates over ``window_seconds``; a failure becomes the read's error."""
    try:
        reader = prometheus(url)
        signals = await asyncio.to_thread(
            reader.read, namespace=namespace, replicas=replicas, window_seconds=window_seconds
        )
    except (PrometheusUnreachable, ValueError) as exc:
        return MetricsRead({}, str(exc) or type(exc).__name__)
    return MetricsRead(signals, None)
