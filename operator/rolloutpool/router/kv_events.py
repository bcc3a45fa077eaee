"""Subscribe to each replica's KV events and keep its residency index (I/O).

Where engines publish vLLM's KV events (``vllm serve --kv-events-config
'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}'``, or ``rolloutpool
engine-sim`` with the same flag), ``rolloutpool router --kv-events-port 5557`` (or
``--kv-events NAME=tcp://HOST:PORT`` per replica) subscribes to every replica's publisher and
feeds one pure :class:`~rolloutpool.routing.residency.ResidencyIndex` per replica: which
leading tokens of each session's context are still cached there. Nothing here places a
session; the session manager reads the indexes (:meth:`KvEventHub.index`).

Each subscription is a ZMQ SUB socket (any topic), decoded with the wire structs of
:mod:`rolloutpool.api.kv_events`. ZMQ reconnects by itself; the sequence numbers say what
was missed:

- the next ``seq``: applied;
- ``seq`` 0 first, or after a higher one (a restarted engine, whose cache starts empty): the
  index is cleared, then the batch applied;
- a gap (``seq`` past the next one, a first batch that is not 0, or any other number after
  the socket lost its connection): the missed batches are asked from the publisher's replay
  socket when one is configured (``replay_endpoint`` in the engine's config; here
  ``--kv-events-port PORT,REPLAY_PORT``) and applied in order; without one, or when the
  replay no longer holds them, the index is marked unreliable
  (:meth:`~rolloutpool.routing.residency.ResidencyIndex.invalidate`: ``resident_tokens`` is
  None) until an ``AllBlocksCleared`` or an engine restart makes it exact again.

A batch that does not decode, or an event the index refuses, marks the index unreliable the
same way. Only KV cache group 0 is indexed (full attention; hybrid models publish more groups).
Prometheus, per replica: ``rolloutpool_router_kv_event_batches_total``,
``..._kv_events_total``, ``..._kv_event_gaps_total``, ``..._kv_event_replays_total{outcome}``,
``..._kv_event_publisher_restarts_total``, ``..._kv_events_malformed_total``, and the gauges
``..._kv_index_reliable``, ``..._kv_index_blocks``, ``..._kv_index_sessions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Container, Iterator, Mapping

import msgspec
import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rolloutpool.api.kv_events import END_SEQ, AllBlocksCleared, BlockStored, KVEventBatch, decode_seq, encode_seq
from rolloutpool.router.instruments import PREFIX
from rolloutpool.router.kv_sources import KvEventSource, KvEventsSettings
from rolloutpool.routing.residency import ResidencyIndex

__all__ = ["KvEventHub", "ReplicaKvEvents"]

_log = logging.getLogger(__name__)

_RECONNECT_IVL_MS = 100
_RECONNECT_IVL_MAX_MS = 5_000


class ReplicaKvEvents:
    """One replica's subscription: sequence tracking, replays, decoding, and its residency index."""

    def __init__(self, replica: str, source: KvEventSource, *, block_size: int, replay_timeout_s: float = 2.0) -> None:
        self.replica = replica
        self.source = source
        self.replay_timeout_s = replay_timeout_s
        self.index = ResidencyIndex(block_size=block_size)
        self.expected: int | None = None
        """The next ``seq`` (None before the first batch, and after the connection was lost)."""
        self.batches = self.events = self.gaps = self.restarts = self.malformed = self.ignored = 0
        self.replays_ok = self.replays_failed = 0
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self._ctx: zmq.asyncio.Context | None = None

    # -- the socket loop -----------------------------------------------------------------

    async def run(self, ctx: zmq.asyncio.Context) -> None:
        """Receive until cancelled (the socket closes on the way out; ZMQ reconnects it by itself)."""
        self._ctx = ctx
        sock = ctx.socket(zmq.SUB)
        sock.linger = 0
        sock.setsockopt(zmq.RECONNECT_IVL, _RECONNECT_IVL_MS)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, _RECONNECT_IVL_MAX_MS)
        sock.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: the topic frame is vLLM's label, not a filter we need
        sock.connect(self.source.endpoint)
        _log.info("Subscribed to KV events replica=%s endpoint=%s", self.replica, self.source.endpoint)
        try:
            while True:
                frames = await sock.recv_multipart()
                if len(frames) != 3:
                    self._malformed(f"a message of {len(frames)} frames")
                    continue
                try:
                    seq = decode_seq(frames[1])
                except ValueError as exc:
                    self._malformed(str(exc))
                    continue
                await self.receive(seq, frames[2])
        finally:
            sock.close(linger=0)

    # -- sequence numbers --------------------------------------------------------------------

    async def receive(self, seq: int, payload: bytes) -> None:
        """One batch as received: apply it after whatever its sequence number says was missed.

        A publisher that restarted and happens to send exactly the next expected number
        first is taken for the same one (its first batches then count as received): it
        would have to have sent as many batches as the old one before the socket reconnected.
        """
        expected = self.expected
        if seq == expected or (expected is None and seq == 0):
            pass
        elif seq == 0:  # the publisher started over: a new engine, an empty cache
            self.restarts += 1
            _log.info("Restarted KV event publisher replica=%s", self.replica)
            self.index.cleared()
        else:
            self.gaps += 1
            _log.warning(
                "Missed KV events replica=%s expected=%s received=%d replay=%s",
                self.replica,
                expected,
                seq,
                self.source.replay_endpoint is not None,
            )
            start = 0 if expected is None else expected
            if expected is not None and seq < expected:  # started over, and its first batches were missed
                self.restarts += 1
                self.index.cleared()
                start = 0
            await self._fill(start, seq)
        self.expected = seq + 1
        self.apply(payload)

    async def _fill(self, start: int, stop: int) -> None:
        """Apply batches ``start .. stop - 1`` from the replay socket, or mark the index unreliable."""
        if stop <= start:
            return
        replayed = await self._replay(start) if self.source.replay_endpoint is not None else None
        wanted = [(s, p) for s, p in replayed or () if start <= s < stop]
        if [s for s, _ in wanted] != list(range(start, stop)):
            if self.source.replay_endpoint is not None:
                self.replays_failed += 1
            self.index.invalidate()
            _log.warning("Marked KV index unreliable replica=%s missed=%d-%d", self.replica, start, stop - 1)
            return
        self.replays_ok += 1
        for _, payload in wanted:
            self.apply(payload)

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """Every batch the publisher still buffers from ``start``, or None when the replay did not finish in time."""
        endpoint, ctx = self.source.replay_endpoint, self._ctx
        if endpoint is None or ctx is None:  # pragma: no cover - guarded by the caller, called from run()
            return None
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        out: list[tuple[int, bytes]] = []
        try:
            sock.connect(endpoint)
            await sock.send_multipart((b"", encode_seq(start)))
            async with asyncio.timeout(self.replay_timeout_s):
                while True:
                    frames = await sock.recv_multipart()
                    if len(frames) != 4:
                        return None
                    seq = decode_seq(frames[2])
                    if seq == END_SEQ:
                        return out
                    out.append((seq, frames[3]))
        except (TimeoutError, ValueError, zmq.ZMQError) as exc:
            _log.warning("Failed KV event replay replica=%s start=%d error=%s", self.replica, start, exc)
            return None
        finally:
            sock.close(linger=0)

    # -- decoding ------------------------------------------------------------------------------

    def apply(self, payload: bytes) -> None:
        """Decode one batch and apply its events to the index (a bad batch marks it unreliable)."""
        try:
            batch = self._decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._malformed(f"undecodable batch: {exc}")
            return
        self.batches += 1
        for event in batch.events:
            self.events += 1
            if isinstance(event, AllBlocksCleared):
                self.index.cleared()
                continue
            if event.group_idx not in (None, 0):
                self.ignored += 1
                continue
            try:
                if isinstance(event, BlockStored):
                    self._fit_block_size(event.block_size)
                    self.index.stored(
                        block_hashes=event.block_hashes,
                        parent_hash=event.parent_block_hash,
                        session_id=event.session_id,
                        medium=event.medium,
                        block_size=event.block_size,
                    )
                else:
                    self.index.removed(block_hashes=event.block_hashes, medium=event.medium)
            except ValueError as exc:
                self._malformed(str(exc))

    def _fit_block_size(self, block_size: int) -> None:
        """Take the engine's block size from its first stored block (the router's default is a guess)."""
        index = self.index
        if block_size == index.block_size or index.stats.stored or block_size < 1:
            return
        self.index = ResidencyIndex(block_size=block_size)
        if not index.reliable:
            self.index.invalidate()

    def _malformed(self, why: str) -> None:
        self.malformed += 1
        if self.index.reliable:
            _log.warning("Marked KV index unreliable replica=%s reason=%s", self.replica, why)
        self.index.invalidate()


class KvEventHub:
    """Every replica's subscription, following the router's replica set."""

    def __init__(
        self,
        settings: KvEventsSettings,
        *,
        replicas: Callable[[], Mapping[str, str]],
        live: Callable[[], Container[str]] | None = None,
        block_size: int = 16,
        resync_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self._replicas = replicas
        """Replica name -> base URL, read at every resync."""
        self._live = live
        """The router's live sessions: at every resync, indexes forget the others (their memory stays bounded)."""
        self.block_size = block_size
        self.resync_s = resync_s
        self.subscriptions: dict[str, ReplicaKvEvents] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ctx: zmq.asyncio.Context | None = None

    def index(self, replica: str) -> ResidencyIndex | None:
        """The replica's residency index (None: no events subscribed for it)."""
        sub = self.subscriptions.get(replica)
        return None if sub is None else sub.index

    def resident_tokens(self, replica: str, session_id: str) -> int | None:
        """Leading tokens of the session's context cached on the replica, from its events (None: unknown)."""
        index = self.index(replica)
        return None if index is None else index.resident_tokens(session_id)

    def forget(self, session_id: str) -> None:
        """A session was released: every replica's index drops it."""
        for sub in self.subscriptions.values():
            sub.index.forget(session_id)

    # -- lifecycle ---------------------------------------------------------------------------

    def sync(self) -> None:
        """Subscribe to replicas that appeared (or moved), drop those that left (call from the event loop)."""
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        wanted: dict[str, KvEventSource] = {}
        for name, url in self._replicas().items():
            source = self.settings.source(name, url)
            if source is not None:
                wanted[name] = source
        for name in list(self.subscriptions):
            task = self._tasks[name]
            if wanted.get(name) != self.subscriptions[name].source or task.done():
                if task.done() and not task.cancelled() and task.exception() is not None:
                    _log.error("Failed KV event subscription replica=%s error=%r", name, task.exception())
                self._stop(name)
        if self._live is not None:
            live = self._live()
            for sub in self.subscriptions.values():
                for session in sub.index.sessions():
                    if session not in live:
                        sub.index.forget(session)
        for name, source in wanted.items():
            if name not in self.subscriptions:
                sub = ReplicaKvEvents(
                    name, source, block_size=self.block_size, replay_timeout_s=self.settings.replay_timeout_s
                )
                self.subscriptions[name] = sub
                self._tasks[name] = asyncio.get_running_loop().create_task(
                    sub.run(self._ctx), name=f"rolloutpool-router-kv-events-{name}"
                )

    async def run(self) -> None:
        """Follow the replica set until cancelled."""
        while True:
            self.sync()
            await asyncio.sleep(self.resync_s)

    def _stop(self, name: str) -> None:
        self._tasks.pop(name).cancel()
        self.subscriptions.pop(name)
        _log.info("Unsubscribed from KV events replica=%s", name)

    async def close(self) -> None:
        """Cancel every subscription and close the sockets."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.subscriptions.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # -- metrics -------------------------------------------------------------------------------

    def collector(self) -> Collector:
        """A Prometheus collector of every subscription's counts, read at scrape time."""
        return _HubCollector(self)


class _HubCollector(Collector):
    def __init__(self, hub: KvEventHub) -> None:
        self._hub = hub

    def collect(self) -> Iterator[Metric]:
        counters = {
            "batches": CounterMetricFamily(
                f"{PREFIX}kv_event_batches", "KV event batches applied (one per engine step)", labels=["replica"]
            ),
            "events": CounterMetricFamily(f"{PREFIX}kv_events", "KV events received", labels=["replica"]),
            "gaps": CounterMetricFamily(
                f"{PREFIX}kv_event_gaps", "Times KV events were missed (a sequence gap)", labels=["replica"]
            ),
            "restarts": CounterMetricFamily(
                f"{PREFIX}kv_event_publisher_restarts", "Times a replica's publisher started over", labels=["replica"]
            ),
            "malformed": CounterMetricFamily(
                f"{PREFIX}kv_events_malformed", "Messages or events that could not be applied", labels=["replica"]
            ),
        }
        replays = CounterMetricFamily(
            f"{PREFIX}kv_event_replays", "Missed KV events asked from the replay socket", labels=["replica", "outcome"]
        )
        gauges = {
            "reliable": GaugeMetricFamily(
                f"{PREFIX}kv_index_reliable",
                "1 while the replica's residency index is exact (0 after missed events until a reset)",
                labels=["replica"],
            ),
            "blocks": GaugeMetricFamily(
                f"{PREFIX}kv_index_blocks", "Cached blocks the index knows", labels=["replica"]
            ),
            "sessions": GaugeMetricFamily(
                f"{PREFIX}kv_index_sessions", "Sessions whose context the index traces", labels=["replica"]
            ),
        }
        for name, sub in sorted(self._hub.subscriptions.items()):
            for key, family in counters.items():
                family.add_metric([name], getattr(sub, key))
            replays.add_metric([name, "ok"], sub.replays_ok)
            replays.add_metric([name, "failed"], sub.replays_failed)
            stats = sub.index.stats
            gauges["reliable"].add_metric([name], float(stats.reliable))
            gauges["blocks"].add_metric([name], stats.blocks)
            gauges["sessions"].add_metric([name], stats.sessions)
        yield from counters.values()
        yield replays
        yield from gauges.values()
