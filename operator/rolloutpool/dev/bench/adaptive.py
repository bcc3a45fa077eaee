"""The operator's slow control loop for the benchmark, without Kubernetes or Prometheus (pure).

``rolloutpool-adaptive`` is our router with working-set targets decided the way the operator decides them:
each ``autoscaling.intervalSeconds`` (simulated seconds, like the engines' clocks) the bench
scrapes every engine's and the router's ``/metrics``, turns the scrapes into the
:class:`~rolloutpool.autoscale.ReplicaSignals` the operator's PromQL would return (gauges at
the scrape, counters as rates over :func:`~rolloutpool.reconcile.control.window_seconds`),
runs the operator's own step (:func:`~rolloutpool.reconcile.caps.plan_controls` with the
health verdict of :func:`~rolloutpool.reconcile.control.remember_read`) on a RolloutPool spec
of the bench fleet, and writes the result to the router as the pool's ``status.replicaStatus``
(``PUT /admin/limits``), which the router applies as it applies a watched pool's status.
Nothing here does I/O; times are passed in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rolloutpool.api import vllm_metrics as vm
from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.autoscale import ReplicaControl, ReplicaSignals
from rolloutpool.reconcile.caps import plan_controls
from rolloutpool.reconcile.control import MetricsRead, remember_read, window_seconds

__all__ = [
    "AdaptiveLaw",
    "EngineScrape",
    "RouterScrape",
    "TargetChange",
    "bench_pool_spec",
    "parse_engine_scrape",
    "parse_router_scrape",
    "rate_over",
    "samples",
    "status_document",
]

_ROUTER = "rolloutpool_router_"


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of every sample of a Prometheus text exposition (prometheus_client's parser)."""
    return [(x.name, x.labels, x.value) for f in text_string_to_metric_families(text) for x in f.samples]


@dataclass(frozen=True)
class EngineScrape:
    """What one engine's ``/metrics`` said at one instant."""

    kv_usage: float | None
    waiting: float | None
    preemptions_total: float
    prefix_hits_total: float
    prefix_queries_total: float
    kv_capacity_tokens: int | None


@dataclass(frozen=True)
class RouterScrape:
    """What the router's ``/metrics`` said at one instant, per replica where it is per replica."""

    live_sessions: dict[str, int]
    reprefilled_tokens_total: dict[str, float]
    queue_depth: int
    held_turns: dict[str, int] = field(default_factory=dict)
    """Turns the router holds for room, per replica."""


def parse_engine_scrape(text: str) -> EngineScrape:
    """An engine-sim's (or vLLM's) exposition as the signals the operator queries (pure)."""
    gauges: dict[str, float] = {}
    counters = {"preemptions": 0.0, "hits": 0.0, "queries": 0.0}
    capacity: int | None = None
    for name, labels, value in samples(text):
        if name == vm.KV_CACHE_USAGE:  # max over a pod's engines, as the operator's query
            gauges[name] = max(gauges.get(name, 0.0), value)
        elif name == vm.NUM_REQUESTS_WAITING:  # summed over a pod's engines
            gauges[name] = gauges.get(name, 0.0) + value
        elif name == vm.total(vm.NUM_PREEMPTIONS):
            counters["preemptions"] += value
        elif name == vm.total(vm.PREFIX_CACHE_HITS):
            counters["hits"] += value
        elif name == vm.total(vm.PREFIX_CACHE_QUERIES):
            counters["queries"] += value
        elif name == vm.CACHE_CONFIG_INFO:
            try:
                capacity = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
            except (KeyError, ValueError):
                capacity = None
    return EngineScrape(
        kv_usage=gauges.get(vm.KV_CACHE_USAGE),
        waiting=gauges.get(vm.NUM_REQUESTS_WAITING),
        preemptions_total=counters["preemptions"],
        prefix_hits_total=counters["hits"],
        prefix_queries_total=counters["queries"],
        kv_capacity_tokens=capacity,
    )


def parse_router_scrape(text: str) -> RouterScrape:
    """Our router's exposition: live sessions, kept prefixes' re-prefill, held turns per replica, the queue (pure)."""
    live: dict[str, int] = {}
    reprefill: dict[str, float] = {}
    queue = 0
    held: dict[str, int] = {}
    for name, labels, value in samples(text):
        replica = labels.get("replica")
        if name == f"{_ROUTER}live_sessions" and replica is not None:
            live[replica] = round(value)
        elif name == f"{_ROUTER}reprefilled_tokens_total" and replica is not None:
            reprefill[replica] = reprefill.get(replica, 0.0) + value
        elif name == f"{_ROUTER}queue_depth":
            queue = round(value)
        elif name == f"{_ROUTER}held_turns" and replica is not None:
            held[replica] = round(value)
    return RouterScrape(live_sessions=live, reprefilled_tokens_total=reprefill, queue_depth=queue, held_turns=held)


def rate_over(points: deque[tuple[float, float]]) -> float | None:
    """Per-second increase between the first and last ``(t, counter)`` points; None under two points (pure).

    A counter that went down (a restarted process) counts from zero, as Prometheus' ``rate`` does.
    """
    if len(points) < 2:
        return None
    (t0, v0), (t1, v1) = points[0], points[-1]
    span = t1 - t0
    if span <= 0:
        return None
    return (v1 - v0 if v1 >= v0 else v1) / span


def bench_pool_spec(
    *,
    replicas: int,
    max_model_len: int,
    kv_capacity_tokens: int,
    time_scale: float,
    interval_seconds: int = 15,
) -> RolloutPoolSpec:
    """The RolloutPool the bench fleet would be: simulated engines, autoscaling on with the defaults (pure).

    The Prometheus URL is never read (the bench scrapes the processes itself); the operator
    needs one to run the law at all.
    """
    return RolloutPoolSpec.model_validate(
        {
            "replicas": replicas,
            "engine": {
                "kind": "simulated",
                "model": "Qwen/Qwen3-8B",
                "maxModelLen": max_model_len,
                "kvCapacityTokens": kv_capacity_tokens,
                "simulator": {"timeScale": time_scale},
            },
            "autoscaling": {
                "enabled": True,
                "prometheusUrl": "http://prometheus.invalid:9090",
                "intervalSeconds": interval_seconds,
            },
        }
    )


@dataclass(frozen=True)
class TargetChange:
    """One replica's working-set target or quarantine moved at one control step."""

    t: float
    """Simulated seconds since the loop started."""
    replica: str
    target: float | None
    previous_target: float | None
    quarantined: bool
    reason: str | None
    live: int | None


def status_document(names: list[str], controls: Mapping[str, ReplicaControl]) -> dict[str, Any]:
    """The ``status`` the operator would write for these controls (``replicaStatus`` entries) (pure)."""
    rows = []
    for index, name in enumerate(names):
        control = controls.get(name)
        if control is None:
            continue
        rows.append(
            {
                "name": name,
                "index": index,
                "target": control.target,
                "quarantined": control.quarantined,
                "reason": control.reason if control.quarantined else None,
            }
        )
    return {"replicaStatus": rows}


@dataclass
class AdaptiveLaw:
    """The operator's law over a bench fleet: scrapes in, controls out, one step per interval."""

    spec: RolloutPoolSpec
    names: list[str]
    controls: dict[str, ReplicaControl] = field(default_factory=dict)
    changes: list[TargetChange] = field(default_factory=list)
    steps: int = 0
    cuts: int = 0
    raises: int = 0
    quarantines: int = 0
    _counters: dict[str, dict[str, deque[tuple[float, float]]]] = field(default_factory=dict)

    @property
    def interval_s(self) -> float:
        """Simulated seconds between steps (``autoscaling.intervalSeconds``)."""
        return float(self.spec.autoscaling.interval_seconds)

    @property
    def window_s(self) -> float:
        """The rate window of the operator's queries, in simulated seconds (the engines' time, as the law's)."""
        return window_seconds(self.interval_s)

    def start(self, *, now: float) -> dict[str, ReplicaControl]:
        """The first status, before any metric: no target (the router's own)."""
        read = MetricsRead(signals={})
        memo = remember_read(spec=self.spec, read=read, now=now, clock=now, queued_sessions=None)
        assert memo.health is not None  # noqa: S101 - remember_read always judges
        return self._apply(
            plan_controls(
                spec=self.spec,
                replicas=self.names,
                signals={},
                previous=self.controls,
                health=memo.health,
                now=now,
            ),
            now=now,
            live={},
        )

    def _rate(self, name: str, key: str, now: float, value: float) -> float | None:
        points = self._counters.setdefault(name, {}).setdefault(key, deque())
        points.append((now, value))
        while len(points) > 2 and points[1][0] <= now - self.window_s + 1e-9:
            points.popleft()
        return rate_over(points)

    def signals(
        self, *, now: float, engines: Mapping[str, EngineScrape], router: RouterScrape
    ) -> dict[str, ReplicaSignals | None]:
        """What the operator's read would return for each replica at ``now`` (simulated seconds)."""
        signals: dict[str, ReplicaSignals | None] = {}
        for name in self.names:
            engine = engines.get(name)
            if engine is None:
                signals[name] = None
                continue
            hits = self._rate(name, "hits", now, engine.prefix_hits_total)
            queries = self._rate(name, "queries", now, engine.prefix_queries_total)
            reprefill = router.reprefilled_tokens_total.get(name)
            held = router.held_turns.get(name)
            signals[name] = ReplicaSignals(
                kv_usage=engine.kv_usage,
                preemptions_per_s=self._rate(name, "preemptions", now, engine.preemptions_total),
                waiting=engine.waiting,
                prefix_hit_ratio=hits / queries if hits is not None and queries else None,
                reprefill_tokens_per_s=None if reprefill is None else self._rate(name, "reprefill", now, reprefill),
                kv_capacity_tokens=engine.kv_capacity_tokens,
                live_sessions=router.live_sessions.get(name),
                held_turns=None if held is None else float(held),
                queued_sessions=router.queue_depth,
                sampled_at=now,
            )
        return signals

    def step(
        self, *, now: float, engines: Mapping[str, EngineScrape], router: RouterScrape
    ) -> dict[str, ReplicaControl]:
        """One step of the slow loop on these scrapes; returns every replica's control."""
        signals = self.signals(now=now, engines=engines, router=router)
        memo = remember_read(
            spec=self.spec, read=MetricsRead(signals=signals), now=now, clock=now, queued_sessions=router.queue_depth
        )
        assert memo.health is not None  # noqa: S101 - remember_read always judges
        controls = plan_controls(
            spec=self.spec,
            replicas=self.names,
            signals=memo.signals,
            previous=self.controls,
            health=memo.health,
            now=now,
        )
        self.steps += 1
        return self._apply(controls, now=now, live=router.live_sessions)

    def _apply(
        self, controls: dict[str, ReplicaControl], *, now: float, live: Mapping[str, int]
    ) -> dict[str, ReplicaControl]:
        for name, after in controls.items():
            before = self.controls.get(name)
            moved = before is None or before.target != after.target or before.quarantined != after.quarantined
            if before is not None and before.target is not None and after.target is not None:
                self.cuts += after.target < before.target
                self.raises += after.target > before.target
            if before is not None:
                self.quarantines += after.quarantined and not before.quarantined
            if moved:
                self.changes.append(
                    TargetChange(
                        t=now,
                        replica=name,
                        target=after.target,
                        previous_target=None if before is None else before.target,
                        quarantined=after.quarantined,
                        reason=after.reason,
                        live=live.get(name),
                    )
                )
        self.controls.update(controls)
        return dict(self.controls)

    def summary(self) -> dict[str, object]:
        """Steps, moves and the last targets (plain JSON data)."""
        targets = [c.target for c in self.controls.values() if c.target is not None]
        return {
            "steps": self.steps,
            "cuts": self.cuts,
            "raises": self.raises,
            "quarantines": self.quarantines,
            "final_targets": {n: c.target for n, c in self.controls.items()},
            "mean_final_target": sum(targets) / len(targets) if targets else math.nan,
        }
