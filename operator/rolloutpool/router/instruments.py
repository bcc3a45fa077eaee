"""Prometheus metrics of the router, on a per-app registry (``rolloutpool_router_*``).

Counters and histograms are updated where things happen. Gauges of the session
table (live sessions, caps, quarantine, readiness, queue depth) are read from the
table at scrape time by a collector, so they can never drift from it.

Two quarantine gauges, on purpose: ``rolloutpool_router_replica_quarantined`` is what the
router obeys (its own fast quarantine OR the operator's, from the pool's status), while
``rolloutpool_router_replica_pressure{replica, reason}`` is the router's OWN fast quarantine
only (a state set: 1 for the reason its ``PressureState`` holds the replica for, 0 for the
other reasons). The operator reads the latter back into ``status.replicaStatus[].routerQuarantined``;
reading the combined one would latch the operator's own decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rolloutpool.routing.pressure import PressureReason

__all__ = ["PREFIX", "PRESSURE_REASONS", "ReplicaGauges", "RouterMetrics", "TurnGauges"]

PREFIX = "rolloutpool_router_"

PRESSURE_REASONS: tuple[str, ...] = tuple(PressureReason)
"""Reasons of the router's fast quarantine (``routing.quarantine.PressureState``): always exposed, 0 or 1."""

_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)


@dataclass(frozen=True)
class ReplicaGauges:
    """Gauge values of one replica at scrape time."""

    name: str
    live: int
    cap: int | None
    quarantined: bool
    ready: bool
    draining: bool
    inflight: int
    pressure: str | None = None
    """Why the router's own fast loop quarantines the replica (``Evicting``...); None when it does not."""
    turns: TurnGauges | None = None
    """The turn scheduler's view of the replica (routing/workingset.py); None without it."""


@dataclass(frozen=True)
class TurnGauges:
    """One replica's working set, held turns and prefixes, and its cumulative turn decisions."""

    working_set: int
    budget: int | None
    held: int
    kept: int
    let_go: int
    decisions: dict[str, int]
    """Cumulative counts by decision: held, resumed, forced, let_go, moved."""
    let_go_reprefill: int = 0
    """Tokens re-prefilled by sessions whose prefix the working set let go (cumulative)."""


class _TableCollector(Collector):
    def __init__(self, replicas: Callable[[], Iterable[ReplicaGauges]], queue_depth: Callable[[], int]) -> None:
        self._replicas = replicas
        self._queue_depth = queue_depth

    def collect(self) -> Iterator[Metric]:
        gauges = {
            "live_sessions": GaugeMetricFamily(f"{PREFIX}live_sessions", "Live sessions held", labels=["replica"]),
            "session_cap": GaugeMetricFamily(
                f"{PREFIX}session_cap", "Live-session cap (+Inf when unlimited)", labels=["replica"]
            ),
            "quarantined": GaugeMetricFamily(
                f"{PREFIX}replica_quarantined", "1 while the replica takes no new sessions", labels=["replica"]
            ),
            "ready": GaugeMetricFamily(f"{PREFIX}replica_ready", "1 while the replica is ready", labels=["replica"]),
            "draining": GaugeMetricFamily(f"{PREFIX}replica_draining", "1 while draining", labels=["replica"]),
            "inflight": GaugeMetricFamily(f"{PREFIX}inflight_requests", "Requests being proxied", labels=["replica"]),
            "pressure": GaugeMetricFamily(
                f"{PREFIX}replica_pressure",
                "1 for the reason the router's own fast loop quarantines the replica (the operator's quarantine "
                "not included), 0 for the other reasons",
                labels=["replica", "reason"],
            ),
        }
        turns: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "working_set": GaugeMetricFamily(
                f"{PREFIX}working_set_tokens",
                "KV tokens of the replica's working set: generating sessions' contexts (with a turn's growth) and the "
                "idle sessions whose prefix is kept",
                labels=["replica"],
            ),
            "budget": GaugeMetricFamily(
                f"{PREFIX}working_set_budget_tokens",
                "KV tokens the working set may fill (target x capacity)",
                labels=["replica"],
            ),
            "held": GaugeMetricFamily(
                f"{PREFIX}held_turns", "Turns waiting for room in the working set", labels=["replica"]
            ),
            "kept": GaugeMetricFamily(
                f"{PREFIX}kept_sessions",
                "Sessions waiting on a tool whose prefix is kept (leases held)",
                labels=["replica"],
            ),
            "let_go": GaugeMetricFamily(
                f"{PREFIX}let_go_sessions",
                "Live sessions whose prefix is let go (the engine may evict it); their next turn needs room",
                labels=["replica"],
            ),
            "decisions": CounterMetricFamily(
                f"{PREFIX}turn_decisions",
                "Turn-level decisions: held (a turn waits for room), resumed (served when room freed), forced (served "
                "at the hold limit), let_go (an idle prefix dropped from the working set)",
                labels=["replica", "decision"],
            ),
            "let_go_reprefill": CounterMetricFamily(
                f"{PREFIX}let_go_reprefilled_tokens",
                "Tokens re-prefilled by returning sessions whose prefix the working set had let go (by decision; "
                "rolloutpool_router_reprefilled_tokens_total counts the evicted prefixes it kept)",
                labels=["replica"],
            ),
        }
        seen_turns = False
        for r in self._replicas():
            if r.turns is not None:
                seen_turns = True
                t = r.turns
                turns["working_set"].add_metric([r.name], t.working_set)
                if t.budget is not None:
                    turns["budget"].add_metric([r.name], t.budget)
                turns["held"].add_metric([r.name], t.held)
                turns["kept"].add_metric([r.name], t.kept)
                turns["let_go"].add_metric([r.name], t.let_go)
                for decision, count in t.decisions.items():
                    turns["decisions"].add_metric([r.name, decision], count)
                turns["let_go_reprefill"].add_metric([r.name], t.let_go_reprefill)
            gauges["live_sessions"].add_metric([r.name], r.live)
            gauges["session_cap"].add_metric([r.name], math.inf if r.cap is None else r.cap)
            gauges["quarantined"].add_metric([r.name], float(r.quarantined))
            gauges["ready"].add_metric([r.name], float(r.ready))
            gauges["draining"].add_metric([r.name], float(r.draining))
            gauges["inflight"].add_metric([r.name], r.inflight)
            reasons: list[str] = list(PRESSURE_REASONS)
            if r.pressure is not None and r.pressure not in reasons:
                reasons.append(r.pressure)  # a reason added later is exposed, not hidden
            for reason in reasons:
                gauges["pressure"].add_metric([r.name, reason], float(reason == r.pressure))
        yield from gauges.values()
        if seen_turns:
            yield from turns.values()
        depth = GaugeMetricFamily(f"{PREFIX}queue_depth", "New sessions waiting for a slot")
        depth.add_metric([], self._queue_depth())
        yield depth


class RouterMetrics:
    """All router metrics, registered on their own registry (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.placements = Counter(
            f"{PREFIX}placements", "Sessions placed on a replica", ["replica", "kind"], registry=r
        )
        self.releases = Counter(f"{PREFIX}releases", "Sessions released, by how", ["how"], registry=r)
        self.expiries = Counter(f"{PREFIX}expiries", "Sessions released by idle expiry", registry=r)
        self.implicit = Counter(
            f"{PREFIX}implicit_sessions",
            "Sessionless generation requests by what their prefix matched (created, matched, forked, yielded)",
            ["outcome"],
            registry=r,
        )
        self.implicit_entries = Gauge(
            f"{PREFIX}implicit_index_entries", "Conversation-prefix digests held for sessionless clients", registry=r
        )
        self.rejections = Counter(
            f"{PREFIX}admission_rejections", "New sessions refused by the admission queue", ["reason"], registry=r
        )
        self.queue_wait = Histogram(
            f"{PREFIX}queue_wait_seconds",
            "Time new sessions waited in the admission queue",
            ["outcome"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.hold_wait = Histogram(
            f"{PREFIX}hold_wait_seconds",
            "Time held turns of live sessions waited for room in their replica's working set",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.quarantines = Counter(
            f"{PREFIX}quarantines", "Times a replica entered quarantine", ["replica", "reason"], registry=r
        )
        self.reprefilled_tokens = Counter(
            f"{PREFIX}reprefilled_tokens",
            "Cached tokens returning sessions lost to eviction (re-prefilled) although the router kept their prefix",
            ["replica"],
            registry=r,
        )
        self.renewals = Counter(
            f"{PREFIX}renewals",
            "Prefix renewals of idle live sessions sent to a replica, by outcome (ok, failed)",
            ["replica", "outcome"],
            registry=r,
        )
        self.upstream_errors = Counter(
            f"{PREFIX}upstream_errors", "Failed upstream requests", ["replica", "kind"], registry=r
        )
        self.missing_cached_tokens = Counter(
            f"{PREFIX}responses_without_cached_tokens",
            "Responses whose usage.prompt_tokens_details carried no cached_tokens (re-prefill undetectable)",
            ["replica"],
            registry=r,
        )
        self.engine_warnings = Gauge(
            f"{PREFIX}replica_engine_warning",
            "1 while a replica's engine blinds the re-prefill signal (NoCachedTokens, PrefixCachingOff)",
            ["replica", "warning"],
            registry=r,
        )
        self.scrape_failures = Counter(
            f"{PREFIX}scrape_failures", "Failed scrapes of a replica's /metrics", ["replica"], registry=r
        )
        self.request_latency = Histogram(
            f"{PREFIX}request_duration_seconds",
            "Time to answer a request",
            ["endpoint", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def watch(self, replicas: Callable[[], Iterable[ReplicaGauges]], queue_depth: Callable[[], int]) -> None:
        """Expose table gauges read at scrape time."""
        self.registry.register(_TableCollector(replicas, queue_depth))

    def render(self) -> bytes:
        """The text exposition."""
        return generate_latest(self.registry)
