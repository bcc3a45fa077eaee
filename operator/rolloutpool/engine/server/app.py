"""The vLLM-compatible engine simulator: an aiohttp server around the pure engine model.

It speaks enough of vLLM's OpenAI API for routers, benchmarks and RL rollout clients
(``/v1/completions``, ``/v1/chat/completions`` with streaming, ``/v1/models``,
``/health``, ``/version``) and exposes ``/metrics`` in vLLM V1's names. Prompts are
tokenized by :mod:`rolloutpool.engine.model.tokenizer`, the planned output is generated up
front so its blocks can be hashed, and :class:`~rolloutpool.engine.server.runtime.EngineRunner`
paces the engine in simulated time (``time_scale`` simulated seconds per wall second).

Fault knobs make it a test double for the layers above: added latency, a fraction
of requests answered with a 500, and a fraction never answered until the client
goes away. A client that disconnects has its request aborted and its blocks freed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from rolloutpool.api.kv_events import KVEventsConfig
from rolloutpool.engine.model.core import EngineConfig
from rolloutpool.engine.model.cost import hardware_preset
from rolloutpool.engine.model.pins import PinConfig
from rolloutpool.engine.model.request import DEFAULT_MAX_NUM_SEQS
from rolloutpool.engine.model.tokenizer import generate_ids
from rolloutpool.engine.server.calls import Call, StreamState, final_body, parse_call
from rolloutpool.engine.server.instruments import CacheConfigInfo
from rolloutpool.engine.server.kv_publisher import KvEventPublisher
from rolloutpool.engine.server.protocol import SESSION_ID_HEADER, OpenAIError, parse_json_object, session_id_of
from rolloutpool.engine.server.rl import install_rl_api
from rolloutpool.engine.server.rl_protocol import salt_hash
from rolloutpool.engine.server.runtime import EngineRunner

__all__ = ["VLLM_COMPAT_VERSION", "ServerConfig", "build_app", "run_server"]

_log = logging.getLogger(__name__)

VLLM_COMPAT_VERSION = "0.32.0"
"""The vLLM release whose API and metrics the simulator copies (answered by ``/version``)."""

_POLL_S = 0.05
"""Wall seconds between checks that a waiting client is still connected."""
_MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``rolloutpool engine-sim`` (or a test) sets on one simulated replica."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "Qwen/Qwen3-8B"
    """Served model name; requests naming another model get a 404."""
    max_model_len: int = 32768
    hardware: str = "h100-80gb"
    """Hardware preset giving the cost model and, unless overridden, the KV pool size."""
    prefill_cost_scale: float = 1.0
    """Multiplies what prefill tokens cost in the preset's model (0.5 halves, 2.0 doubles)."""
    num_gpu_blocks: int | None = None
    """KV pool size in blocks; ``None`` takes the preset's (scaled to ``block_size``)."""
    block_size: int = 16
    """Tokens per KV block (vLLM: 16 on GPUs; the CPU backend needs a multiple of 32)."""
    enable_prefix_caching: bool = True
    """vLLM's ``--enable-prefix-caching``; reported in ``vllm:cache_config_info``."""
    prompt_tokens_details: bool = True
    """vLLM's ``--enable-prompt-tokens-details``: off, ``usage.prompt_tokens_details`` is null."""
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = 8192
    time_scale: float = 1.0
    """Simulated seconds per wall second (100 runs a minute of engine time in 0.6 s)."""
    seed: int = 0
    """Seeds the generated text and the fault draws."""
    added_latency_ms: float = 0.0
    """Wall milliseconds added before each generation request is handled."""
    error_rate: float = 0.0
    """Fraction of generation requests answered with a 500 ``InternalServerError``."""
    hang_rate: float = 0.0
    """Fraction of generation requests never answered until the client goes away."""
    gpu_memory_utilization: float = 0.9
    """Reported in ``vllm:cache_config_info`` only."""
    decode_slice_s: float = 0.05
    """Longest run of pure-decode steps taken at once, in simulated seconds."""
    kv_events: KVEventsConfig | None = None
    """vLLM's ``--kv-events-config``: publish the prefix cache's changes (engine/server/kv_publisher.py)."""
    continuum: str | None = None
    """Continuum's pinning (a peer, ``docs/peers.md``): ``paper`` or ``fixed`` TTL; None: vLLM's plain engine."""

    def __post_init__(self) -> None:
        if self.continuum is not None:
            PinConfig(rule=self.continuum)  # raises for an unknown rule
        if self.time_scale <= 0:
            raise ValueError("time_scale must be positive")
        for name in ("error_rate", "hang_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        if not self.prefill_cost_scale > 0:
            raise ValueError(f"prefill_cost_scale must be positive, got {self.prefill_cost_scale}")
        if self.added_latency_ms < 0 or self.decode_slice_s <= 0:
            raise ValueError("added_latency_ms must be >= 0 and decode_slice_s > 0")
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_model_len < 2:
            raise ValueError("block_size, max_num_seqs, max_num_batched_tokens and max_model_len must be positive")
        usable = (self.resolved_num_gpu_blocks - 1) * self.block_size
        if usable < self.max_model_len:
            raise ValueError(
                f"max_model_len {self.max_model_len} is greater than the {usable} tokens the KV cache can hold "
                f"({self.resolved_num_gpu_blocks} blocks of {self.block_size}, one reserved)"
            )

    @property
    def resolved_num_gpu_blocks(self) -> int:
        """``num_gpu_blocks``, or the hardware preset's pool in blocks of ``block_size``."""
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        return hardware_preset(self.hardware).kv_capacity_tokens // self.block_size

    def engine_config(self) -> EngineConfig:
        """The pure engine's limits and cost model."""
        return EngineConfig(
            num_gpu_blocks=self.resolved_num_gpu_blocks,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            cost=hardware_preset(self.hardware).cost.with_prefill_cost_scale(self.prefill_cost_scale),
            enable_prefix_caching=self.enable_prefix_caching,
        )


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type="application/json")


def _error(exc: OpenAIError) -> web.Response:
    return _json(exc.body(), status=exc.status)


def _sse(data: Any) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class _Service:
    """Handlers sharing one engine runner."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.runner = EngineRunner(
            config.engine_config(),
            time_scale=config.time_scale,
            decode_slice_s=config.decode_slice_s,
            model_name=config.model,
            cache_info=CacheConfigInfo(
                block_size=config.block_size,
                num_gpu_blocks=config.resolved_num_gpu_blocks,
                max_model_len=config.max_model_len,
                gpu_memory_utilization=config.gpu_memory_utilization,
                override=config.num_gpu_blocks is not None,
                enable_prefix_caching=config.enable_prefix_caching,
            ),
            pins=None if config.continuum is None else PinConfig(rule=config.continuum),
        )
        self.kv_events: KvEventPublisher | None = None
        if config.kv_events is not None and config.kv_events.publishes:
            self.kv_events = KvEventPublisher(config.kv_events, block_size=config.block_size, bind_host=config.host)
            self.runner.publish_kv_events(self.kv_events)
        self.faults = random.Random(config.seed)  # noqa: S311 - reproducible fault draws, not cryptography
        self.closing = False
        self.started = int(time.time())

    # -- plain endpoints ---------------------------------------------------------------

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, _: web.Request) -> web.Response:
        return _json({"version": VLLM_COMPAT_VERSION})

    async def models(self, _: web.Request) -> web.Response:
        cfg = self.config
        card = {
            "id": cfg.model,
            "object": "model",
            "created": self.started,
            "owned_by": "vllm",
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
        }
        return _json({"object": "list", "data": [card]})

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.runner.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    # -- generation --------------------------------------------------------------------

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        cfg = self.config
        if cfg.added_latency_ms:
            await asyncio.sleep(cfg.added_latency_ms / 1000)
        if cfg.error_rate and self.faults.random() < cfg.error_rate:
            return _error(OpenAIError(500, "Injected engine failure (engine simulator error_rate)."))
        if cfg.hang_rate and self.faults.random() < cfg.hang_rate:
            while not _gone(request) and not self.closing:
                await asyncio.sleep(_POLL_S)
            return web.Response(status=503)
        try:
            body = parse_json_object(await request.read())
            prompts, params = parse_call(body, model=cfg.model, max_model_len=cfg.max_model_len, chat=chat)
            session = session_id_of(body, request.headers.get(SESSION_ID_HEADER), openai=True)
        except OpenAIError as exc:
            return _error(exc)
        call = Call(
            rid=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", chat=chat, params=params, score_seed=cfg.seed
        )
        skip_read = params.prompt_logprobs is not None  # vLLM skips the prefix-cache lookup for prompt logprobs
        cache_salt = body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None
        salt = salt_hash(cache_salt)
        for ids in prompts:  # choice i + n * prompt index, as vLLM numbers them
            max_tokens = min(params.max_tokens, cfg.max_model_len - len(ids))
            base_seed = cfg.seed if params.seed is None else hash((cfg.seed, params.seed))
            for j in range(params.n):
                seed = hash((base_seed, j)) if j else base_seed
                job = self.runner.submit(
                    ids,
                    generate_ids(ids, max_tokens, seed=seed),
                    hash_parent=salt,
                    skip_cache_read=skip_read,
                    session_id=session,
                    cache_salt=cache_salt,
                )
                job.changed = call.changed  # one wake-up for every choice of this call
                call.jobs.append(job)
                call.prompts.append(ids)
        try:
            if params.stream:
                return await self._stream(request, call)
            while not all(job.done for job in call.jobs):
                if not await self._wait(request, call.changed):
                    return web.Response(status=499)  # nobody is listening any more
            return _json(final_body(call, model=cfg.model, details=cfg.prompt_tokens_details, created=int(time.time())))
        finally:
            for job in call.jobs:
                self.runner.abort(job)  # a no-op once the request finished

    async def _wait(self, request: web.Request, changed: asyncio.Event) -> bool:
        """Wait for the call's next publication; False when the client went away or the server stops."""
        while not changed.is_set():
            if _gone(request) or self.closing:
                return False
            try:
                async with asyncio.timeout(_POLL_S):
                    await changed.wait()
            except TimeoutError:
                continue
        changed.clear()
        return True

    async def _stream(self, request: web.Request, call: Call) -> web.StreamResponse:
        """One event per generated token and choice, as vLLM streams; then usage (if asked) and ``[DONE]``."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        stream = StreamState(call, model=self.config.model, created=int(time.time()))
        try:
            for event in stream.opening():
                await response.write(_sse(event))
            while True:
                for event in stream.progress():
                    await response.write(_sse(event))
                if stream.ended:
                    break
                if not await self._wait(request, call.changed):
                    return response
            if call.params.include_usage:
                await response.write(_sse(stream.usage_event(details=self.config.prompt_tokens_details)))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            _log.info("Lost streaming client request_id=%s", call.rid)
        return response


_SERVICE = web.AppKey("rolloutpool_engine_service", _Service)


@web.middleware
async def _internal_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Answer an unexpected exception with a 500 in OpenAI shape and keep serving."""
    try:
        response: web.StreamResponse = await handler(request)
    except web.HTTPException:
        raise
    except Exception as exc:
        _log.exception("Failed request path=%s", request.path)
        return _error(OpenAIError(500, f"Internal simulator error: {type(exc).__name__}"))
    return response


def build_app(config: ServerConfig) -> web.Application:
    """An application serving one simulated replica; its engine loop runs between startup and cleanup."""
    service = _Service(config)
    app = web.Application(client_max_size=_MAX_BODY_BYTES, middlewares=[_internal_errors])
    app[_SERVICE] = service
    app.router.add_get("/health", service.health)
    app.router.add_get("/version", service.version)
    app.router.add_get("/v1/models", service.models)
    app.router.add_get("/metrics", service.metrics)
    app.router.add_post("/v1/completions", service.completions)
    app.router.add_post("/v1/chat/completions", service.chat_completions)
    install_rl_api(app, service.runner, config)  # vLLM's RL API: engine/server/rl.py

    async def start(_: web.Application) -> None:
        if service.kv_events is not None:
            service.kv_events.start()
        service.runner.start()

    async def shutdown(_: web.Application) -> None:
        service.closing = True

    async def cleanup(_: web.Application) -> None:
        await service.runner.stop()
        if service.kv_events is not None:
            await service.kv_events.close()

    app.on_startup.append(start)
    app.on_shutdown.append(shutdown)
    app.on_cleanup.append(cleanup)
    return app


def run_server(config: ServerConfig) -> None:
    """Serve until interrupted (blocking; for the CLI)."""
    _log.info(
        "Started engine simulator model=%s host=%s port=%d num_gpu_blocks=%d time_scale=%g",
        config.model,
        config.host,
        config.port,
        config.resolved_num_gpu_blocks,
        config.time_scale,
    )
    web.run_app(build_app(config), host=config.host, port=config.port, print=None, shutdown_timeout=5.0)
