"""The router application: routes, middleware, background loops and their lifecycle.

Startup (inside the event loop): build the upstream client, load the session
snapshot, scrape every replica once (caps and readiness before the first request),
then start the scrape loop, the idle-expiry loop, the snapshot writer and, when
``renew_every_s`` is set, the prefix-renewal loop (:mod:`rolloutpool.router.renewal`).

Shutdown follows uvicorn's order, which aiohttp's runner implements: stop
accepting, refuse new placements and fail queued sessions (503), let in-flight
requests finish for ``shutdown_timeout_s``, cancel the rest; then cancel the
background loops, write the final snapshot and close the upstream client.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import aiohttp
import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Histogram

from rolloutpool.router.admin import AdminAPI
from rolloutpool.router.api import SessionAPI
from rolloutpool.router.bodyread import body_deadline
from rolloutpool.router.config import ReplicaSpec, RouterConfig
from rolloutpool.router.errors import error_response
from rolloutpool.router.fdlimit import FdWatch, raise_nofile_limit
from rolloutpool.router.fleet import Fleet
from rolloutpool.router.instruments import RouterMetrics
from rolloutpool.router.proxy import DATA_PATHS, Proxy
from rolloutpool.router.renewal import Renewer
from rolloutpool.router.scrape import Scraper
from rolloutpool.router.sessions import SessionManager
from rolloutpool.router.state import SnapshotWriter, load_snapshot
from rolloutpool.router.trace_writer import TraceWriter, trace_writer
from rolloutpool.router.types import ClientFactory, Clock, Discovery, LimitsSource

if TYPE_CHECKING:
    from rolloutpool.router.kv_events import KvEventHub

__all__ = ["OPEN_PATHS", "OWNED_PREFIXES", "ROUTER", "RouterService", "build_app", "run_router"]

_log = logging.getLogger(__name__)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OWNED_PREFIXES = ("/v1/sessions", "/finish_session", "/admin", "/health", "/healthz", "/readyz", "/metrics")
"""Paths the router answers itself: never forwarded (an unserved method there is a 405)."""
OPEN_PATHS = frozenset(("/health", "/healthz", "/readyz", "/metrics"))
"""Paths served without the data port's API key (probes and Prometheus); ``/admin`` has its own token."""
_FORWARDED = "/{path:.*}"
_FORWARDED_CANONICAL = "/{path}"


def _default_client() -> aiohttp.ClientSession:
    """The upstream client: one keep-alive pool per replica, reused across requests."""
    connector = aiohttp.TCPConnector(
        limit=0,  # no connection limit: thousands of sessions may have a request in flight at once
        limit_per_host=0,
        keepalive_timeout=60.0,  # keep idle connections to the engines longer than aiohttp's 15 s
        ttl_dns_cache=None,  # replica URLs are fixed per pod; resolve once
    )
    # no auto-headers but Accept-Encoding's defaults: the client's own headers are forwarded as they came
    return aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",))


class RouterService:
    """Everything one router application owns."""

    def __init__(
        self,
        config: RouterConfig,
        *,
        clock: Clock,
        client_factory: ClientFactory,
        discovery: Discovery | None = None,
        limits: LimitsSource | None = None,
    ) -> None:
        self.config = config
        self.metrics = RouterMetrics()
        self.manager = SessionManager(config, clock=clock, metrics=self.metrics)
        self.proxy = Proxy(self.manager)
        self.renewer = None if config.renew_every_s is None else Renewer(self.manager, every_s=config.renew_every_s)
        self.proxy.renewer = self.renewer
        self.sessions = SessionAPI(self.manager)
        self.admin = AdminAPI(
            self.manager, config.admin_token, client=lambda: self.proxy.client, engine_key=config.api_key
        )
        self.fds = FdWatch(self.metrics.registry)
        self.writer: SnapshotWriter | None = None
        self.trace: TraceWriter | None = None
        self._client_factory = client_factory
        self._discovery = discovery
        self._limits = limits
        self._restored = False
        self._client: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._latency: dict[tuple[str, int], Histogram] = {}
        self.kv_events: KvEventHub | None = None
        """Per-replica residency indexes from the engines' KV events (``--kv-events``); None: off."""
        if config.kv_events is not None:
            from rolloutpool.router.kv_events import KvEventHub  # noqa: PLC0415 - zmq only when configured

            manager = self.manager
            self.kv_events = KvEventHub(
                config.kv_events,
                replicas=lambda: {name: rt.spec.url for name, rt in manager.runtime.items()},
                live=lambda: manager.table.sessions,
                block_size=config.default_block_size,
            )
            self.metrics.registry.register(self.kv_events.collector())
            self.manager.resident = self.kv_events.resident_tokens  # turns of let-go sessions still cached: served

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self, _: web.Application) -> None:
        """Restore, scrape once, start the loops."""
        cfg = self.config
        self._client = self._client_factory()
        self.proxy.attach(self._client)
        if cfg.trace_path is not None:
            self.trace = self.manager.trace = trace_writer(cfg, now=self.manager.clock())
            self._spawn(self.trace.run(), "trace")
        if self._discovery is None:
            self._restore()  # with discovery: once the first pod list has arrived
        else:
            self._spawn(self._discover(self._discovery), "discovery")
        if self._limits is not None:
            self._spawn(self._follow_limits(self._limits), "operator-limits")
        scraper = Scraper(self.manager, self._client)
        await scraper.scrape_all()
        self._spawn(scraper.run(), "scrape")
        self._spawn(self._expire_loop(), "expiry")
        self._spawn(self.fds.run(), "fd-watch")
        if self.kv_events is not None:
            self._spawn(self.kv_events.run(), "kv-events")
        if self.renewer is not None:
            self.renewer.attach(self._client)
            self._spawn(self.renewer.run(), "renewal")
        _log.info(
            "Started router replicas=%d sessions=%d ready=%d",
            len(cfg.replicas),
            len(self.manager.table.sessions),
            sum(r.ready for r in self.manager.table.replicas.values()),
        )

    def _restore(self) -> None:
        """Load the snapshot (once, when the replicas are known) and start writing new ones."""
        cfg = self.config
        if self._restored or cfg.state_path is None:
            return
        self._restored = True
        load_snapshot(self.manager, cfg.state_path)
        self.writer = SnapshotWriter(self.manager, cfg.state_path, debounce_s=cfg.state_debounce_s)
        self.manager.on_change = self.writer.mark_dirty
        self._spawn(self.writer.run(), "snapshot")

    async def _discover(self, discovery: Discovery) -> None:
        """Apply discovery events: routable replicas join placement, the rest leave it."""
        async for event in discovery():
            try:
                if event.reason == "Synced":
                    self._restore()
                elif event.routable and event.url is not None:
                    self.manager.add_replica(ReplicaSpec(name=event.name, url=event.url))
                else:
                    self.manager.remove_replica(event.name, reason=event.reason)
            except ValueError as exc:  # one odd pod must not stop discovery
                _log.warning("Ignored replica event replica=%s error=%s", event.name, exc)

    async def _follow_limits(self, limits: LimitsSource) -> None:
        """Apply the operator's caps and quarantine each time the RolloutPool status changes."""
        async for update in limits():
            self.manager.set_operator_limits(update)

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        async def run() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:  # logged, never silent; cleanup must still run
                _log.exception("Failed background task name=%s", name)

        self._tasks.append(asyncio.create_task(run(), name=f"rolloutpool-router-{name}"))

    async def shutdown(self, _: web.Application) -> None:
        """Refuse new placements and fail queued sessions; in-flight requests continue."""
        self.manager.close()

    async def cleanup(self, _: web.Application) -> None:
        """Cancel the loops, write the final snapshot, close the upstream client."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.kv_events is not None:
            await self.kv_events.close()
        if self.renewer is not None:
            await self.renewer.close()
        if self.writer is not None:
            await self.writer.close()
        if self.trace is not None:
            await self.trace.close()
        self.proxy.close()
        if self._client is not None:
            await self._client.close()
        _log.info("Stopped router sessions=%d", len(self.manager.table.sessions))

    async def _expire_loop(self) -> None:
        tick = min(self.config.expiry_interval_s, 1.0)  # implicit sessions yield to a queue within a second
        since = 0.0
        while True:
            await asyncio.sleep(tick)
            since += tick
            if since >= self.config.expiry_interval_s:
                since = 0.0
                self.manager.expire()
            if self.proxy.implicit is not None:
                self.proxy.implicit.expire()

    # -- plain endpoints ---------------------------------------------------------------

    async def healthz(self, _: web.Request) -> web.Response:
        """``GET /healthz``: the process serves."""
        return web.json_response({"status": "ok"})

    async def readyz(self, _: web.Request) -> web.Response:
        """``GET /readyz``: at least one replica is ready (readiness; ``/healthz`` is liveness)."""
        ready = [r.name for r in self.manager.table.replicas.values() if r.ready]
        status = 200 if ready else 503
        return web.Response(
            text=json.dumps({"ready": bool(ready), "ready_replicas": ready}),
            status=status,
            content_type="application/json",
        )

    async def prometheus(self, _: web.Request) -> web.Response:
        """``GET /metrics``."""
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- middleware --------------------------------------------------------------------

    @web.middleware
    async def authorize(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """With ``api_key`` (vllm-router's ``--api-key``): the data port and session API need it as a bearer token."""
        key = self.config.api_key
        path = request.path
        if key is None or path in OPEN_PATHS or path == "/admin" or path.startswith("/admin/"):
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            return error_response(401, "A valid API key is required (Authorization: Bearer KEY).")
        return await handler(request)

    @web.middleware
    async def observe(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """Time every request; answer unknown routes and unexpected errors in the OpenAI error shape."""
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            return error_response(exc.status, exc.reason)
        except Exception as exc:
            _log.exception("Failed request path=%s", request.path)
            return error_response(500, f"Internal router error: {type(exc).__name__}")
        finally:
            resource = request.match_info.route.resource
            endpoint = resource.canonical if resource is not None else "unmatched"
            if (
                endpoint == _FORWARDED_CANONICAL
            ):  # a known engine path names itself; any other is "other" (bounded labels)
                endpoint = request.path if request.path in DATA_PATHS else "other"
            key = (endpoint, status)
            child = self._latency.get(key)
            if child is None:  # one label lookup per (endpoint, status), not per request
                child = self._latency[key] = self.metrics.request_latency.labels(key[0], str(status))
            child.observe(time.perf_counter() - started)


ROUTER = web.AppKey("rolloutpool_router", RouterService)
"""Where the application keeps its :class:`RouterService` (tests read the manager through it)."""


def build_app(
    config: RouterConfig,
    *,
    clock: Clock = time.time,
    client_factory: ClientFactory = _default_client,
    discovery: Discovery | None = None,
    limits: LimitsSource | None = None,
    fleet: Fleet | None = None,
) -> web.Application:
    """The router application; its loops run between startup and cleanup.

    ``discovery`` (with ``config.discovery``) yields replica events at run time, e.g.
    from :class:`rolloutpool.kube.pods.PodWatch`; a ``Synced`` event marks the end of
    the initial listing, after which the session snapshot is restored. ``limits``
    yields the operator's per-replica caps and quarantine (e.g. from
    :class:`rolloutpool.kube.pools.PoolWatch`); they combine with the router's own.
    """
    service = RouterService(config, clock=clock, client_factory=client_factory, discovery=discovery, limits=limits)
    read_body = body_deadline(timeout_s=config.request_read_timeout_s, max_bytes=config.max_body_bytes)
    app = web.Application(
        client_max_size=config.max_body_bytes, middlewares=[service.observe, read_body, service.authorize]
    )
    app[ROUTER] = service
    if fleet is not None:  # one of N routers: forward sessions owned elsewhere (router/fleet.py)
        fleet.install(app, manager=service.manager, proxy=service.proxy)
    add = app.router
    # -- routes the router owns (its session API, admin API, health, metrics) -------------
    add.add_get("/v1/models", service.proxy.models)
    add.add_post("/v1/sessions", service.sessions.place)
    add.add_get("/v1/sessions/{session_id}", service.sessions.get)
    add.add_delete("/v1/sessions/{session_id}", service.sessions.delete)
    add.add_post("/finish_session", service.sessions.finish)
    add.add_get("/admin/replicas", service.admin.replicas)
    add.add_post("/admin/replicas/{name}/drain", service.admin.drain)
    add.add_put("/admin/limits", service.admin.limits)
    add.add_get("/healthz", service.healthz)
    add.add_get("/readyz", service.readyz)
    add.add_get("/metrics", service.prometheus)
    # vllm-router drop-in: the health RL frameworks poll; one URL for the fleet's weight-sync calls
    add.add_get("/health", service.sessions.health)
    add.add_route("*", "/admin/rl/{call:.+}", service.admin.fan_out)
    # -- every other path and method: forwarded to the session's replica (registered last, matched last)
    service.proxy.owned = OWNED_PREFIXES
    for path in sorted(DATA_PATHS):  # plain routes resolve by one dict lookup, before the pattern below
        add.add_route("*", path, service.proxy.forward)
    add.add_route("*", _FORWARDED, service.proxy.forward)
    app.on_startup.append(service.start)
    app.on_shutdown.append(service.shutdown)
    app.on_cleanup.append(service.cleanup)
    return app


def run_router(
    config: RouterConfig,
    *,
    discovery: Discovery | None = None,
    limits: LimitsSource | None = None,
    fleet: Fleet | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully (blocking; for the CLI)."""
    _log.info(
        "Starting router host=%s port=%d replicas=%s admin=%s state=%s renew_every_s=%s",
        config.host,
        config.port,
        ",".join(r.name for r in config.replicas),
        "enabled" if config.admin_token else "disabled",
        config.state_path,
        config.renew_every_s,
    )
    raise_nofile_limit()  # every connection is a descriptor: take what the hard limit allows
    app = build_app(config, discovery=discovery, limits=limits, fleet=fleet)
    # Start-up objects never become garbage: keep them out of every collection, and collect young
    # objects less often (each request allocates a few hundred; few of them form cycles).
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    web.run_app(
        app,
        loop=uvloop.new_event_loop(),  # libuv's loop: cheaper socket writes and callbacks than asyncio's
        host=config.host,
        port=config.port,
        shutdown_timeout=config.shutdown_timeout_s,
        access_log=None,
        print=None,
        # a client that disconnects cancels its handler, so a new session waiting in the
        # admission queue leaves it instead of being placed later for nobody
        handler_cancellation=True,
    )
