"""Live sessions and queue depth straight from the router pods' ``/metrics`` (synchronous I/O).

The operator shows these in the pool's status (printer column ``sessions``); it scrapes the
routers itself instead of asking Prometheus so the numbers are current and do not depend
on Prometheus being up. Routers that do not answer are skipped, and counted.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from rolloutpool.metrics.prom import redact_url

__all__ = ["RouterStats", "metrics_url", "parse_router_metrics", "read_router_stats"]

_LIVE = "rolloutpool_router_live_sessions"
_QUEUE = "rolloutpool_router_queue_depth"
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


def metrics_url(url: str) -> str:
    """The ``/metrics`` URL of a router given its base URL or its metrics URL (pure)."""
    return url if urlsplit(url).path.rstrip("/").endswith("/metrics") else f"{url.rstrip('/')}/metrics"


def parse_router_metrics(text: str) -> tuple[dict[str, int], int]:
    """Live sessions per replica and queue depth from one router's exposition text (pure).

    Raises ``ValueError`` when the text is not a Prometheus exposition.
    """
    live: dict[str, int] = {}
    queued = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == _LIVE and "replica" in sample.labels:
                replica = sample.labels["replica"]
                live[replica] = live.get(replica, 0) + round(sample.value)
            elif sample.name == _QUEUE:
                queued += round(sample.value)
    return live, queued


def _fetch(url: str, *, timeout_seconds: float) -> str:
    # pod IPs are scraped directly: no proxy from the environment applies
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout_seconds) as response:
        body: bytes = response.read(_MAX_BYTES)
    return body.decode("utf-8", errors="replace")


def read_router_stats(urls: Sequence[str], *, timeout_seconds: float = 2.0) -> RouterStats:
    """Scrape each router's ``/metrics`` in turn and sum live sessions per replica and queue depth."""
    live: dict[str, int] = {}
    queued = 0
    reachable = 0
    errors: list[str] = []
    for url in urls:
        target = metrics_url(url)
        if urlsplit(target).scheme not in ("http", "https"):
            errors.append(f"{redact_url(target)}: not an http(s) URL")
            continue
        try:
            replica_live, replica_queue = parse_router_metrics(_fetch(target, timeout_seconds=timeout_seconds))
        except (urllib.error.URLError, OSError, ValueError, IndexError, KeyError) as err:
            reason = getattr(err, "reason", None) or type(err).__name__
            errors.append(f"{redact_url(target)}: {reason}")
            continue
        reachable += 1
        queued += replica_queue
        for replica, count in replica_live.items():
            live[replica] = live.get(replica, 0) + count
    return RouterStats(live_sessions=live, queued_sessions=queued, reachable=reachable, errors=tuple(errors))
