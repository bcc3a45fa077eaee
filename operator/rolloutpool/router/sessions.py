"""Sessions: the async shell around the pure session ledger.

Every decision is the :class:`~rolloutpool.routing.ledger.Ledger`'s: the session table, the
placement policy, caps (:func:`~rolloutpool.routing.caps.effective_cap`), quarantine, the
admission queue and the release semantics, the same code ``rolloutpool simulate`` drives. This
module adds what needs an event loop or the outside world: a future per queued request (resolved
from the ledger's :class:`~rolloutpool.routing.events.Admitted` and
:class:`~rolloutpool.routing.events.Withdrawn` events), the queue timeout, metrics and logs.

All mutations run on the event loop thread without awaiting in between, so each one
is atomic with respect to the others; counts stay exact under any interleaving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rolloutpool.router.admission import (
    AdmissionError,
    QueueFullError,
    QueueTimeoutError,
    ReleasedWhileQueuedError,
    ShuttingDownError,
)
from rolloutpool.router.config import ReplicaSpec, RouterConfig, ledger_config
from rolloutpool.router.engine_reports import observe_cached_report
from rolloutpool.router.instruments import RouterMetrics
from rolloutpool.router.replicas import ReplicaRuntime, replica_gauges
from rolloutpool.router.trace_writer import TraceWriter
from rolloutpool.router.types import Clock
from rolloutpool.routing.discovery import OperatorLimit
from rolloutpool.routing.events import (
    Admitted,
    Bound,
    CapChanged,
    Held,
    Placed,
    QuarantineChanged,
    Rejected,
    Released,
    Resumed,
    Withdrawn,
)
from rolloutpool.routing.ledger import Ledger, Usage
from rolloutpool.routing.peers.registry import make_scheduler, placement_for
from rolloutpool.routing.policies import Placement, SessionAware
from rolloutpool.routing.table import ReplicaState, Session, SessionTable
from rolloutpool.routing.weights import WeightTracker

__all__ = [
    "AdmissionError",
    "QueueFullError",
    "QueueTimeoutError",
    "ReleasedWhileQueuedError",
    "SessionManager",
    "ShuttingDownError",
    "Usage",
]

_log = logging.getLogger(__name__)


class SessionManager:
    """Live sessions of the router; drives the ledger, the only writer of the session table."""

    def __init__(self, config: RouterConfig, *, clock: Clock, metrics: RouterMetrics) -> None:
        self.config = config
        self.clock = clock
        self.metrics = metrics
        if config.turn_scheduler is None:
            self.ledger = Ledger(ledger_config(config), policy=SessionAware(co_locate_groups=config.co_locate_groups))
        else:  # a peer's turn scheduler and its placement (routing/peers/, docs/peers.md)
            scheduler = make_scheduler(config.turn_scheduler, config.turn_scheduler_config)
            self.ledger = Ledger(ledger_config(config, scheduler=scheduler), policy=placement_for(scheduler))
        self.runtime: dict[str, ReplicaRuntime] = {}
        self._waiters: dict[int, asyncio.Future[Session]] = {}
        self.on_change: Callable[[], None] = lambda: None
        """Called after every change of the session table (snapshots hook in here)."""
        self.on_forget: Callable[[str], None] = lambda _: None
        """Called with the id of each session that stops being live (released, expired, its replica gone)."""
        self.trace: TraceWriter | None = None
        """The turn trace (``--trace-file``), fed from acquire, finish_turn and releases."""
        self.resident: Callable[[str, str], int | None] = lambda _replica, _sid: None
        """(replica, session) -> its context still cached there, from the engines' KV events (None: unknown)."""
        for spec in config.replicas:
            self.add_replica(spec)
        metrics.watch(lambda: replica_gauges(self.ledger, self.runtime), lambda: len(self.ledger.queue))

    @property
    def table(self) -> SessionTable:
        """The ledger's session table (read it; change it only through the manager)."""
        return self.ledger.table

    @property
    def policy(self) -> SessionAware:
        """The placement policy."""
        policy = self.ledger.policy
        assert isinstance(policy, SessionAware)  # noqa: S101 -- set in __init__
        return policy

    @property
    def weights(self) -> WeightTracker:
        """Weight updates: flushes per replica, salts per session (re-prefill they cause is not eviction)."""
        return self.ledger.weights

    @property
    def _inflight(self) -> dict[str, int]:
        """Sessions with requests in flight (a view, for tests)."""
        return {sid: s.inflight for sid, s in self.table.sessions.items() if s.inflight}

    # -- events ---------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Act on what the ledger changed: futures, metrics, logs, callbacks."""
        changed = False
        for event in self.ledger.take_events():
            if isinstance(event, Placed):
                self.metrics.placements.labels(event.session.replica, event.kind).inc()
                changed = True
            elif isinstance(event, Admitted | Resumed):
                future = self._waiters.pop(event.ticket, None)
                if future is not None and not future.done():
                    future.set_result(event.session)
            elif isinstance(event, Withdrawn):
                self._withdrawn(event)
            elif isinstance(event, Released):
                self.metrics.releases.labels(event.how).inc()
                self.on_forget(event.session.session_id)
                if self.trace is not None:
                    self.trace.released(event.session.session_id, how=event.how, now=self.clock())
                changed = True
            elif isinstance(event, QuarantineChanged):
                self._quarantine_changed(event)
            elif isinstance(event, CapChanged):
                _log.info(
                    "Set session cap replica=%s cap=%s capacity_tokens=%s",
                    event.replica,
                    event.cap,
                    event.capacity_tokens,
                )
        if changed:
            self.on_change()

    def _withdrawn(self, event: Withdrawn) -> None:
        future = self._waiters.pop(event.ticket, None)
        if future is None or future.done():
            return
        if event.reason == "released":
            future.set_exception(ReleasedWhileQueuedError(f"session {event.session_id!r} was released while queued"))
        else:
            future.set_exception(ShuttingDownError("the router is shutting down"))
        future.exception()  # retrieved: no "never retrieved" warning if the waiter is gone

    def _quarantine_changed(self, event: QuarantineChanged) -> None:
        if event.entered:
            self.metrics.quarantines.labels(event.replica, event.reason or "Unknown").inc()
            _log.info("Quarantined replica=%s reason=%s", event.replica, event.reason)
        elif not event.quarantined:
            _log.info("Lifted quarantine replica=%s", event.replica)

    # -- membership ----------------------------------------------------------------------

    def add_replica(self, spec: ReplicaSpec) -> None:
        """Start placing on a replica; one known under another URL is replaced (a new pod)."""
        known = self.runtime.get(spec.name)
        if known is not None:
            if known.spec.url == spec.url:
                return
            self.remove_replica(spec.name, reason="Replaced")
        self.ledger.add_replica(spec.name, now=self.clock(), fixed_cap=spec.cap)
        self.runtime[spec.name] = ReplicaRuntime(spec=spec, limits=self.ledger.limits[spec.name])
        # a counter that appears at its first increment is invisible to rate(): start it at 0
        self.metrics.reprefilled_tokens.labels(spec.name).inc(0)
        _log.info("Added replica replica=%s url=%s", spec.name, spec.url)
        self._dispatch()

    def remove_replica(self, name: str, *, reason: str) -> list[str]:
        """Stop placing on a replica; its sessions are dropped and re-placed on their next turn."""
        if name not in self.runtime:
            return []
        lost = self.ledger.remove_replica(name)
        del self.runtime[name]
        _log.info("Removed replica replica=%s reason=%s sessions=%d", name, reason, len(lost))
        self._dispatch()
        self.on_change()
        return [s.session_id for s in lost]

    # -- views -----------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """New sessions waiting for a slot."""
        return len(self.ledger.queue)

    def replica(self, name: str) -> ReplicaState:
        """The table's state of a replica."""
        return self.table.replicas[name]

    def lookup(self, session_id: str) -> Session | None:
        """The live session, or None (also once its release was asked for)."""
        return self.ledger.lookup(session_id)

    def is_current(self, session: Session) -> bool:
        """Whether ``session`` is still the live binding of its id (not released or re-placed since)."""
        return self.ledger.is_current(session)

    def any_ready(self) -> bool:
        """Whether at least one replica is ready."""
        return any(r.ready for r in self.table.replicas.values())

    # -- placement and admission -------------------------------------------------------

    async def acquire(
        self, session_id: str, *, group: str | None, ephemeral: bool = False, turns: bool = True
    ) -> tuple[Session, bool]:
        """The session's binding, placing it (and waiting in the queue) when new; returns (session, created).

        An existing session returns to its replica unless that replica is gone or not
        ready; then it is re-placed like a new one. An ``ephemeral`` session (a request without
        a session id) is released when its turn ends. Raises :class:`AdmissionError`.
        """
        arrived = self.clock()
        live = self.ledger.lookup(session_id)
        resident = None if live is None else self.resident(live.replica, session_id)
        placement = Placement(session_id=session_id, group=group, resident_tokens=resident, turns=turns)
        decision = self.ledger.arrive(placement, now=arrived, one_turn=ephemeral)
        self._dispatch()
        if isinstance(decision, Bound):
            if self.trace is not None:
                self.trace.arrived(session_id, now=arrived, group=group)
            return decision.session, decision.created
        if isinstance(decision, Rejected):
            if decision.reason == "shutting_down":
                raise ShuttingDownError("the router is shutting down")
            self.metrics.rejections.labels("queue_full").inc()
            raise QueueFullError(f"admission queue is full ({self.config.queue_max} sessions waiting)")
        if isinstance(decision, Held):
            session = await self._wait_held(decision.ticket, session_id)
            if self.trace is not None:
                self.trace.arrived(session_id, now=arrived, group=group)
            return session, False
        session = await self._wait(decision.ticket, session_id, ephemeral=ephemeral)
        if not self.is_current(session) or session.replica not in self.runtime:
            # re-bound (snapshot restore) or its replica left between admission and now
            return await self.acquire(session_id, group=group, ephemeral=ephemeral, turns=turns)
        if self.trace is not None:
            self.trace.arrived(session_id, now=arrived, group=group)
        return session, True

    async def _wait(self, ticket: int, session_id: str, *, ephemeral: bool) -> Session:
        future: asyncio.Future[Session] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = future
        enqueued = self.clock()
        try:
            async with asyncio.timeout(self.config.queue_timeout_s):
                session = await asyncio.shield(future)
        except TimeoutError:
            if future.done() and not future.cancelled() and future.exception() is None:
                session = future.result()  # admitted as time ran out
            else:
                self._give_up(ticket, future)
                self.metrics.queue_wait.labels("timeout").observe(self.clock() - enqueued)
                self.metrics.rejections.labels("queue_timeout").inc()
                raise QueueTimeoutError(
                    f"no replica could take a new session within {self.config.queue_timeout_s:g} s"
                ) from None
        except asyncio.CancelledError:
            admitted = future.done() and not future.cancelled() and future.exception() is None
            self._give_up(ticket, future)
            if ephemeral and admitted:
                self.release(session_id, how="cancelled")
            raise
        self.metrics.queue_wait.labels("admitted").observe(self.clock() - enqueued)
        return session

    async def _wait_held(self, ticket: int, session_id: str) -> Session:
        """A held turn waits until the ledger resumes it (it bounds the wait itself: ``hold_limit_s``)."""
        future: asyncio.Future[Session] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = future
        held = self.clock()
        try:
            session = await asyncio.shield(future)
        except asyncio.CancelledError:  # the client went away: the turn leaves the hold, the session stays
            self._waiters.pop(ticket, None)
            if not future.done():
                future.cancel()
                self.ledger.cancel_held(session_id, now=self.clock(), ticket=ticket)
            elif not future.cancelled() and future.exception() is None:  # resumed as it went: no request follows
                self.ledger.withdraw_resumed(future.result(), now=self.clock())
            self._dispatch()
            raise
        self.metrics.hold_wait.observe(self.clock() - held)
        return session

    def _give_up(self, ticket: int, future: asyncio.Future[Session]) -> None:
        self._waiters.pop(ticket, None)
        if not future.done():
            future.cancel()
        self.ledger.cancel(ticket, now=self.clock())
        self._dispatch()

    def admit_waiting(self) -> None:
        """Place queued sessions, oldest first, while a replica may take them (FIFO: the head blocks)."""
        self.ledger.admit(now=self.clock())
        self._dispatch()

    def close(self) -> None:
        """Refuse new sessions and fail every waiter (shutdown)."""
        self.ledger.close()
        self._dispatch()

    # -- release -----------------------------------------------------------------------

    def release(self, session_id: str, *, how: str) -> Session | None:
        """Release a session; None when there was nothing to release (idempotent; never blocks).

        A session with a request in flight is released when that request ends. A session still
        waiting in the admission queue leaves it (its request is answered with
        :class:`ReleasedWhileQueuedError`), so it can never be placed after its release.
        """
        withdrawn = sum(w.placement.session_id == session_id for w in self.ledger.queue)
        session = self.ledger.release(session_id, how=how, now=self.clock())
        if withdrawn:
            self.metrics.rejections.labels("released_while_queued").inc()
        self._dispatch()
        return session

    def release_when_idle(self, session_id: str, *, how: str) -> tuple[Session | None, bool]:
        """Release a session now, or when its requests in flight end; returns (session, deferred). Never waits.

        A deferred session keeps its replica until its turn is answered and measured; the
        next request after that finds no session and is placed as a new one.
        """
        pending = self.table.sessions.get(session_id)
        if pending is not None and pending.release_how is not None:
            return pending, True  # asked again: still the one release that waits for the turn
        busy = self.busy(session_id)
        session = self.release(session_id, how=how)
        return session, busy and session is not None

    def expire(self) -> list[Session]:
        """Release sessions idle past ``idle_timeout_s``; sessions with a request in flight are never idle."""
        stale = self.ledger.expire(now=self.clock(), idle_timeout=self.config.idle_timeout_s)
        if stale:
            self.metrics.expiries.inc(len(stale))
            _log.info("Expired idle sessions count=%d idle_timeout_s=%g", len(stale), self.config.idle_timeout_s)
        self._dispatch()
        return stale

    # -- requests of a session --------------------------------------------------------

    def begin(self, session: Session) -> None:
        """A request of ``session`` is being proxied (a stale binding pins nothing, as in :meth:`end`)."""
        self.ledger.turn_started(session)

    def busy(self, session_id: str) -> bool:
        """Whether the session has a request in flight."""
        session = self.table.sessions.get(session_id)
        return session is not None and session.inflight > 0

    def end(self, session: Session) -> None:
        """The request started by :meth:`begin` is over (a release asked for meanwhile happens now)."""
        self.ledger.turn_ended(session, now=self.clock())
        self._dispatch()

    def finish_turn(self, session: Session, *, usage: Usage | None) -> None:
        """A turn's usage: spot re-prefill of a returning session, then remember the new context.

        Without usage the context is forgotten, so the next turn is not compared with a stale one.
        """
        if self.trace is not None:  # also a turn whose session was released while it ran
            self.trace.turn(session.session_id, replica=session.replica, usage=usage, now=self.clock())
        if not self.is_current(session):
            return  # released (or re-placed) while the request ran
        if usage is not None:
            self._report_cached(session, usage)
        expected, shortfall = self.ledger.finish_turn(session, now=self.clock(), usage=usage)
        if usage is not None:
            self._reprefilled(session, usage, expected=expected, shortfall=shortfall)
            self.on_change()

    def _report_cached(self, session: Session, usage: Usage) -> None:
        """Count whether the replica's answer carried ``cached_tokens`` (one warning for a replica that never does)."""
        runtime = self.runtime.get(session.replica)
        if runtime is not None:
            observe_cached_report(
                self.metrics, runtime.cached_watch, replica=session.replica, cached_tokens=usage.cached_tokens
            )

    def observe_cached(self, session: Session, *, usage: Usage) -> int:
        """Compare a response's ``cached_tokens`` with the session's previous context; returns the shortfall.

        A shortfall is re-prefill of a live session's evicted prefix: counted per replica and fed to the
        fast quarantine. Used for turns (:meth:`finish_turn`) and prefix renewals (the context is unchanged).
        """
        self._report_cached(session, usage)
        expected, shortfall = self.ledger.observe_cached(session, now=self.clock(), usage=usage)
        self._reprefilled(session, usage, expected=expected, shortfall=shortfall)
        return shortfall

    def _reprefilled(self, session: Session, usage: Usage, *, expected: int, shortfall: int) -> None:
        if shortfall:
            self.metrics.reprefilled_tokens.labels(session.replica).inc(shortfall)
            _log.info(
                "Observed re-prefill replica=%s session=%s expected_cached=%d cached=%s",
                session.replica,
                session.session_id,
                expected,
                usage.cached_tokens,
            )
        self._dispatch()

    def upstream_failed(self, session: Session, *, replica_down: bool) -> None:
        """The replica failed this session's request: unbind it (re-placed next turn), maybe mark the replica down."""
        if replica_down:  # first, so the slot the release frees is not handed to a queued session there
            self.set_ready(session.replica, False, reason="UpstreamUnreachable")
        if self.is_current(session):
            self.release(session.session_id, how="upstream_error")

    # -- replica state -----------------------------------------------------------------

    def set_ready(self, name: str, ready: bool, *, reason: str | None = None) -> None:
        """Mark a replica ready or not; an unready replica takes no sessions and loses its own on their next turn."""
        if not self.ledger.set_ready(name, ready, now=self.clock()):
            return
        self.runtime[name].unready_reason = None if ready else reason
        _log.info("Marked replica ready=%s replica=%s reason=%s", ready, name, reason)
        self._dispatch()

    def set_ready_together(self, names: list[str]) -> None:
        """Mark replicas ready that came back in one scrape round: queued sessions are spread over all of them."""
        for name in self.ledger.set_ready_together(names, now=self.clock()):
            self.runtime[name].unready_reason = None
            _log.info("Marked replica ready=True replica=%s reason=None", name)
        self._dispatch()

    def set_capacity(self, name: str, capacity_tokens: int | None, block_size: int | None) -> None:
        """A replica's reported KV capacity and block size: recompute its cap."""
        self.ledger.set_capacity(name, capacity_tokens=capacity_tokens, block_size=block_size, now=self.clock())
        if self.trace is not None:
            self.trace.replica(name, capacity_tokens=capacity_tokens, block_size=block_size, now=self.clock())
        self._dispatch()

    def set_operator_limits(self, limits: dict[str, OperatorLimit]) -> None:
        """The operator's caps and quarantine (RolloutPool status); they combine with the router's own."""
        for name in self.ledger.set_operator_limits(limits, now=self.clock()):
            _log.info("Set operator limits replica=%s limits=%s", name, limits.get(name))
        self._dispatch()

    def observe_scrape(
        self,
        name: str,
        *,
        preemptions_total: float,
        waiting: float,
        kv_usage: float | None = None,
    ) -> None:
        """Feed a scrape's pressure signals to the replica's fast quarantine."""
        now = self.clock()
        self.ledger.observe_scrape(
            name, now=now, preemptions_total=preemptions_total, waiting=waiting, kv_usage=kv_usage
        )
        self._dispatch()

    def tick(self) -> None:
        """Once per scrape round: held turns that now fit (or waited their limit) go, caps follow the clock."""
        self.ledger.tick(now=self.clock())
        self._dispatch()

    def set_draining(self, name: str, draining: bool) -> None:
        """Drain a replica (keeps its sessions, takes no new ones) or undo it."""
        if self.ledger.set_draining(name, draining, now=self.clock()):
            _log.info("Set draining replica=%s draining=%s", name, draining)
            self.on_change()
            self._dispatch()

    def restore(
        self, session_id: str, replica: str, *, group: str | None, last_seen: float, context: int, prompt: int = 0
    ) -> None:
        """Re-create a session from a snapshot (no placement decision, no metrics)."""
        self.ledger.restore(session_id, replica, group=group, last_seen=last_seen, context=context, prompt=prompt)
