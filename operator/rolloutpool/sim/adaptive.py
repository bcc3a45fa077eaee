"""The operator's control law inside the simulator: signals as Prometheus would see them -> caps.

Every ``interval_s`` virtual seconds (the Prometheus scrape interval) each replica's engine
metrics are sampled the way a scrape would sample them: gauges (KV usage, waiting requests)
at that instant, KV usage also as its mean over the law's window, counters (preemptions,
prefix-cache hits and queries, the router's re-prefilled tokens of LIVE sessions) as
``rate()`` over the law's window. The same pure
:func:`rolloutpool.autoscale.decide_replica` the operator runs turns them into caps and
quarantine; nothing here knows the workload's residency.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rolloutpool.autoscale import LawParams, ReplicaControl, ReplicaSignals, decide_replica, initial_cap
from rolloutpool.capacity import conservative_cap, oversubscribed_cap
from rolloutpool.engine.model.core import Engine
from rolloutpool.engine.model.cost import CostModel
from rolloutpool.reconcile.control import window_seconds
from rolloutpool.sim.config import FleetConfig

__all__ = ["AdaptiveCaps", "ControlPoint"]


@dataclass(frozen=True)
class ControlPoint:
    """One replica's decision at one control step."""

    t: float
    replica: str
    cap: int
    live: int
    quarantined: bool
    reason: str | None
    limit: int | None


@dataclass(frozen=True)
class _Scrape:
    t: float
    preemptions: int
    hits: int
    queries: int
    reprefill: int
    usage: float
    token_step_seconds: float
    tokens: int


class AdaptiveCaps:
    """Per-replica law state, fed by scrapes of the simulated engines and router."""

    def __init__(self, *, names: list[str], params: LawParams, capacity_tokens: int) -> None:
        self.params = params
        self.capacity_tokens = capacity_tokens
        self.controls = {n: ReplicaControl(cap=initial_cap(params)) for n in names}
        self._scrapes: dict[str, deque[_Scrape]] = {n: deque() for n in names}
        self.points: list[ControlPoint] = []
        self.cuts = 0
        """Cap cuts the law made (pressure after its cooldown)."""
        self.quarantines = 0
        """Times a replica entered the law's quarantine."""
        self.weight_updates: Callable[..., float | None] | None = None
        """Weight updates within the law's window (``now=``, ``window_s=``), as the engines' metrics show them."""

    @classmethod
    def for_fleet(cls, config: FleetConfig, names: list[str], capacity_tokens: int, *, cost: CostModel) -> AdaptiveCaps:
        """The law of a simulated fleet: ``config.law``, else the operator's defaults for this fleet.

        Those are: floor = KV capacity // maxModelLen, ceiling = ``max_num_seqs``, start at the cap the
        spec's ``expectedResidency`` and ``headroom`` give (the operator's ``law_params``), rates and means over the
        operator's window for ``config.control_interval_s``, the engines' step floor and the read of a whole cache
        from their ``cost`` (as the operator takes them for engine-sims); nothing else.
        """
        max_len = config.scenario.max_model_len
        floor = conservative_cap(capacity_tokens=capacity_tokens, max_model_len=max_len)
        ceiling = max(floor, config.max_num_seqs)
        initial = oversubscribed_cap(
            capacity_tokens=capacity_tokens,
            max_model_len=max_len,
            expected_residency=config.expected_residency,
            headroom=config.headroom,
            ceiling=ceiling,
        )
        window = window_seconds(config.control_interval_s)  # the operator's rate window (engine seconds)
        params = config.law or LawParams(
            floor=floor, ceiling=ceiling, initial=initial, rate_window_seconds=window,
            step_floor_seconds=cost.fixed_step_seconds, cache_read_seconds=cost.kv_read_seconds(capacity_tokens),
        )  # fmt: skip
        return cls(names=names, params=params, capacity_tokens=capacity_tokens)

    def _signals(
        self, *, name: str, now: float, engine: Engine, live: int, reprefill: int, queued: int, kv_cap: int | None
    ) -> ReplicaSignals:
        c = engine.counters
        scrapes = self._scrapes[name]
        usage, step_s, tokens = engine.pool.usage, c.token_step_seconds, c.generation_tokens
        scrapes.append(_Scrape(now, c.preemptions, c.prefix_hits, c.prefix_queries, reprefill, usage, step_s, tokens))
        while scrapes and scrapes[0].t < now - self.params.rate_window_seconds - 1e-9:
            scrapes.popleft()
        first, last = scrapes[0], scrapes[-1]
        span = last.t - first.t
        rate = (lambda a, b: (b - a) / span) if span > 0 else (lambda a, b: None)
        queries = last.queries - first.queries
        tokens = last.tokens - first.tokens
        return ReplicaSignals(
            kv_usage=engine.pool.usage,
            kv_usage_mean=sum(s.usage for s in scrapes) / len(scrapes),
            preemptions_per_s=rate(first.preemptions, last.preemptions),
            waiting=float(len(engine.waiting)),
            prefix_hit_ratio=(last.hits - first.hits) / queries if queries > 0 else None,
            reprefill_tokens_per_s=rate(first.reprefill, last.reprefill),
            kv_capacity_tokens=self.capacity_tokens,
            live_sessions=live,
            queued_sessions=queued,
            sampled_at=now,
            kv_cap=kv_cap,
            mean_itl_seconds=(last.token_step_seconds - first.token_step_seconds) / tokens if tokens > 0 else None,
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
        queued: int,
        kv_caps: Mapping[str, int | None] | None = None,
    ) -> dict[str, ReplicaControl]:
        """One control step over every replica; returns the new controls."""
        for name, engine in engines.items():
            kv_cap = None if kv_caps is None else kv_caps.get(name)
            signals = self._signals(
                name=name, now=now, engine=engine, live=live[name], reprefill=reprefill[name], queued=queued,
                kv_cap=kv_cap,
            )  # fmt: skip
            before = self.controls[name]
            after = decide_replica(previous=before, signals=signals, params=self.params, now=now)
            cap = initial_cap(self.params) if after.cap is None else after.cap  # the law always decides one
            self.cuts += before.cap is not None and cap < before.cap
            self.quarantines += after.quarantined and not before.quarantined
            self.controls[name] = after
            self.points.append(ControlPoint(now, name, cap, live[name], after.quarantined, after.reason, after.limit))
        return self.controls
