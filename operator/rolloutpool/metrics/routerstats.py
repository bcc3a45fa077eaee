"""Live sessions, queue depth and the routers' own quarantines straight from the router pods' ``/metrics``.

The operator shows these in the pool's status (printer columns ``sessions`` and ``quarantined``,
``replicaStatus[].routerQuarantined``); it scrapes the routers itself instead of asking Prometheus
so the numbers are current and do not depend on Prometheus being up. Routers that do not answer
are skipped, and counted: what they would report is simply absent (synchronous I/O).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from rolloutpool.api.status import ReplicaTurns
from rolloutpool.metrics.prom import redact_url

__all__ = ["RouterSample", "RouterStats", "metrics_url", "parse_router_metrics", "read_router_stats"]

_LIVE = "rolloutpool_router_live_sessions"
_QUEUE = "rolloutpool_router_queue_depth"
_PRESSURE = "rolloutpool_router_replica_pressure"
_ENGINE_WARNING = "rolloutpool_router_replica_engine_warning"
_TURNS = {
    "rolloutpool_router_held_turns": 0,
    "rolloutpool_router_kept_sessions": 1,
    "rolloutpool_router_let_go_sessions": 2,
}
_DECISIONS = "rolloutpool_router_turn_decisions_total"
_MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class RouterStats:
    """Sessions summed over the router pods that answered."""

    live_sessions: dict[str, int]
    """Replica (engine pod) name -> live sessions, summed over routers."""
    queued_sessions: int
    """New sessions waiting in the routers' admission queues."""
    reachable: int
    """Routers that answered (the others are not in the sums)."""
    errors: tuple[str, ...] = field(default=())
    """Why each unreachable router was skipped (URLs without credentials)."""
    quarantined: dict[str, str] = field(default_factory=dict)
    """Replica -> reason, for each replica that an answering router quarantines by itself (its fast
    loop; ``rolloutpool_router_replica_pressure``). The first router in URL order names the reason."""
    engine_warnings: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Replica -> what its engine does not report, per any answering router (``NoCachedTokens``,
    ``PrefixCachingOff``; ``rolloutpool_router_replica_engine_warning``)."""
    turns: dict[str, ReplicaTurns] = field(default_factory=dict)
    """Replica -> held turns, kept and let-go prefixes and moves (``rolloutpool_router_held_turns`` ...)."""


@dataclass(frozen=True)
class RouterSample:
    """What one router's exposition says."""

    live_sessions: dict[str, int]
    """Replica -> live sessions."""
    queued_sessions: int
    """Admission queue depth."""
    quarantined: dict[str, str] = field(default_factory=dict)
    """Replica -> reason, while the router's own fast loop quarantines it."""
    engine_warnings: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Replica -> engine warnings the router raises (sorted)."""
    turns: dict[str, ReplicaTurns] = field(default_factory=dict)
    """Replica -> the router's turn-scheduling gauges and its moves."""


def _add(a: ReplicaTurns | None, b: ReplicaTurns) -> ReplicaTurns:
    return b if a is None else ReplicaTurns(*(x + y for x, y in zip(a, b, strict=True)))


def metrics_url(url: str) -> str:
    """The ``/metrics`` URL of a router given its base URL or its metrics URL (pure)."""
    return url if urlsplit(url).path.rstrip("/").endswith("/metrics") else f"{url.rstrip('/')}/metrics"


def parse_router_metrics(text: str) -> RouterSample:
    """Live sessions per replica, queue depth and the router's own quarantines from its exposition (pure).

    A replica is quarantined by the router while a ``rolloutpool_router_replica_pressure`` sample of
    it is positive; that sample's ``reason`` label says why. Raises ``ValueError`` when the text is
    not a Prometheus exposition.
    """
    live: dict[str, int] = {}
    queued = 0
    quarantined: dict[str, str] = {}
    warnings: dict[str, set[str]] = {}
    turns: dict[str, list[int]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            replica = sample.labels.get("replica")
            if replica is not None and sample.name in _TURNS:
                turns.setdefault(replica, [0, 0, 0, 0])[_TURNS[sample.name]] += round(sample.value)
            elif replica is not None and sample.name == _DECISIONS and sample.labels.get("decision") == "moved":
                turns.setdefault(replica, [0, 0, 0, 0])[3] += round(sample.value)
            elif sample.name == _LIVE and replica is not None:
                live[replica] = live.get(replica, 0) + round(sample.value)
            elif sample.name == _QUEUE:
                queued += round(sample.value)
            elif sample.name == _PRESSURE and replica is not None and sample.value > 0:
                quarantined.setdefault(replica, sample.labels.get("reason") or "Unknown")
            elif sample.name == _ENGINE_WARNING and replica is not None and sample.value > 0:
                warnings.setdefault(replica, set()).add(sample.labels.get("warning") or "Unknown")
    return RouterSample(
        live_sessions=live,
        queued_sessions=queued,
        quarantined=quarantined,
        engine_warnings={r: tuple(sorted(w)) for r, w in warnings.items()},
        turns={r: ReplicaTurns(*t) for r, t in turns.items()},
    )


def _fetch(url: str, *, timeout_seconds: float) -> str:
    # pod IPs are scraped directly: no proxy from the environment applies
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout_seconds) as response:
        body: bytes = response.read(_MAX_BYTES)
    return body.decode("utf-8", errors="replace")


def read_router_stats(urls: Sequence[str], *, timeout_seconds: float = 2.0) -> RouterStats:
    """Scrape each router's ``/metrics`` in turn; live sessions per replica and queue depth summed.

    Replicas that any answering router quarantines by itself come with the first such router's reason.
    """
    live: dict[str, int] = {}
    queued = 0
    quarantined: dict[str, str] = {}
    warnings: dict[str, tuple[str, ...]] = {}
    turns: dict[str, ReplicaTurns] = {}
    reachable = 0
    errors: list[str] = []
    for url in urls:
        target = metrics_url(url)
        if urlsplit(target).scheme not in ("http", "https"):
            errors.append(f"{redact_url(target)}: not an http(s) URL")
            continue
        try:
            sample = parse_router_metrics(_fetch(target, timeout_seconds=timeout_seconds))
        except (urllib.error.URLError, OSError, ValueError, IndexError, KeyError) as err:
            reason = getattr(err, "reason", None) or type(err).__name__
            errors.append(f"{redact_url(target)}: {reason}")
            continue
        reachable += 1
        queued += sample.queued_sessions
        for replica, count in sample.live_sessions.items():
            live[replica] = live.get(replica, 0) + count
        for replica, reason in sample.quarantined.items():
            quarantined.setdefault(replica, reason)
        for replica, found in sample.engine_warnings.items():
            warnings[replica] = tuple(sorted({*warnings.get(replica, ()), *found}))
        for replica, counts in sample.turns.items():
            turns[replica] = _add(turns.get(replica), counts)
    return RouterStats(
        live_sessions=live,
        queued_sessions=queued,
        reachable=reachable,
        errors=tuple(errors),
        quarantined=quarantined,
        engine_warnings=warnings,
        turns=turns,
    )
