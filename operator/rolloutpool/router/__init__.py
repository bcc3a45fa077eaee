"""The session router: an OpenAI-compatible reverse proxy that places sessions on engine replicas (I/O).

Thin I/O around :mod:`rolloutpool.routing`: the pure session table, the
``SessionAware`` policy and the quarantine state decide; this package proxies
requests, queues new sessions when no replica may take one, scrapes each replica's
``/metrics`` and reads ``cached_tokens`` of every response (the fast control loop),
serves Prometheus metrics and an admin API, and snapshots its session table so a
restart loses nothing. Entry points: :func:`build_app` for tests and embedding,
:func:`run_router` for the command line.
"""

from __future__ import annotations

from rolloutpool.router.app import build_app, run_router
from rolloutpool.router.config import ReplicaSpec, RouterConfig, parse_replica

__all__ = ["ReplicaSpec", "RouterConfig", "build_app", "parse_replica", "run_router"]
