"""Type aliases shared by the router modules (one place, like starlette's ``types``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, TypeAlias

import aiohttp

from rolloutpool.routing.discovery import OperatorLimit, ReplicaEvent

__all__ = ["ClientFactory", "Clock", "Discovery", "JSONObject", "LimitsSource"]

JSONObject: TypeAlias = dict[str, Any]
"""A decoded JSON object (request or response body)."""

Clock: TypeAlias = Callable[[], float]
"""Wall-clock seconds (``time.time``); injected so tests and snapshots agree on one clock."""

ClientFactory: TypeAlias = Callable[[], aiohttp.ClientSession]
"""Builds the upstream HTTP client (the injectable transport); called once at startup."""

Discovery: TypeAlias = Callable[[], AsyncIterator[ReplicaEvent]]
"""Starts a discovery source; its events add and remove replicas at run time."""

LimitsSource: TypeAlias = Callable[[], AsyncIterator[dict[str, OperatorLimit]]]
"""Starts a source of the operator's per-replica limits (the RolloutPool status)."""
