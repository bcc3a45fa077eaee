"""Prefix renewal in the router: re-send an idle live session's last context so vLLM keeps it cached.

vLLM frees every finished request's blocks into one LRU free queue and cannot tell a
session waiting on a tool call from a finished one, so a long tool call loses its
prefix to the newer blocks of finished sessions. For a session idle for
``renew_every_s`` the router sends its last context (the previous prompt followed by
the generated output) with ``max_tokens=1``: a prefix hit that references the blocks
and frees them again as the newest. When to renew is decided by the same pure
:class:`~rolloutpool.routing.renewal.RenewalClock` the fleet simulator uses.

What is renewed, per live session with an explicit id, is recorded after each
successful turn (:mod:`rolloutpool.router.renewal_body`). Records live in memory
only (a restarted router renews a session after its next turn) and are dropped when
the session stops being live (released, expired, its replica gone). Their size is
bounded by the request body limit (``max_body_bytes``) plus the turn's output.

A renewal's answer is checked like a returning turn: ``cached_tokens`` short of the
session's context is that session's re-prefill (counted and fed to the fast
quarantine; its next turn then finds the context cached, so nothing counts twice).
Under turn scheduling only the prefixes the working set keeps are renewed, and only while the engines' KV
events say they are still cached (``WorkingSet.renews``): a prefix let go is the engine's to evict.
Renewals are not turns: the session's context, ``last_seen`` (idle expiry) and
turn counters are untouched. A failed renewal is counted and retried after the next
idle period (a 4xx drops the record: the same body would fail again); it never
touches the session's binding or the replica's readiness. Sessions of a replica the
router sees down (not ready) wait until it is ready again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp

from rolloutpool.router.hop import upstream_timeout
from rolloutpool.router.relay import parse_usage
from rolloutpool.router.renewal_body import renewal_body
from rolloutpool.router.sessions import SessionManager, Usage
from rolloutpool.router.types import JSONObject
from rolloutpool.routing.renewal import RenewalClock, RenewalConfig
from rolloutpool.routing.table import Session

__all__ = ["RenewalRecord", "Renewer"]

_log = logging.getLogger(__name__)

_RENEWAL_HEADERS = ("Authorization",)
"""Client headers a renewal carries (an engine behind an API key needs it); kept in memory, never logged."""


@dataclass(frozen=True)
class RenewalRecord:
    """What renews one session: its last successful turn's context."""

    path: str
    body: JSONObject
    headers: dict[str, str]


class Renewer:
    """Records, schedules and sends prefix renewals of idle live sessions (the router's I/O shell of the clock)."""

    def __init__(self, manager: SessionManager, *, every_s: float, concurrency: int = 32) -> None:
        self.manager = manager
        self.metrics = manager.metrics
        self.clock = RenewalClock(RenewalConfig(every_seconds=every_s))
        self.tick_s = min(1.0, every_s / 4)
        self.records: dict[str, RenewalRecord] = {}
        self._limit = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: aiohttp.ClientSession | None = None
        self._timeout = upstream_timeout(manager.config)
        manager.on_forget = self.forget

    def attach(self, client: aiohttp.ClientSession) -> None:
        """Send renewals with ``client`` (set at startup)."""
        self._client = client

    # -- hooks of the proxy and the session manager ------------------------------------

    def turn_started(self, session_id: str) -> None:
        """A turn of the session is being proxied: nothing to renew until it is idle again."""
        self.clock.busy(session_id)

    def turn_answered(self, session: Session, *, path: str, body: JSONObject, text: str | None, headers: Any) -> None:
        """A turn answered 200: record what renews its context (or drop the stale record when it cannot)."""
        if not self.manager.is_current(session):
            return
        renewal = None if text is None else renewal_body(path, body, text=text)
        if renewal is None:
            self.records.pop(session.session_id, None)
            return
        kept = {h: headers[h] for h in _RENEWAL_HEADERS if h in headers}
        self.records[session.session_id] = RenewalRecord(path, renewal, kept)

    def turn_ended(self, session: Session) -> None:
        """A request of the session is over: once none is in flight, its idle period starts."""
        if self.manager.is_current(session) and session.session_id in self.records:
            self._idle_again(session)

    def forget(self, session_id: str) -> None:
        """The session is no longer live: never renew it."""
        self.clock.forget(session_id)
        self.records.pop(session_id, None)

    @property
    def inflight(self) -> int:
        """Renewals sent (or waiting for a slot) and not yet answered."""
        return len(self._tasks)

    # -- the loop --------------------------------------------------------------------

    async def run(self) -> None:
        """Send due renewals every ``tick_s`` (cancelled on shutdown)."""
        while True:
            await asyncio.sleep(self.tick_s)
            self.tick()

    def tick(self) -> int:
        """Start the renewals due now; returns how many were started."""
        started = 0
        for sid in self.clock.due(now=self.manager.clock()):
            session = self.manager.lookup(sid)
            record = self.records.get(sid)
            if session is None or record is None or self.manager.busy(sid):
                continue  # released, or a turn is in flight (its end starts the next idle period)
            replica = self.manager.table.replicas.get(session.replica)
            if (
                replica is None
                or not replica.ready  # not while the replica is down
                or not self.manager.ledger.renews(sid, resident=self.manager.resident(session.replica, sid))
            ):  # nor for a prefix the turn scheduler let go, or one evicted: asked again an interval later
                self.clock.skipped(sid, now=self.manager.clock())
                continue
            task = asyncio.create_task(self._renew(session, record), name=f"rolloutpool-renewal-{sid}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            started += 1
        return started

    async def close(self) -> None:
        """Cancel the renewals in flight."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _renew(self, session: Session, record: RenewalRecord) -> None:
        replica = session.replica
        try:
            async with self._limit:
                answer = await self._send(session, record)
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._failed(session, record, type(exc).__name__)
            return
        except Exception as exc:  # a renewal must never take anything else down
            _log.exception("Failed prefix renewal replica=%s session=%s", replica, session.session_id)
            self._failed(session, record, type(exc).__name__)
            return
        if answer is None:
            return  # not sent
        status, usage = answer
        if status != 200:
            self._failed(session, record, f"http_{status}", drop=400 <= status < 500)
            return
        self.metrics.renewals.labels(replica, "ok").inc()
        if self._unchanged(session, record):
            if usage is not None:
                # a renewal that found its prefix evicted computed it again: the session's re-prefill, seen early
                self.manager.observe_cached(session, usage=usage)
            self._idle_again(session)

    async def _send(self, session: Session, record: RenewalRecord) -> tuple[int, Usage | None] | None:
        """The renewal's status and usage; None when it is no longer needed (not sent)."""
        runtime = self.manager.runtime.get(session.replica)
        if runtime is None or self._client is None or not self._unchanged(session, record):
            return None  # the replica left or a newer turn answered while this renewal waited for a slot
        if self.manager.busy(session.session_id):
            return None  # a turn is in flight: it refreshes the prefix itself, and its end starts the next idle period
        headers = {"Content-Type": "application/json", **record.headers}
        url = f"{runtime.spec.url}{record.path}"
        async with self._client.post(url, data=json.dumps(record.body), headers=headers, timeout=self._timeout) as resp:
            data = await resp.read()
            if resp.status != 200:
                return resp.status, None
        try:
            return 200, parse_usage(json.loads(data))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return 200, None

    def _unchanged(self, session: Session, record: RenewalRecord) -> bool:
        """The session is still live and its last recorded turn is still the one renewed."""
        return self.manager.is_current(session) and self.records.get(session.session_id) is record

    def _failed(self, session: Session, record: RenewalRecord, kind: str, *, drop: bool = False) -> None:
        self.metrics.renewals.labels(session.replica, "failed").inc()
        _log.warning(
            "Failed prefix renewal replica=%s session=%s kind=%s retry=%s",
            session.replica,
            session.session_id,
            kind,
            not drop,
        )
        if not self._unchanged(session, record):
            return
        if drop:
            self.records.pop(session.session_id, None)
        else:
            self._idle_again(session)

    def _idle_again(self, session: Session) -> None:
        if not self.manager.busy(session.session_id):
            self.clock.idle(session.session_id, now=self.manager.clock())
