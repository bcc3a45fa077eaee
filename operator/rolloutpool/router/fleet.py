"""N routers acting as one: every session has one owner router, the others forward to it.

Each router of a fleet places sessions only on the engines assigned to it (by the operator's
annotation ``rolloutpool.io/router``, or a static split on the command line), so an engine's
live count and cap are kept by exactly one router and caps hold fleet-wide. A session's owner
is given by a consistent-hash ring whose points are the engines of the ready routers
(:mod:`rolloutpool.routing.fleetview`):
a router that receives a request of a session it does not own forwards the raw request to the
owner and relays its answer byte for byte — at most one extra hop, since a forwarded request
(header ``X-RolloutPool-Forwarded``) is always served where it lands, even when the two
routers disagree about the ring for a moment. Requests without a session id are served locally.
A forwarded request proves it comes from a peer: it carries ``X-RolloutPool-Peer-Auth``, a key
derived from the fleet's shared admin token (:func:`peer_key`); a request that claims to be
forwarded without it is refused (403), so a client cannot pin one session on several engines.

When the ring changes (a router joins, leaves or dies) each router releases the sessions it no
longer owns (``how="moved"``); their next turn is placed once by the new owner (one re-prefill
each) and nothing is counted twice. An engine that leaves a router's assignment leaves its
table like a lost replica.

:class:`Fleet` plugs into an application with :meth:`Fleet.install`: a middleware forwards
requests whose session id is in a header, the ``/finish_session`` query or the
``/v1/sessions/{id}`` path before any body is parsed; the proxy calls
:meth:`Fleet.forward_if_foreign` for ids found in a body. Its :meth:`Fleet.discovery` is the
router's replica discovery (the engines of this router, from the fleet views).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, TypeAlias

import aiohttp
from aiohttp import web
from prometheus_client import Counter, Gauge

from rolloutpool.router.errors import error_response
from rolloutpool.routing.discovery import ReplicaEvent
from rolloutpool.routing.fleetview import FleetView

if TYPE_CHECKING:
    from rolloutpool.router.proxy import Proxy
    from rolloutpool.router.sessions import SessionManager

__all__ = ["FORWARDED_HEADER", "PEER_AUTH_HEADER", "Fleet", "FleetSource", "peer_key", "static_source"]

_log = logging.getLogger(__name__)

FORWARDED_HEADER = "X-RolloutPool-Forwarded"
"""Set (to the sender's name) on a request forwarded to its owner; such a request is never forwarded again."""

PEER_AUTH_HEADER = "X-RolloutPool-Peer-Auth"
"""The proof a forwarded request comes from a router of the fleet (:func:`peer_key`); never sent to an engine."""


def peer_key(admin_token: str) -> str:
    """The key routers of one fleet authenticate forwarded requests with: derived, so the admin token never travels."""
    return hmac.new(admin_token.encode(), b"rolloutpool-fleet-peer-v1", hashlib.sha256).hexdigest()


FleetSource: TypeAlias = Callable[[], AsyncIterator[FleetView]]
"""Starts a source of fleet views (Kubernetes pods, or one static view)."""

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"}
)
_LOCAL_PATHS = frozenset({"/metrics", "/healthz", "/readyz", "/health", "/v1/models"})


def static_source(view: FleetView) -> FleetSource:
    """A source that yields one fixed view (routers given each other's URLs on the command line)."""

    async def source() -> AsyncIterator[FleetView]:
        yield view
        await asyncio.Event().wait()  # the view never changes; discovery waits until shutdown

    return source


class Fleet:
    """One router's membership in a fleet: the ring, forwarding, and its share of the engines."""

    def __init__(
        self,
        *,
        self_name: str,
        source: FleetSource,
        admin_token: str | None,
        session_header: str = "X-Session-ID",
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 600.0,
        sweep_interval_s: float = 5.0,
    ) -> None:
        if not self_name:
            raise ValueError("self_name: a router of a fleet needs its own name")
        if not admin_token:
            raise ValueError(
                "a router of a fleet needs the admin token (--admin-token-file, the same on every router): peers "
                "authenticate the requests they forward to each other with it"
            )
        self.self_name = self_name
        self._peer_key = peer_key(admin_token)
        self.session_header = session_header
        self.view = FleetView(owners={}, peers={})
        self.manager: SessionManager | None = None
        self._source = source
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._sweep_interval_s = sweep_interval_s
        self._client: aiohttp.ClientSession | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._forwarded: Counter | None = None
        self._members: Gauge | None = None

    # -- wiring -------------------------------------------------------------------------

    def install(self, app: web.Application, *, manager: SessionManager, proxy: Proxy) -> None:
        """Add the forwarding middleware, the proxy's hook, metrics, startup and cleanup to ``app``."""
        self.manager = manager
        proxy.fleet = self
        app.middlewares.append(self.middleware)
        registry = manager.metrics.registry
        self._forwarded = Counter(
            "rolloutpool_router_forwarded_requests",
            "Requests forwarded to the router owning their session",
            ["peer", "outcome"],
            registry=registry,
        )
        self._members = Gauge("rolloutpool_router_fleet_members", "Routers on the session ring", registry=registry)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)

    async def _start(self, _: web.Application) -> None:
        # the bytes are relayed as they come: no decompression, no re-encoding
        self._client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="rolloutpool-router-fleet-sweep")

    async def _stop(self, _: web.Application) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._client is not None:
            await self._client.close()

    # -- the ring -----------------------------------------------------------------------

    def owner(self, session_id: str) -> str | None:
        """The router owning ``session_id``; None on an empty ring (then this router serves it)."""
        return self.view.owner(session_id)

    def owns(self, session_id: str) -> bool:
        """Whether this router serves ``session_id`` itself."""
        owner = self.owner(session_id)
        return owner is None or owner == self.self_name

    async def discovery(self) -> AsyncIterator[ReplicaEvent]:
        """This router's engines as replica events, from the fleet views; ``Synced`` after the first view."""
        synced = False
        async for view in self._source():
            before = self.view
            self.view = view
            if self._members is not None:
                self._members.set(len(view.peers))
            for name in sorted(set(before.engines) - set(view.engines)):
                yield ReplicaEvent(name, None, False, "NotAssigned")
            for name, event in sorted(view.engines.items()):
                if before.engines.get(name) != event:
                    yield event
            first, synced = not synced, True
            if first:
                yield ReplicaEvent("", None, False, "Synced")  # the snapshot is restored before we resume
            if first or view.owners != before.owners:
                _log.info(
                    "Changed session ring router=%s members=%s engines=%d",
                    self.self_name,
                    ",".join(f"{m}:{list(view.owners.values()).count(m)}" for m in sorted(view.peers)),
                    len(view.engines),
                )
                self.sweep()

    def sweep(self) -> list[str]:
        """Release the idle sessions this router no longer owns; returns their ids."""
        manager = self.manager
        if manager is None:
            return []
        moved = [sid for sid in list(manager.table.sessions) if not self.owns(sid) and not manager.busy(sid)]
        for sid in moved:
            manager.release(sid, how="moved")
        if moved:
            _log.info("Released sessions owned elsewhere router=%s count=%d", self.self_name, len(moved))
        return moved

    async def _sweep_loop(self) -> None:
        while True:  # catches sessions that were busy at a ring change, or forwarded here during one
            await asyncio.sleep(self._sweep_interval_s)
            self.sweep()

    # -- forwarding ---------------------------------------------------------------------

    def _key(self, request: web.Request) -> str | None:
        """The session id of a request when it is known without reading the body."""
        value = request.headers.get(self.session_header)
        if value and value.strip():
            return value.strip()
        path = request.path
        if path == "/finish_session":
            return request.query.get("session_id") or None
        prefix = "/v1/sessions/"
        if path.startswith(prefix) and len(path) > len(prefix):
            return request.match_info.get("session_id") or path[len(prefix) :]
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """Forward a request of a session owned by another router; serve everything else here."""
        if FORWARDED_HEADER in request.headers:
            given = request.headers.get(PEER_AUTH_HEADER, "")
            if not hmac.compare_digest(given.encode(), self._peer_key.encode()):
                self._count("unknown", "refused")
                return error_response(
                    403, f"{FORWARDED_HEADER} is reserved for the routers of the fleet (no valid {PEER_AUTH_HEADER})."
                )
            return await handler(request)
        if request.path in _LOCAL_PATHS or request.path.startswith("/admin"):
            return await handler(request)
        key = self._key(request)
        if key is None and request.method == "POST" and request.path in {"/v1/sessions", "/finish_session"}:
            key = await self._body_key(request)
        if key is not None:
            forwarded = await self.forward_if_foreign(request, key)
            if forwarded is not None:
                return forwarded
        return await handler(request)

    async def _body_key(self, request: web.Request) -> str | None:
        """``session_id`` of a small JSON body (``POST /v1/sessions``, ``/finish_session``); None otherwise."""
        if request.content_length is not None and request.content_length > 65536:
            return None
        try:
            body = json.loads(await request.read() or b"{}")
        except (UnicodeDecodeError, ValueError, web.HTTPException):
            return None  # the handler answers the bad body
        sid = body.get("session_id") if isinstance(body, dict) else None
        return sid if isinstance(sid, str) and sid else None

    async def forward_if_foreign(self, request: web.Request, session_id: str) -> web.StreamResponse | None:
        """The owner's answer when another router owns ``session_id``; None when this router serves it."""
        if FORWARDED_HEADER in request.headers:
            return None
        owner = self.owner(session_id)
        if owner is None or owner == self.self_name:
            return None
        url = self.view.peers.get(owner)
        if url is None:
            return None
        return await self._forward(request, owner, url)

    async def _forward(self, request: web.Request, owner: str, base_url: str) -> web.StreamResponse:
        if self._client is None:
            raise RuntimeError("the fleet forwards only between startup and cleanup")
        body = await request.read()
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _HOP_BY_HOP | {"content-length"} and not k.lower().startswith("x-rolloutpool-")
        }
        headers[FORWARDED_HEADER] = self.self_name
        headers[PEER_AUTH_HEADER] = self._peer_key
        response: web.StreamResponse | None = None
        try:
            async with self._client.request(
                request.method, f"{base_url}{request.rel_url}", data=body, headers=headers, timeout=self._timeout
            ) as upstream:
                out = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP | {"content-length"}}
                if upstream.content_length is not None:
                    data = await upstream.read()
                    self._count(owner, "ok")
                    return web.Response(body=data, status=upstream.status, headers=out)
                response = web.StreamResponse(status=upstream.status, headers=out)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                self._count(owner, "ok")
                return response
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._count(owner, type(exc).__name__)
            kind = type(exc).__name__
            _log.warning("Failed to forward request router=%s owner=%s error=%s", self.self_name, owner, kind)
            if response is not None and response.prepared:  # the stream started: end it, the client sees a cut
                with contextlib.suppress(ConnectionError):
                    await response.write_eof()
                return response
            return error_response(
                503,
                f"Router {owner}, which owns this session, did not answer ({type(exc).__name__}); retry.",
                headers={"Retry-After": "1"},
            )

    def _count(self, owner: str, outcome: str) -> None:
        if self._forwarded is not None:
            self._forwarded.labels(owner, outcome).inc()
