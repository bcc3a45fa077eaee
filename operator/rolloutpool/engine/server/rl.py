"""vLLM 0.32's RL endpoints on the engine simulator: token-in generate, tokenize, pause/resume, weight sync.

- ``POST /inference/v1/generate``: token ids in, ``n`` choices of token ids (and
  logprobs) out, streamed or not (:mod:`rolloutpool.engine.server.generate`). ``cache_salt``
  seeds the block chain, so requests salted differently share no cached block, as in vLLM.
- ``POST /tokenize``, ``/detokenize`` and the render endpoints (:mod:`rolloutpool.engine.server.tokens`).
- ``POST /pause?mode=abort|wait|keep&clear_cache=``: new generation requests (every
  generation path) wait until ``/resume``. ``abort`` (default) ends the requests in
  flight with ``finish_reason: abort``; ``wait`` answers once they have finished;
  ``keep`` freezes them (no engine step) until ``/resume``. ``clear_cache`` (default
  true) then resets the prefix cache; with requests frozen in ``keep`` mode their
  blocks are held, and, as in vLLM, the reset does not happen (``cache_cleared: false``).
- ``POST /resume``, ``GET /is_paused``.
- ``POST /update_weights``: the simulated weight load (``_UPDATE_WEIGHTS_S`` simulated
  seconds), a prefix-cache reset and a weight-version bump; ``/update_weight_version``
  sets the version; ``/init_weight_transfer_engine``, ``/start_weight_update``,
  ``/finish_weight_update`` are accepted (timed, no effect); ``GET /weight_info``.
- ``POST /reset_prefix_cache``.
- Metrics: ``vllm:rl_weight_update_operation_duration_seconds{operation}`` (histogram,
  simulated seconds) and ``vllm:rl_weight_update_operations_in_flight{operation}``.

:func:`install_rl_api` adds the routes and the pause gate to the application.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import Gauge, Histogram

from rolloutpool.api import vllm_metrics as vm
from rolloutpool.engine.server.generate import GenerateAPI
from rolloutpool.engine.server.protocol import OpenAIError, parse_json_object
from rolloutpool.engine.server.rl_protocol import Span, parse_pause
from rolloutpool.engine.server.runtime import EngineRunner, Job
from rolloutpool.engine.server.tokens import TokenAPI

if TYPE_CHECKING:
    from rolloutpool.engine.server.app import ServerConfig

__all__ = ["GENERATION_PATHS", "RL_CONTROL", "RLControl", "install_rl_api"]

_log = logging.getLogger(__name__)

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/inference/v1/generate"})
"""Requests held while the engine is paused."""
_UPDATE_WEIGHTS_S = 2.0
"""Simulated seconds one ``/update_weights`` takes."""
_POLL_S = 0.05
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type="application/json")


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class RLControl:
    """Pause state, weight version and the RL handlers of one simulated replica."""

    def __init__(
        self,
        runner: EngineRunner,
        *,
        model: str,
        max_model_len: int,
        seed: int,
        time_scale: float,
        details: bool = True,
    ) -> None:
        self.details = details
        """vLLM's ``--enable-prompt-tokens-details``: off, ``usage.prompt_tokens_details`` is null."""
        self.runner = runner
        self.model = model
        self.max_model_len = max_model_len
        self.seed = seed
        self.time_scale = time_scale
        self.paused: str | None = None
        """The pause mode while paused, else None."""
        self.weight_version: int | str = 0
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._spans: dict[Job, list[Span]] = {}
        registry = runner.metrics.registry
        self.durations = Histogram(
            vm.RL_WEIGHT_UPDATE_DURATION,
            "Duration of RL weight-update control operations in seconds.",
            labelnames=["model_name", "operation"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            vm.RL_WEIGHT_UPDATE_IN_FLIGHT,
            "RL weight-update control operations in flight.",
            labelnames=["model_name", "operation"],
            registry=registry,
        )

    # -- bookkeeping -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _operation(self, name: str) -> AsyncIterator[None]:
        started = self.runner.now()
        gauge = self.in_flight.labels(self.model, name)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()
            self.durations.labels(self.model, name).observe(max(0.0, self.runner.now() - started))

    def track(self, job: Job) -> list[Span]:
        """Start recording which weight version generates a generation job's tokens (its spans, updated in place)."""
        spans: list[Span] = [(self.weight_version, 0)]
        self._spans[job] = spans
        return spans

    def untrack(self, job: Job) -> None:
        """Stop recording a finished job's spans."""
        self._spans.pop(job, None)

    def _set_version(self, version: int | str) -> None:
        self.weight_version = version
        for job, spans in self._spans.items():
            spans.append((version, job.visible))

    def _reset_cache(self) -> bool:
        cleared = self.runner.reset_prefix_cache()
        _log.info("Reset prefix cache cleared=%s in_flight=%d", cleared, self.runner.in_flight)
        return cleared

    @web.middleware
    async def gate(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """Hold generation requests while paused (a client that gives up is never submitted)."""
        if request.path in GENERATION_PATHS:
            while not self._resumed.is_set():
                if _gone(request):
                    return web.Response(status=499)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_POLL_S):
                        await self._resumed.wait()
        return await handler(request)

    # -- pause, resume, weights ----------------------------------------------------------

    async def pause(self, request: web.Request) -> web.Response:
        """``POST /pause?mode=abort|wait|keep&clear_cache=``."""
        try:
            mode, clear = parse_pause(request.query)
        except OpenAIError as exc:
            return _json(exc.body(), status=exc.status)
        async with self._operation("pause"):
            self.paused = mode
            self._resumed.clear()
            aborted = 0
            if mode == "abort":
                aborted = self.runner.abort_all()
            elif mode == "wait":
                while self.runner.in_flight and self.paused == "wait":
                    await asyncio.sleep(_POLL_S)
            else:
                self.runner.freeze(True)
            cleared = self._reset_cache() if clear else False
        _log.info("Paused engine mode=%s clear_cache=%s cleared=%s aborted=%d", mode, clear, cleared, aborted)
        return _json({"status": "paused", "mode": mode, "cache_cleared": cleared, "aborted": aborted})

    async def resume(self, _: web.Request) -> web.Response:
        """``POST /resume``."""
        async with self._operation("resume"):
            was = self.paused
            self.paused = None
            self.runner.freeze(False)
            self._resumed.set()
        _log.info("Resumed engine was=%s", was)
        return _json({"status": "resumed", "was_paused": was is not None})

    async def is_paused(self, _: web.Request) -> web.Response:
        """``GET /is_paused``."""
        return _json({"is_paused": self.paused is not None, "mode": self.paused})

    async def update_weights(self, request: web.Request) -> web.Response:
        """``POST /update_weights``: a simulated load, a prefix-cache reset and a version bump."""
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        version = body.get("weight_version")
        if version is not None and (isinstance(version, bool) or not isinstance(version, (int, str))):
            return _json(OpenAIError(400, "weight_version must be a string or an integer.").body(), status=400)
        async with self._operation("update_weights"):
            await asyncio.sleep(_UPDATE_WEIGHTS_S / self.time_scale)
            cleared = self._reset_cache()
            old = self.weight_version
            self._set_version(version if version is not None else _bump(old))
        _log.info("Updated weights version=%s previous=%s cache_cleared=%s", self.weight_version, old, cleared)
        return _json({"status": "ok", "weight_version": self.weight_version, "cache_cleared": cleared})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        """``POST /update_weight_version`` ``{"weight_version": V}`` (or ``?weight_version=V``)."""
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        version = body.get("weight_version", request.query.get("weight_version"))
        if version is None or isinstance(version, bool) or not isinstance(version, (int, str)):
            error = OpenAIError(400, "weight_version is required: a string or an integer.", param="weight_version")
            return _json(error.body(), status=400)
        async with self._operation("update_weight_version"):
            self._set_version(version)
        return _json({"status": "ok", "weight_version": version})

    async def noop_operation(self, request: web.Request) -> web.Response:
        """``/init_weight_transfer_engine``, ``/start_weight_update``, ``/finish_weight_update``: timed, no effect."""
        name = request.path.strip("/")
        async with self._operation(name):
            pass
        return _json({"status": "ok"})

    async def weight_info(self, _: web.Request) -> web.Response:
        """``GET /weight_info``."""
        return _json({"weight_version": self.weight_version})

    async def reset_prefix_cache(self, _: web.Request) -> web.Response:
        """``POST /reset_prefix_cache``: fails (``reset: false``) while requests hold blocks, as in vLLM."""
        async with self._operation("reset_prefix_cache"):
            cleared = self._reset_cache()
        return _json({"status": "ok", "reset": cleared})

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        raw = await request.read()
        if not raw.strip():
            return {}
        try:
            return parse_json_object(raw)
        except OpenAIError as exc:
            return _json(exc.body(), status=exc.status)


RL_CONTROL = web.AppKey("rolloutpool_engine_rl", RLControl)
"""Where the application keeps its :class:`RLControl` (tests read the pause state through it)."""


def _bump(version: int | str) -> int | str:
    if isinstance(version, int):
        return version + 1
    return str(int(version) + 1) if version.isdigit() else f"{version}+1"


def install_rl_api(app: web.Application, runner: EngineRunner, config: ServerConfig) -> RLControl:
    """Add vLLM's RL endpoints and the pause gate to an engine-simulator application (before it starts)."""
    control = RLControl(
        runner,
        model=config.model,
        max_model_len=config.max_model_len,
        seed=config.seed,
        time_scale=config.time_scale,
        details=config.prompt_tokens_details,
    )
    app[RL_CONTROL] = control
    app.middlewares.append(control.gate)
    add = app.router
    generate = GenerateAPI(
        runner,
        model=config.model,
        max_model_len=config.max_model_len,
        seed=config.seed,
        details=config.prompt_tokens_details,
        track=control.track,
        untrack=control.untrack,
    )
    add.add_post("/inference/v1/generate", generate.generate)
    tokens = TokenAPI(max_model_len=config.max_model_len)
    add.add_post("/tokenize", tokens.tokenize)
    add.add_post("/detokenize", tokens.detokenize)
    add.add_post("/v1/chat/completions/render", tokens.render)
    add.add_post("/v1/completions/render", tokens.render)
    add.add_post("/pause", control.pause)
    add.add_post("/resume", control.resume)
    add.add_get("/is_paused", control.is_paused)
    add.add_post("/update_weights", control.update_weights)
    add.add_post("/update_weight_version", control.update_weight_version)
    for path in ("/init_weight_transfer_engine", "/start_weight_update", "/finish_weight_update"):
        add.add_post(path, control.noop_operation)
    add.add_get("/weight_info", control.weight_info)
    add.add_post("/reset_prefix_cache", control.reset_prefix_cache)
    return control
