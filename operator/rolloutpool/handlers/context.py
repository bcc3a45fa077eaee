"""What the operator keeps between passes: its clients (in kopf's ``memo``) and per-pool memory.

Nothing here must survive a restart: every decision that must (caps, cooldowns, drain
start times) is read back from the objects themselves on each pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rolloutpool.autoscale import MetricsHealth, ReplicaSignals
from rolloutpool.handlers.workers import PoolKey, PoolWorkers
from rolloutpool.kube.port import KubePort
from rolloutpool.metrics.routerstats import RouterStats
from rolloutpool.reconcile.control import ControlMemo
from rolloutpool.reconcile.decide import PassSettings, Recall

__all__ = ["EventPoster", "OperatorContext", "PoolMemory", "SignalsReader"]

EventPoster = Callable[[Mapping[str, Any], str, str, str], None]
"""Post one Event on a pool object: (pool, type, reason, message)."""


class SignalsReader(Protocol):
    """What the slow loop needs of :class:`rolloutpool.metrics.prom.PrometheusSignals`."""

    def read(
        self, *, namespace: str, replicas: Sequence[str], window_seconds: float
    ) -> Mapping[str, ReplicaSignals | None]:
        """Signals per replica; raises ``PrometheusUnreachable`` when Prometheus does not answer."""
        ...


@dataclass
class PoolMemory:
    """Per-pool bookkeeping of this operator process (rebuilt from scratch after a restart)."""

    router_generation: int | None = None
    """Generation whose router objects were last applied."""
    router_applied_at: float = 0.0
    """Monotonic time of the last router apply (the objects are re-checked now and then)."""
    control_at: float | None = None
    """Monotonic time of the last slow-loop step."""
    signals: Mapping[str, ReplicaSignals | None] = field(default_factory=dict)
    """What the last slow-loop step read (shown in the status until the next step)."""
    health: MetricsHealth | None = None
    """What the last slow-loop step made of its read (the ``MetricsAvailable`` condition)."""
    passes: int = 0
    """Passes this process ran over the pool (the first one is always logged)."""
    seen_generation: int | None = None
    """Generation of the last pool event that poked the worker."""

    def recall(self) -> Recall:
        """The part a pass decides from (:func:`rolloutpool.reconcile.decide.decide`)."""
        control = ControlMemo(control_at=self.control_at, signals=self.signals, health=self.health)
        return Recall(self.router_generation, self.router_applied_at, control)

    def keep_control(self, memo: ControlMemo) -> None:
        """Remember what the slow loop read in this pass."""
        self.control_at, self.signals, self.health = memo.control_at, memo.signals, memo.health


@dataclass
class OperatorContext:
    """The operator's clients and workers, kept in kopf's ``memo`` from startup to cleanup."""

    kube: KubePort
    prometheus: Callable[[str], SignalsReader]
    router_stats: Callable[[Sequence[str]], RouterStats]
    workers: PoolWorkers
    image: str
    post_event: EventPoster
    status_interval: float = 5.0
    """Seconds between two status refreshes of a pool at rest."""
    busy_interval: float = 1.0
    """Seconds between two passes while replicas are created, drained or replaced."""
    router_resync_seconds: float = 60.0
    """How often router objects are re-checked when nothing about them changed."""
    memory: dict[PoolKey, PoolMemory] = field(default_factory=dict)

    @property
    def settings(self) -> PassSettings:
        """The knobs of a pass."""
        return PassSettings(self.image, self.status_interval, self.busy_interval, self.router_resync_seconds)

    def remember(self, key: PoolKey) -> PoolMemory:
        """The memory of one pool, created on first use."""
        return self.memory.setdefault(key, PoolMemory())
