"""Sessions: the async shell around the pure session table, the policy and quarantine.

Every decision is delegated: :class:`~rolloutpool.routing.table.SessionTable` holds
sessions and derives live counts, :class:`~rolloutpool.routing.policies.SessionAware`
picks the replica of a new session, :class:`~rolloutpool.routing.quarantine.PressureState`
decides quarantine. This module adds what needs an event loop: the bounded FIFO
admission queue (futures resolved when a slot frees), in-flight bookkeeping so idle
expiry never takes a session mid-request, and metrics.

All mutations run on the event loop thread without awaiting in between, so each one
is atomic with respect to the others; counts stay exact under any interleaving.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rolloutpool.router.config import ReplicaSpec, RouterConfig, resolve_cap
from rolloutpool.router.metrics import ReplicaGauges, RouterMetrics
from rolloutpool.router.types import Clock
from rolloutpool.routing.discovery import OperatorLimit, combined_cap
from rolloutpool.routing.policies import Placement, SessionAware
from rolloutpool.routing.quarantine import PressureState, expected_cached_tokens
from rolloutpool.routing.table import ReplicaState, Session, SessionTable
from rolloutpool.routing.weights import WeightTracker, observe_scrape_excused

__all__ = [
    "AdmissionError",
    "QueueFullError",
    "QueueTimeoutError",
    "ReleasedWhileQueuedError",
    "ReplicaRuntime",
    "SessionManager",
    "ShuttingDownError",
    "Usage",
]

_log = logging.getLogger(__name__)


class AdmissionError(Exception):
    """A new session could not be placed."""


class QueueFullError(AdmissionError):
    """The admission queue is full (answered 429)."""


class QueueTimeoutError(AdmissionError):
    """The session waited ``queue_timeout_s`` without a slot (answered 503)."""


class ShuttingDownError(AdmissionError):
    """The router is stopping (answered 503)."""


class ReleasedWhileQueuedError(AdmissionError):
    """The session was released while it waited in the queue (answered 503; it holds no slot)."""


@dataclass(frozen=True)
class Usage:
    """Token counts of one response."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    """``usage.prompt_tokens_details.cached_tokens``; None when the engine does not report it."""


@dataclass
class ReplicaRuntime:
    """What the router knows about a replica beyond the pure table."""

    spec: ReplicaSpec
    pressure: PressureState
    block_size: int
    capacity_tokens: int | None = None
    scrape_failures: int = 0
    """Consecutive failed scrapes."""
    last_scrape: float | None = None
    signals: dict[str, float] = field(default_factory=dict)
    """Last scraped signals, for the admin API."""
    unready_reason: str | None = None
    operator: OperatorLimit | None = None
    """Cap and quarantine the operator wrote into the RolloutPool status, if any."""


@dataclass
class _Waiter:
    placement: Placement
    future: asyncio.Future[Session]
    enqueued: float


class SessionManager:
    """Live sessions of the router; the only writer of the session table."""

    def __init__(self, config: RouterConfig, *, clock: Clock, metrics: RouterMetrics) -> None:
        self.config = config
        self.clock = clock
        self.metrics = metrics
        self.table = SessionTable()
        self.policy = SessionAware(co_locate_groups=config.co_locate_groups)
        self.runtime: dict[str, ReplicaRuntime] = {}
        self._queue: collections.deque[_Waiter] = collections.deque()
        self._inflight: collections.Counter[str] = collections.Counter()
        self._release_pending: dict[str, str] = {}
        """Busy sessions to release when their last request in flight ends, with how (``release_when_idle``)."""
        self._closed = False
        self.weights = WeightTracker()
        """Weight updates: flushes per replica, salts per session (re-prefill they cause is not eviction)."""
        self.on_change: Callable[[], None] = lambda: None
        """Called after every change of the session table (snapshots hook in here)."""
        self.on_forget: Callable[[str], None] = lambda _: None
        """Called with the id of each session that stops being live (released, expired, its replica gone)."""
        for spec in config.replicas:
            self.add_replica(spec)
        metrics.watch(self._gauges, lambda: len(self._queue))

    # -- membership ----------------------------------------------------------------------

    def add_replica(self, spec: ReplicaSpec) -> None:
        """Start placing on a replica; one known under another URL is replaced (a new pod)."""
        known = self.runtime.get(spec.name)
        if known is not None:
            if known.spec.url == spec.url:
                return
            self.remove_replica(spec.name, reason="Replaced")
        self.table.add_replica(spec.name, cap=resolve_cap(self.config, spec, capacity_tokens=None))
        self.runtime[spec.name] = ReplicaRuntime(
            spec=spec, pressure=PressureState(self.config.quarantine), block_size=self.config.default_block_size
        )
        # a counter that appears at its first increment is invisible to rate(): start it at 0
        self.metrics.reprefilled_tokens.labels(spec.name).inc(0)
        _log.info("Added replica replica=%s url=%s", spec.name, spec.url)
        self.admit_waiting()

    def remove_replica(self, name: str, *, reason: str) -> list[str]:
        """Stop placing on a replica; its sessions are dropped and re-placed on their next turn."""
        if name not in self.runtime:
            return []
        lost = self.table.remove_replica(name)
        del self.runtime[name]
        for session_id in lost:
            self._inflight.pop(session_id, None)
            self._release_pending.pop(session_id, None)
            self.on_forget(session_id)
            self.metrics.releases.labels("replica_lost").inc()
        _log.info("Removed replica replica=%s reason=%s sessions=%d", name, reason, len(lost))
        self.on_change()
        return lost

    # -- views -----------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """New sessions waiting for a slot."""
        return len(self._queue)

    def replica(self, name: str) -> ReplicaState:
        """The table's state of a replica."""
        return self.table.replicas[name]

    def lookup(self, session_id: str) -> Session | None:
        """The live session, or None."""
        return self.table.lookup(session_id)

    def is_current(self, session: Session) -> bool:
        """Whether ``session`` is still the live binding of its id (not released or re-placed since)."""
        return self.table.sessions.get(session.session_id) is session

    def any_ready(self) -> bool:
        """Whether at least one replica is ready."""
        return any(r.ready for r in self.table.replicas.values())

    def _gauges(self) -> Iterator[ReplicaGauges]:
        for r in self.table.replicas.values():
            own = self.runtime.get(r.name)  # the router's own fast quarantine, without the operator's
            pressure = (own.pressure.reason or "Unknown") if own and own.pressure.quarantined else None
            yield ReplicaGauges(r.name, r.live, r.cap, r.quarantined, r.ready, r.draining, r.inflight, pressure)

    # -- placement and admission -------------------------------------------------------

    async def acquire(self, session_id: str, *, group: str | None, ephemeral: bool = False) -> tuple[Session, bool]:
        """The session's binding, placing it (and waiting in the queue) when new; returns (session, created).

        An existing session returns to its replica unless that replica is gone or not
        ready; then it is re-placed like a new one. Raises :class:`AdmissionError`.
        """
        now = self.clock()
        current = self.table.lookup(session_id)
        if current is not None:
            replica = self.table.replicas.get(current.replica)
            if replica is not None and replica.ready:
                current.last_seen = now
                return current, False
            self.release(session_id, how="replaced")
        placement = Placement(session_id=session_id, group=group)
        if not self._queue:
            session = self._place(placement, kind="new")
            if session is not None:
                return session, True
        session = await self._wait(placement, ephemeral=ephemeral)
        if not self.is_current(session) or session.replica not in self.runtime:
            # re-bound (snapshot restore) or its replica left between admission and now
            return await self.acquire(session_id, group=group, ephemeral=ephemeral)
        return session, True

    def _place(self, placement: Placement, *, kind: str) -> Session | None:
        if self._closed:
            return None
        name = self.policy.choose(placement, self.table)
        if name is None:
            return None
        session = self.table.bind(placement.session_id, name, now=self.clock(), group=placement.group)
        self.metrics.placements.labels(name, kind).inc()
        self.on_change()
        return session

    async def _wait(self, placement: Placement, *, ephemeral: bool) -> Session:
        if self._closed:
            raise ShuttingDownError("the router is shutting down")
        if len(self._queue) >= self.config.queue_max:
            self.metrics.rejections.labels("queue_full").inc()
            raise QueueFullError(f"admission queue is full ({self.config.queue_max} sessions waiting)")
        waiter = _Waiter(placement, asyncio.get_running_loop().create_future(), self.clock())
        self._queue.append(waiter)
        try:
            async with asyncio.timeout(self.config.queue_timeout_s):
                session = await asyncio.shield(waiter.future)
        except TimeoutError:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                session = waiter.future.result()  # admitted as time ran out
            else:
                self._forget(waiter)
                self.metrics.queue_wait.labels("timeout").observe(self.clock() - waiter.enqueued)
                self.metrics.rejections.labels("queue_timeout").inc()
                raise QueueTimeoutError(
                    f"no replica could take a new session within {self.config.queue_timeout_s:g} s"
                ) from None
        except asyncio.CancelledError:
            self._forget(waiter)
            admitted = waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None
            if ephemeral and admitted:
                self.release(placement.session_id, how="cancelled")
            raise
        self.metrics.queue_wait.labels("admitted").observe(self.clock() - waiter.enqueued)
        return session

    def withdraw(self, session_id: str) -> bool:
        """Take a session's waiters out of the admission queue; whether there were any."""
        found = [w for w in self._queue if w.placement.session_id == session_id and not w.future.done()]
        for waiter in found:
            self._queue.remove(waiter)
            waiter.future.set_exception(ReleasedWhileQueuedError(f"session {session_id!r} was released while queued"))
            waiter.future.exception()  # retrieved: no "never retrieved" warning if the handler is gone
        if found:
            self.metrics.rejections.labels("released_while_queued").inc()
            self.admit_waiting()
        return bool(found)

    def _forget(self, waiter: _Waiter) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(waiter)
        if not waiter.future.done():
            waiter.future.cancel()

    def admit_waiting(self) -> None:
        """Place queued sessions, oldest first, while a replica may take them (FIFO: the head blocks)."""
        while self._queue and not self._closed:
            waiter = self._queue[0]
            if waiter.future.done():
                self._queue.popleft()
                continue
            existing = self.table.lookup(waiter.placement.session_id)
            session = existing or self._place(waiter.placement, kind="queued")
            if session is None:
                return
            self._queue.popleft()
            waiter.future.set_result(session)

    def close(self) -> None:
        """Refuse new sessions and fail every waiter (shutdown)."""
        self._closed = True
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.future.done():
                waiter.future.set_exception(ShuttingDownError("the router is shutting down"))
                waiter.future.exception()  # retrieved: no "never retrieved" warning if the waiter is gone

    # -- release -----------------------------------------------------------------------

    def release(self, session_id: str, *, how: str) -> Session | None:
        """Release a session; None when unknown (counts unchanged). Admits waiting sessions.

        A session still waiting in the admission queue leaves it (its request is answered
        with :class:`ReleasedWhileQueuedError`), so it can never be placed after its release.
        """
        self._release_pending.pop(session_id, None)
        session = self.table.release(session_id)
        if session is None:
            self.withdraw(session_id)
            return None
        self.metrics.releases.labels(how).inc()
        self._inflight.pop(session_id, None)
        self.weights.forget(session_id)
        self.on_forget(session_id)
        runtime = self.runtime.get(session.replica)
        if runtime is not None and how not in {"replaced", "upstream_error"}:
            runtime.pressure.session_finished()
            self._sync_quarantine(session.replica)
        self.on_change()
        self.admit_waiting()
        return session

    def release_when_idle(self, session_id: str, *, how: str) -> tuple[Session | None, bool]:
        """Release a session now, or when its requests in flight end; returns (session, deferred). Never waits.

        A deferred session keeps its replica until its turn is answered and measured; the
        next request after that finds no session and is placed as a new one.
        """
        if self.busy(session_id):
            self._release_pending[session_id] = how
            return self.table.lookup(session_id), True
        return self.release(session_id, how=how), False

    def expire(self) -> list[Session]:
        """Release sessions idle past ``idle_timeout_s``; sessions with a request in flight are never idle."""
        now = self.clock()
        for sid in self._inflight:
            held = self.table.sessions.get(sid)
            if held is not None:
                held.last_seen = now
        stale = self.table.expire(now=now, idle_timeout=self.config.idle_timeout_s)
        for session in stale:
            self.on_forget(session.session_id)
            self.metrics.expiries.inc()
            self.metrics.releases.labels("expired").inc()
            runtime = self.runtime.get(session.replica)
            if runtime is not None:
                runtime.pressure.session_finished()
                self._sync_quarantine(session.replica)
        if stale:
            _log.info("Expired idle sessions count=%d idle_timeout_s=%g", len(stale), self.config.idle_timeout_s)
            self.on_change()
            self.admit_waiting()
        return stale

    # -- requests of a session --------------------------------------------------------

    def begin(self, session: Session) -> None:
        """A request of ``session`` is being proxied (a stale binding pins nothing, as in :meth:`end`)."""
        if self.is_current(session):
            self._inflight[session.session_id] += 1
        replica = self.table.replicas.get(session.replica)
        if replica is not None:
            replica.inflight += 1

    def busy(self, session_id: str) -> bool:
        """Whether the session has a request in flight."""
        return self._inflight.get(session_id, 0) > 0

    def end(self, session: Session) -> None:
        """The request started by :meth:`begin` is over."""
        sid = session.session_id
        if self.is_current(session) and self._inflight[sid] > 0:
            self._inflight[sid] -= 1
            if self._inflight[sid] == 0:
                del self._inflight[sid]
                if (how := self._release_pending.pop(sid, None)) is not None:
                    self.release(sid, how=how)
        replica = self.table.replicas.get(session.replica)
        if replica is not None and replica.inflight > 0:
            replica.inflight -= 1
        if self.is_current(session):
            session.last_seen = self.clock()

    def finish_turn(self, session: Session, *, usage: Usage | None) -> None:
        """A turn's usage: spot re-prefill of a returning session, then remember the new context.

        Without usage the context is forgotten, so the next turn is not compared with a stale one.
        """
        if not self.is_current(session):
            return  # released (or re-placed) while the request ran
        if usage is None:
            session.context_tokens = 0
            return
        self.observe_cached(session, usage=usage)
        session.context_tokens = usage.prompt_tokens + usage.completion_tokens
        self.on_change()

    def observe_cached(self, session: Session, *, usage: Usage) -> int:
        """Compare a response's ``cached_tokens`` with the session's previous context; returns the shortfall.

        A shortfall is re-prefill of a live session's evicted prefix: counted per replica and fed to the
        fast quarantine. Used for turns (:meth:`finish_turn`) and prefix renewals (the context is unchanged).
        """
        excuse = self.weights.excuse(session.session_id, session.replica)  # a weight update: routing/weights.py
        runtime = self.runtime.get(session.replica)
        if runtime is None or session.context_tokens <= 0 or usage.cached_tokens is None:
            return 0
        expected = expected_cached_tokens(
            previous_context=session.context_tokens - 1,
            prompt_tokens=usage.prompt_tokens,
            block_size=runtime.block_size,
        )
        if excuse is not None:
            _log.info(
                "Observed expected re-prefill replica=%s session=%s reason=%s",
                session.replica,
                session.session_id,
                excuse,
            )
            return 0
        before = runtime.pressure.quarantines
        shortfall = runtime.pressure.observe_response(
            now=self.clock(), expected_cached=expected, cached=usage.cached_tokens
        )
        if shortfall:
            self.metrics.reprefilled_tokens.labels(session.replica).inc(shortfall)
            _log.info(
                "Observed re-prefill replica=%s session=%s expected_cached=%d cached=%d",
                session.replica,
                session.session_id,
                expected,
                usage.cached_tokens,
            )
        self._sync_quarantine(session.replica, entered=runtime.pressure.quarantines > before)
        return shortfall

    def upstream_failed(self, session: Session, *, replica_down: bool) -> None:
        """The replica failed this session's request: unbind it (re-placed next turn), maybe mark the replica down."""
        if replica_down:  # first, so the slot the release frees is not handed to a queued session there
            self.set_ready(session.replica, False, reason="UpstreamUnreachable")
        if self.is_current(session):
            self.release(session.session_id, how="upstream_error")

    # -- replica state -----------------------------------------------------------------

    def set_ready(self, name: str, ready: bool, *, reason: str | None = None) -> None:
        """Mark a replica ready or not; an unready replica takes no sessions and loses its own on their next turn."""
        replica = self.table.replicas.get(name)
        if replica is None or replica.ready == ready:
            return
        replica.ready = ready
        self.runtime[name].unready_reason = None if ready else reason
        _log.info("Marked replica ready=%s replica=%s reason=%s", ready, name, reason)
        if ready:
            self.admit_waiting()

    def set_capacity(self, name: str, capacity_tokens: int | None, block_size: int | None) -> None:
        """A replica's reported KV capacity and block size: recompute its cap."""
        runtime = self.runtime[name]
        if block_size:
            runtime.block_size = block_size
        if capacity_tokens is None:
            capacity_tokens = runtime.capacity_tokens  # keep the last report
        runtime.capacity_tokens = capacity_tokens
        self._apply_cap(name)

    def set_operator_limits(self, limits: dict[str, OperatorLimit]) -> None:
        """The operator's caps and quarantine (RolloutPool status); they combine with the router's own."""
        for name, runtime in self.runtime.items():
            limit = limits.get(name)
            if limit == runtime.operator:
                continue
            runtime.operator = limit
            _log.info("Set operator limits replica=%s limits=%s", name, limit)
            self._apply_cap(name)
            self._sync_quarantine(name)

    def _apply_cap(self, name: str) -> None:
        runtime = self.runtime[name]
        replica = self.table.replicas[name]
        config = self.config
        own = resolve_cap(config, runtime.spec, capacity_tokens=runtime.capacity_tokens)
        fixed = runtime.spec.cap is not None or config.cap is not None or config.max_model_len is None
        operator = runtime.operator.cap if runtime.operator else None
        cap = combined_cap(own, operator, own_fixed=fixed, ceiling=config.cap_ceiling)
        if cap != replica.cap:
            _log.info("Set session cap replica=%s cap=%s capacity_tokens=%s", name, cap, runtime.capacity_tokens)
            replica.cap = cap
            self.admit_waiting()

    def observe_scrape(self, name: str, *, preemptions_total: float, waiting: float) -> None:
        """Feed a scrape's pressure signals to the replica's quarantine state."""
        pressure = self.runtime[name].pressure
        before = pressure.quarantines
        if self.weights.in_grace(name, now=self.clock()):  # the re-prefill burst after a weight update
            observe_scrape_excused(pressure, now=self.clock(), preemptions_total=preemptions_total)
        else:
            pressure.observe_scrape(now=self.clock(), preemptions_total=preemptions_total, waiting=waiting)
        self._sync_quarantine(name, entered=pressure.quarantines > before)

    def _sync_quarantine(self, name: str, *, entered: bool = False) -> None:
        replica = self.table.replicas[name]
        pressure = self.runtime[name].pressure
        if entered:
            self.metrics.quarantines.labels(name, pressure.reason or "Unknown").inc()
            _log.info("Quarantined replica=%s reason=%s", name, pressure.reason)
        was = replica.quarantined
        operator = self.runtime[name].operator
        replica.quarantined = pressure.quarantined or bool(operator and operator.quarantined)
        if was and not replica.quarantined:
            _log.info("Lifted quarantine replica=%s", name)
            self.admit_waiting()

    def set_draining(self, name: str, draining: bool) -> None:
        """Drain a replica (keeps its sessions, takes no new ones) or undo it."""
        replica = self.table.replicas[name]
        if replica.draining != draining:
            replica.draining = draining
            _log.info("Set draining replica=%s draining=%s", name, draining)
            self.on_change()
            if not draining:
                self.admit_waiting()

    def restore(self, session_id: str, replica: str, *, group: str | None, last_seen: float, context: int) -> None:
        """Re-create a session from a snapshot (no placement decision, no metrics)."""
        session = self.table.bind(session_id, replica, now=last_seen, group=group)
        session.context_tokens = context
