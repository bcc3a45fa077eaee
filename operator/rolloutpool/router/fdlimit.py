"""File descriptors: the router raises its own limit at start and says when it runs out.

Every client connection and every keep-alive connection to an engine is a descriptor. Out of them,
the event loop cannot accept (uvloop closes the new connection at once, silently) and the upstream
client cannot connect: the router fails quietly. So :func:`raise_nofile_limit` lifts the soft
``RLIMIT_NOFILE`` to the hard limit at start (the usual soft 1024 is a few hundred sessions), and
:class:`FdWatch` samples the descriptors in use twice a second: near the limit (or unable even to
list them) it counts an exhaustion and logs a warning (at most one a minute). Its gauges and counter
are on ``/metrics``: ``rolloutpool_router_open_fds``, ``rolloutpool_router_max_fds``,
``rolloutpool_router_fd_exhaustions_total``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rolloutpool.router.instruments import PREFIX

__all__ = ["FdWatch", "open_fds", "raise_nofile_limit"]

_log = logging.getLogger(__name__)

_CEILING = 1 << 20
"""Where the soft limit stops when the hard one is unlimited (the kernel's usual ``nr_open``)."""
_MARGIN = 16
"""Descriptors left below the limit that already count as running out (the next accept fails)."""


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; returns the (soft, hard) in force, logged."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            _log.info("Raised open-file limit soft=%d->%d hard=%s", soft, target, hard)
            soft = target
        except (ValueError, OSError) as err:
            _log.warning("Failed to raise open-file limit soft=%d hard=%s error=%s", soft, hard, err)
    return soft, hard


def open_fds() -> int | None:
    """Descriptors this process has open; None when they cannot even be listed (none left to do it)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listing them
    except OSError as err:
        if err.errno in (errno.EMFILE, errno.ENFILE):
            return None
        raise


class FdWatch(Collector):
    """Samples the descriptors in use; counts and logs running out of them."""

    def __init__(self, registry: CollectorRegistry, *, interval_s: float = 0.5, warn_every_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self.warn_every_s = warn_every_s
        self.exhaustions = Counter(
            f"{PREFIX}fd_exhaustions",
            "Samples that found the router at its open-file limit (connections refused or failing)",
            registry=registry,
        )
        self.exhaustions.inc(0)
        self._warned_at: float | None = None
        registry.register(self)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """``open_fds`` and ``max_fds``, read at scrape time."""
        used = open_fds()
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        yield GaugeMetricFamily(f"{PREFIX}open_fds", "File descriptors open", value=-1 if used is None else used)
        yield GaugeMetricFamily(f"{PREFIX}max_fds", "Soft open-file limit (RLIMIT_NOFILE)", value=limit)

    def sample(self, *, now: float) -> bool:
        """One look; whether the router was out of descriptors (counted, and warned about once a minute)."""
        used = open_fds()
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        out = used is None or (limit != resource.RLIM_INFINITY and used >= limit - _MARGIN)
        if out:
            self.exhaustions.inc()
            if self._warned_at is None or now - self._warned_at >= self.warn_every_s:
                self._warned_at = now
                _log.warning(
                    "Ran out of file descriptors open=%s limit=%d: new connections are refused; raise the hard "
                    "RLIMIT_NOFILE (ulimit -n) of the router",
                    "all" if used is None else used,
                    limit,
                )
        return out

    async def run(self) -> None:
        """Sample forever (cancelled on shutdown)."""
        loop = asyncio.get_running_loop()
        while True:
            self.sample(now=loop.time())
            await asyncio.sleep(self.interval_s)
