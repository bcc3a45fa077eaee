"""The operator's control law inside the simulator: signals as Prometheus would see them -> working-set targets.

Every ``interval_s`` virtual seconds (the Prometheus scrape interval) each replica's engine
metrics are sampled the way a scrape would sample them: gauges (KV usage, waiting requests, the
router's held turns) at that instant, counters (preemptions, prefix-cache hits and queries, the
router's re-prefilled tokens of prefixes it KEPT) as ``rate()`` over the law's window. The same pure
:func:`rolloutpool.autoscale.decide_replica` the operator runs turns them into each replica's
working-set target and quarantine; nothing here knows the workload.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from rolloutpool.autoscale import LawParams, ReplicaControl, ReplicaSignals, decide_replica
from rolloutpool.engine.model.core import Engine
from rolloutpool.reconcile.control import window_seconds
from rolloutpool.sim.config import FleetConfig

__all__ = ["AdaptiveTargets", "ControlPoint"]


@dataclass(frozen=True)
class ControlPoint:
    """One replica's decision at one control step."""

    t: float
    replica: str
    target: float
    live: int
    quarantined: bool
    reason: str | None


@dataclass(frozen=True)
class _Scrape:
    t: float
    preemptions: int
    hits: int
    queries: int
    reprefill: int


class AdaptiveTargets:
    """Per-replica law state, fed by scrapes of the simulated engines and router."""

    def __init__(self, *, names: list[str], params: LawParams, capacity_tokens: int) -> None:
        self.params = params
        self.capacity_tokens = capacity_tokens
        self.controls = {n: ReplicaControl(target=params.initial) for n in names}
        self._scrapes: dict[str, deque[_Scrape]] = {n: deque() for n in names}
        self.points: list[ControlPoint] = []
        self.cuts = 0
        """Target cuts the law made (pressure after its cooldown)."""
        self.quarantines = 0
        """Times a replica entered the law's quarantine."""
        self.weight_updates: Callable[..., float | None] | None = None
        """Weight updates within the law's window (``now=``, ``window_s=``), as the engines' metrics show them."""

    @classmethod
    def for_fleet(cls, config: FleetConfig, names: list[str], capacity_tokens: int) -> AdaptiveTargets:
        """The law of a simulated fleet: ``config.law``, else the operator's defaults, starting each replica at the
        router's own target, with rates over the operator's window for ``config.control_interval_s``."""
        window = window_seconds(config.control_interval_s)  # the operator's rate window (engine seconds)
        start = config.working_set.target if config.working_set is not None else LawParams().initial
        params = config.law or LawParams.at_target(start)  # as the operator, with autoscaling.maxTarget unset
        return cls(names=names, params=replace(params, rate_window_seconds=window), capacity_tokens=capacity_tokens)

    def _signals(
        self, *, name: str, now: float, engine: Engine, live: int, reprefill: int, held: int, queued: int
    ) -> ReplicaSignals:
        c = engine.counters
        scrapes = self._scrapes[name]
        scrapes.append(_Scrape(now, c.preemptions, c.prefix_hits, c.prefix_queries, reprefill))
        while scrapes and scrapes[0].t < now - self.params.rate_window_seconds - 1e-9:
            scrapes.popleft()
        first, last = scrapes[0], scrapes[-1]
        span = last.t - first.t
        rate = (lambda a, b: (b - a) / span) if span > 0 else (lambda a, b: None)
        queries = last.queries - first.queries
        return ReplicaSignals(
            kv_usage=engine.pool.usage,
            preemptions_per_s=rate(first.preemptions, last.preemptions),
            waiting=float(len(engine.waiting)),
            prefix_hit_ratio=(last.hits - first.hits) / queries if queries > 0 else None,
            reprefill_tokens_per_s=rate(first.reprefill, last.reprefill),
            kv_capacity_tokens=self.capacity_tokens,
            live_sessions=live,
            held_turns=float(held),
            queued_sessions=queued,
            sampled_at=now,
            weight_updates=None
            if self.weight_updates is None
            else self.weight_updates(now=now, window_s=self.params.rate_window_seconds),
        )

    def step(
        self,
        *,
        now: float,
        engines: Mapping[str, Engine],
        live: Mapping[str, int],
        reprefill: Mapping[str, int],
        held: Mapping[str, int],
        queued: int,
    ) -> dict[str, ReplicaControl]:
        """One control step over every replica; returns the new controls."""
        for name, engine in engines.items():
            signals = self._signals(
                name=name, now=now, engine=engine, live=live[name], reprefill=reprefill[name], held=held[name],
                queued=queued,
            )  # fmt: skip
            before = self.controls[name]
            after = decide_replica(previous=before, signals=signals, params=self.params, now=now)
            target = self.params.initial if after.target is None else after.target
            self.cuts += before.target is not None and target < before.target
            self.quarantines += after.quarantined and not before.quarantined
            self.controls[name] = after
            self.points.append(ControlPoint(now, name, target, live[name], after.quarantined, after.reason))
        return self.controls
