"""Test kit of the router tests: engine simulators, fault-injecting replicas and a router on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner

from rolloutpool.cli import main
from rolloutpool.engine.server.app import ServerConfig, build_app
from rolloutpool.router import ReplicaSpec, RouterConfig
from rolloutpool.router import build_app as build_router
from rolloutpool.router.app import ROUTER, RouterService

MODEL = "sim"
ENGINE_DEFAULTS: dict[str, Any] = {"time_scale": 500.0, "num_gpu_blocks": 2048, "max_model_len": 4096, "model": MODEL}
ROUTER_DEFAULTS: dict[str, Any] = {"scrape_interval_s": 0.2, "scrape_timeout_s": 2.0, "shutdown_timeout_s": 2.0}


def captured_router_config(monkeypatch: pytest.MonkeyPatch, *args: str) -> RouterConfig:
    """The config ``rolloutpool router --replica e0=http://10.0.0.7:8000 ARGS`` would serve (nothing is started)."""
    import rolloutpool.router as router_pkg  # noqa: PLC0415

    seen: dict[str, RouterConfig] = {}
    monkeypatch.setattr(router_pkg, "run_router", lambda config, **_: seen.setdefault("config", config))
    result = CliRunner().invoke(main, ["router", "--replica", "e0=http://10.0.0.7:8000", *args])
    assert result.exit_code == 0, result.output
    return seen["config"]


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[tuple[str, web.AppRunner]]:
    """Serve ``app`` on a free loopback port; yields its base URL and runner."""
    runner = web.AppRunner(app, shutdown_timeout=1.0, handler_cancellation=True)  # as run_router
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", runner
    finally:
        await runner.cleanup()


@dataclass
class Router:
    """A running router and a client session to talk to it."""

    url: str
    service: RouterService
    http: aiohttp.ClientSession
    runner: web.AppRunner

    @property
    def manager(self) -> Any:
        return self.service.manager

    def live(self) -> dict[str, int]:
        """Live sessions per replica, checked against the session table."""
        table = self.manager.table
        counts = {name: r.live for name, r in table.replicas.items()}
        assert sum(counts.values()) == len(table.sessions)
        for sid, session in table.sessions.items():
            assert sid in table.replicas[session.replica].sessions
        return counts

    async def post(self, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any, aiohttp.ClientResponse]:
        async with self.http.post(f"{self.url}{path}", json=body, **kwargs) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text else None), resp

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.http.request(method, f"{self.url}{path}", **kwargs) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except json.JSONDecodeError:
                return resp.status, text

    async def complete(
        self, prompt: str, *, session: str | None = None, max_tokens: int = 8, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, str | None]:
        """A non-streaming completion; returns status, body and the replica that served it."""
        hdrs = dict(headers or {})
        if session is not None:
            hdrs["X-Session-ID"] = session
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
        async with self.http.post(f"{self.url}/v1/completions", json=body, headers=hdrs) as resp:
            return resp.status, await resp.json(), resp.headers.get("X-RolloutPool-Replica")

    async def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples matching ``labels`` in the router's /metrics."""
        from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

        async with self.http.get(f"{self.url}/metrics") as resp:
            text = await resp.text()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total


@contextlib.asynccontextmanager
async def engines(count: int, **overrides: Any) -> AsyncIterator[dict[str, str]]:
    """``count`` engine simulators named e0, e1, ...; yields name -> URL."""
    settings = {**ENGINE_DEFAULTS, **overrides}
    async with contextlib.AsyncExitStack() as stack:
        urls = {}
        for i in range(count):
            url, _ = await stack.enter_async_context(serve(build_app(ServerConfig(seed=i, **settings))))
            urls[f"e{i}"] = url
        yield urls


@contextlib.asynccontextmanager
async def router(replicas: dict[str, str], **overrides: Any) -> AsyncIterator[Router]:
    """A router in front of ``replicas`` (name -> URL)."""
    specs = tuple(ReplicaSpec(name, url) for name, url in replicas.items())
    config = RouterConfig(replicas=specs, **{**ROUTER_DEFAULTS, **overrides})
    app = build_router(config)
    async with serve(app) as (url, runner), aiohttp.ClientSession() as http:
        yield Router(url=url, service=app[ROUTER], http=http, runner=runner)


async def no_leaked_tasks() -> None:
    """Every task but the current one has finished (loops cancelled, handlers done)."""
    current = asyncio.current_task()
    for _ in range(100):
        pending = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if not pending:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"leaked tasks: {pending}")


async def sse(resp: aiohttp.ClientResponse) -> list[Any]:
    """Payloads of an SSE stream, ``"[DONE]"`` kept as a string."""
    events: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line.removeprefix("data: ")
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


@dataclass
class FaultyReplica:
    """A tiny fault-injecting replica: answers /metrics, and misbehaves on generation."""

    mode: str
    """``die``: stream two chunks then drop the connection and go down; ``hang``: never answer."""
    dead: bool = False
    calls: int = 0
    hung: list[asyncio.Event] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        return app

    async def metrics(self, request: web.Request) -> web.Response:
        if self.dead:
            return web.Response(status=503)
        return web.Response(text="vllm:num_requests_waiting 0.0\nvllm:num_preemptions_total 0.0\n")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        if self.dead:
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        if self.mode == "hang":  # until the router gives up and closes the connection
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.05)
            return web.Response(status=503)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for text in ("one", "two"):
            chunk = {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.dead = True
        assert request.transport is not None
        request.transport.close()
        return response


@dataclass
class KillableEngine:
    """An engine simulator that a test can stop mid-test (the replica dies); stopped at exit in any case."""

    url: str
    runner: web.AppRunner
    alive: bool = True

    async def kill(self) -> None:
        """Stop listening and close every connection, including the router's keep-alive ones."""
        if self.alive:
            self.alive = False
            await self.runner.cleanup()


@contextlib.asynccontextmanager
async def killable_engine(seed: int = 0, **overrides: Any) -> AsyncIterator[KillableEngine]:
    """One engine simulator on a free loopback port that :meth:`KillableEngine.kill` stops."""
    settings = {**ENGINE_DEFAULTS, **overrides}
    runner = web.AppRunner(build_app(ServerConfig(seed=seed, **settings)), shutdown_timeout=1.0)
    await runner.setup()
    engine = KillableEngine(url="", runner=runner)
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        engine.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        yield engine
    finally:
        await engine.kill()
