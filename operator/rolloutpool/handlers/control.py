"""The slow control loop inside a pass: read Prometheus when a step is due, then let the pure law decide.

The decisions (is a step due, what the read means, the caps) are
:mod:`rolloutpool.reconcile.control`'s; this module only reads and remembers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.api.status import RolloutPoolStatus
from rolloutpool.handlers.context import PoolMemory, SignalsReader
from rolloutpool.metrics.prom import PrometheusUnreachable
from rolloutpool.reconcile.control import (
    ControlStep,
    MetricsRead,
    metrics_due,
    remember_read,
    stale_after_seconds,
    step_controls,
    window_seconds,
)

__all__ = ["ControlStep", "control_step", "read_metrics", "stale_after_seconds", "window_seconds"]

_log = logging.getLogger(__name__)


async def read_metrics(
    prometheus: Callable[[str], SignalsReader], url: str, *, namespace: str, replicas: Sequence[str], interval: float
) -> MetricsRead:
    """One Prometheus read for the slow loop; a failure becomes the read's error."""
    try:
        reader = prometheus(url)
        signals = await asyncio.to_thread(
            reader.read, namespace=namespace, replicas=replicas, window_seconds=window_seconds(interval)
        )
    except (PrometheusUnreachable, ValueError) as exc:
        return MetricsRead({}, str(exc) or type(exc).__name__)
    return MetricsRead(signals, None)


async def control_step(
    prometheus: Callable[[str], SignalsReader],
    memory: PoolMemory,
    *,
    namespace: str,
    pool: str,
    spec: RolloutPoolSpec,
    replicas: Sequence[str],
    previous: RolloutPoolStatus | None,
    now: float,
    clock: float,
    queued_sessions: int | None = None,
) -> ControlStep:
    """One pass's caps: a law step when due (reading Prometheus first), otherwise the kept ones.

    ``prometheus`` gives the reader of a URL; ``now`` is wall time (the law's cooldowns),
    ``clock`` monotonic time (when the next step is due). ``queued_sessions`` is the
    routers' admission queue (None when no router answered).

    Raises ``ValueError`` naming the spec field when the spec cannot be served.
    """
    memo = memory.recall().control
    url = metrics_due(spec=spec, replicas=replicas, memo=memo, clock=clock)
    if url is not None:
        interval = float(spec.autoscaling.interval_seconds)
        read = await read_metrics(prometheus, url, namespace=namespace, replicas=replicas, interval=interval)
        memo = remember_read(spec=spec, read=read, now=now, clock=clock, queued_sessions=queued_sessions)
        memory.keep_control(memo)
        if memo.health is not None and not memo.health.available:
            _log.info("Read no usable metrics pool=%s/%s reason=%s", namespace, pool, memo.health.reason)
    return step_controls(
        spec=spec, replicas=replicas, previous=previous, memo=memo, stepped=url is not None, now=now, clock=clock
    )
