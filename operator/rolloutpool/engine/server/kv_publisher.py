"""engine-sim's KV-event publisher: the engine model's cache events on vLLM 0.32's wire.

``rolloutpool engine-sim --kv-events-config JSON`` takes vLLM's flag as it is
(:class:`~rolloutpool.api.kv_events.KVEventsConfig`). After every engine step the runner
hands the step's events here; they go out as ONE message ``(topic, seq, payload)`` on a ZMQ
PUB socket, ``seq`` counting batches from 0 and ``payload`` a msgpack
:class:`~rolloutpool.api.kv_events.KVEventBatch`, as vLLM's ``ZmqEventPublisher`` sends them:

- ``BlockStored`` per request and step: the hashes of the blocks it filled (engine-sim's
  62-bit chain hashes, the integer form vLLM publishes by default), their parent, their
  token ids, ``block_size``, ``medium: "GPU"``, ``group_idx: 0``, ``kv_cache_spec_kind:
  "full_attention"``, ``extra_keys`` (one entry
  per block: ``(cache_salt,)`` on a salted chain's first block, else null) and the request's
  ``session_id`` (vLLM takes it from the body's ``session_id``, the ``X-Session-ID`` header or
  ``vllm_xargs.session_id`` on completions and chat, from the header on ``/inference/v1/generate``);
- ``BlockRemoved`` per block, ``AllBlocksCleared`` on ``/reset_prefix_cache`` (sent, as vLLM
  sends it, with the next step's batch).

The endpoint is bound when it holds ``*`` or ``::`` (``tcp://*:5557``; ``tcp://*:0`` takes a
free port, see :attr:`KvEventPublisher.endpoint`) or is ipc/inproc, otherwise connected, as
vLLM does. ``replay_endpoint`` (bound) answers a subscriber's replay request, an 8-byte
start ``seq``, with every batch still in the last ``buffer_steps`` from there and an end
marker. Sends never block: past the socket's high-water mark a subscriber misses messages
and sees the gap in ``seq``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

import msgspec
import zmq
import zmq.asyncio

from rolloutpool.api.kv_events import (
    END_SEQ,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventsConfig,
    decode_seq,
    encode_seq,
)
from rolloutpool.engine.model.cache_events import BlockRemoved as ModelBlockRemoved
from rolloutpool.engine.model.cache_events import BlocksStored, CacheEvent

__all__ = ["KvEventPublisher", "RequestOrigin", "wire_events"]

_log = logging.getLogger(__name__)

WireEvent = BlockStored | BlockRemoved | AllBlocksCleared


class RequestOrigin(Protocol):
    """What a request's ``tag`` tells the publisher (the server's job)."""

    token_ids: list[int]
    """Prompt then planned output: the tokens the request's chain hashes cover."""
    session_id: str | None
    cache_salt: str | None


def wire_events(events: Sequence[CacheEvent], *, block_size: int) -> list[WireEvent]:
    """The engine model's events as vLLM's (pure). A stored request's ``tag`` must be a :class:`RequestOrigin`."""
    out: list[WireEvent] = []
    for event in events:
        if isinstance(event, BlocksStored):
            req, start, end = event.request, event.start, event.end
            origin: RequestOrigin = req.tag
            extra: list[tuple[str, ...] | None] = [None] * (end - start)
            if start == 0 and origin.cache_salt:
                extra[0] = (origin.cache_salt,)
            out.append(
                BlockStored(
                    block_hashes=list(req.hashes[start:end]),
                    parent_block_hash=req.hashes[start - 1] if start else None,
                    token_ids=origin.token_ids[start * block_size : end * block_size],
                    block_size=block_size,
                    lora_id=None,
                    medium=MEDIUM_GPU,
                    lora_name=None,
                    extra_keys=list(extra),
                    group_idx=0,
                    kv_cache_spec_kind="full_attention",
                    session_id=origin.session_id,
                )
            )
        elif isinstance(event, ModelBlockRemoved):
            out.append(BlockRemoved(block_hashes=[event.block_hash], medium=MEDIUM_GPU, group_idx=0))
        else:
            out.append(AllBlocksCleared())
    return out


def _binds(endpoint: str) -> bool:
    """vLLM's rule: bind wildcard and ipc/inproc endpoints, connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KvEventPublisher:
    """One engine's PUB socket (and replay socket), sequence numbers and replay buffer."""

    def __init__(
        self, config: KVEventsConfig, *, block_size: int, data_parallel_rank: int = 0, bind_host: str | None = None
    ) -> None:
        """``bind_host``: the address the engine serves on; a wildcard endpoint binds it alone (see :func:`_local`)."""
        if not config.publishes:
            raise ValueError("kv-events-config: publishing is off (enable_kv_cache_events false or publisher null)")
        self.config = config
        self.block_size = block_size
        self.data_parallel_rank = data_parallel_rank
        self.endpoint = config.endpoint
        """The PUB endpoint; after :meth:`start`, the bound one (``tcp://*:0`` resolved to its port)."""
        self.replay_endpoint = config.replay_endpoint
        self.sent = 0
        """Batches published (the next ``seq``)."""
        self._topic = config.topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._encoder = msgspec.msgpack.Encoder()
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._bind_host = bind_host

    def start(self) -> None:
        """Open the sockets (and serve replays when configured); call from a running event loop."""
        ctx = self._ctx = zmq.asyncio.Context()
        pub = self._pub = zmq.Socket(ctx, zmq.PUB)  # a plain socket: sends from the engine loop never wait
        pub.set_hwm(self.config.hwm)
        pub.linger = 0
        if _binds(self.endpoint):
            self.endpoint = _bind(pub, _local(self.endpoint, self._bind_host))
        else:
            pub.connect(self.endpoint)
        if self.replay_endpoint is not None:
            replay = self._replay = ctx.socket(zmq.ROUTER)
            replay.linger = 0
            self.replay_endpoint = _bind(replay, _local(self.replay_endpoint, self._bind_host))
            self._task = asyncio.get_running_loop().create_task(self._serve_replays(replay), name="kv-events-replay")
        _log.info("Started KV event publisher endpoint=%s replay=%s", self.endpoint, self.replay_endpoint)

    def publish(self, events: Sequence[CacheEvent]) -> None:
        """Send one step's events as one batch (nothing when there are none)."""
        if not events or self._pub is None:
            return
        batch = KVEventBatch(
            ts=time.time(),
            events=wire_events(events, block_size=self.block_size),
            data_parallel_rank=self.data_parallel_rank,
        )
        payload = self._encoder.encode(batch)
        seq = self.sent
        self.sent += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):  # PUB drops past its high-water mark; the subscriber sees the gap
            self._pub.send_multipart((self._topic, encode_seq(seq), payload), flags=zmq.NOBLOCK)

    async def close(self) -> None:
        """Stop serving replays and close the sockets."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def _serve_replays(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                _log.warning("Ignored replay request frames=%d", len(frames))
                continue
            client, _, start = frames
            try:
                first = decode_seq(start)
            except ValueError:
                _log.warning("Ignored replay request start=%r", start)
                continue
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await sock.send_multipart((client, b"", self._topic, encode_seq(seq), payload))
            await sock.send_multipart((client, b"", b"", encode_seq(END_SEQ), b""))


def _local(endpoint: str, host: str | None) -> str:
    """A wildcard tcp endpoint on the engine's own serving address, when it serves on one.

    vLLM binds ``tcp://*:PORT`` on every interface of its pod; engine-sims of the local stack share one network
    namespace (each pod a loopback address), where a wildcard port binds once, so an engine-sim binds its port on
    the address it serves on: the one the routers connect to either way.
    """
    if host is None or host in {"", "0.0.0.0", "::", "*"} or not endpoint.startswith("tcp://*:"):  # noqa: S104
        return endpoint
    address = f"[{host}]" if ":" in host else host
    return f"tcp://{address}:{endpoint.removeprefix('tcp://*:')}"


def _bind(sock: zmq.Socket[bytes] | zmq.asyncio.Socket, endpoint: str) -> str:
    """Bind; a tcp port 0 takes a free port and the bound endpoint is returned."""
    sock.bind(endpoint)
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return endpoint[: endpoint.rindex(":") + 1] + bound.rsplit(":", 1)[1]
    return endpoint
