"""The admin API, behind a bearer token: replica state and draining.

- ``GET /admin/replicas``: per replica its URL, live sessions, cap, quarantine and
  reason, readiness, draining, in-flight requests and the last scraped signals.
- ``POST /admin/replicas/{name}/drain`` (``?undo=true`` to undo): no new sessions,
  existing ones stay until released.

Without ``admin_token`` configured the admin API is disabled (403). The token is
compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import json

from aiohttp import web

from rolloutpool.router.errors import error_response
from rolloutpool.router.sessions import SessionManager

__all__ = ["AdminAPI"]


class AdminAPI:
    """Handlers of ``/admin``."""

    def __init__(self, manager: SessionManager, token: str | None) -> None:
        self.manager = manager
        self._token = token

    def _denied(self, request: web.Request) -> web.Response | None:
        if not self._token:  # None or empty: disabled (an empty token would match "Bearer ")
            return error_response(403, "The admin API is disabled: the router has no admin token configured.")
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token.encode()):
            return error_response(
                401, "A valid admin bearer token is required.", headers={"WWW-Authenticate": "Bearer"}
            )
        return None

    async def replicas(self, request: web.Request) -> web.Response:
        """``GET /admin/replicas``."""
        if (denied := self._denied(request)) is not None:
            return denied
        rows = []
        for replica in self.manager.table.replicas.values():
            runtime = self.manager.runtime[replica.name]
            rows.append(
                {
                    "name": replica.name,
                    "url": runtime.spec.url,
                    "live_sessions": replica.live,
                    "cap": replica.cap,
                    "quarantined": replica.quarantined,
                    "quarantine_reason": runtime.pressure.reason,
                    "ready": replica.ready,
                    "unready_reason": runtime.unready_reason,
                    "draining": replica.draining,
                    "inflight": replica.inflight,
                    "capacity_tokens": runtime.capacity_tokens,
                    "block_size": runtime.block_size,
                    "last_scrape": runtime.last_scrape,
                    "scrape_failures": runtime.scrape_failures,
                    "signals": runtime.signals,
                }
            )
        body = {"replicas": rows, "sessions": len(self.manager.table.sessions), "queue_depth": self.manager.queue_depth}
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def drain(self, request: web.Request) -> web.Response:
        """``POST /admin/replicas/{name}/drain``."""
        if (denied := self._denied(request)) is not None:
            return denied
        name = request.match_info["name"]
        if name not in self.manager.table.replicas:
            return error_response(404, f"Replica {name!r} is not known to this router.", param="name")
        draining = request.query.get("undo", "").lower() not in {"1", "true", "yes"}
        self.manager.set_draining(name, draining)
        replica = self.manager.replica(name)
        body = {"name": name, "draining": replica.draining, "live_sessions": replica.live}
        return web.Response(text=json.dumps(body), content_type="application/json")
