"""The fleet simulator's periodic loops: the router's scrape round, prefix renewal, the operator's law, the
weight-update scenario and the samples of a run (pure, virtual time).

:class:`RouterLoops` is the base of the fleet in :mod:`rolloutpool.sim.fleet`, which owns every attribute
declared here, the trajectories and the engines. Each loop runs at its event (the kinds below, in the fleet's
one event heap) and schedules its next round.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from rolloutpool.engine.model.core import Engine, Request, StepOutcome
from rolloutpool.engine.model.hashing import SegmentChain
from rolloutpool.engine.model.pins import PinningEngine
from rolloutpool.routing.discovery import OperatorLimit
from rolloutpool.routing.ledger import Ledger
from rolloutpool.routing.table import Session, SessionTable
from rolloutpool.sim.adaptive import AdaptiveTargets
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.renewal import SimRenewals
from rolloutpool.sim.results import Sample
from rolloutpool.sim.weights import SimWeightUpdates
from rolloutpool.sim.workload import Trajectory

__all__ = ["ARRIVE", "CONTROL", "ENGINE", "SAMPLE", "SCRAPE", "WEIGHTS", "Driver", "RouterLoops", "Traj"]

ENGINE, ARRIVE, SCRAPE, SAMPLE, CONTROL, WEIGHTS = 0, 1, 2, 3, 4, 5
"""The kinds of the fleet's events: a step (or decode run) ends, a turn arrives, and the loops' rounds."""


@dataclass
class Traj:
    """A trajectory in flight: its plan, its token chain and where its turns went."""

    plan: Trajectory
    start: float
    chain: SegmentChain
    proj: int
    """Its largest context (``plan.final_context``), computed once."""
    turn: int = 0
    session: Session | None = None
    """The ledger's binding its in-flight turn was sent on."""
    replica: str | None = None
    prev_replica: str | None = None
    prev_context: int = 0
    inflight: bool = False


@dataclass
class Driver:
    """A replica's engine and the step (or decode run) it is computing."""

    name: str
    engine: Engine
    version: int = 0
    busy: bool = False
    run_start: float = 0.0
    run_steps: int = 0
    end: float = 0.0
    outcome: StepOutcome | None = None


class RouterLoops:
    """The periodic loops of the fleet (its base; the fleet sets every attribute declared here)."""

    cfg: FleetConfig
    ledger: Ledger
    table: SessionTable
    names: list[str]
    drivers: dict[str, Driver]
    trajs: dict[int, Traj]
    law: AdaptiveTargets | None
    renewals: SimRenewals | None
    weights: SimWeightUpdates | None
    live_reprefill: dict[str, int]
    samples: list[Sample]
    events: list[tuple[float, int, int, object]]
    now: float
    _last_counts: dict[str, tuple[int, int]]
    block_size: int
    _seq: int
    _rid: int

    def _push(self, t: float, kind: int, data: object) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, data))

    def _dispatch(self) -> None:
        """Submit what the ledger admitted or resumed (the fleet's)."""
        raise NotImplementedError

    def _enqueue(self, replica: str, request: Request) -> None:
        raise NotImplementedError

    def _resident(self, traj: Traj, replica: str) -> int | None:
        """The trajectory's context still cached on ``replica``, as KV events tell the router (None: not known)."""
        if self.ledger.work is None or not self.cfg.kv_events:
            return None
        blocks = max(0, traj.chain.length - 1) // self.block_size
        return self.drivers[replica].engine.pool.count_hits(traj.chain.hashes, blocks) * self.block_size

    def _count_reprefill(self, traj: Traj, replica: str, req: Request, *, turn: Session | None = None) -> None:
        raise NotImplementedError

    def _scrape(self) -> None:
        for name, driver in self.drivers.items():
            if isinstance(driver.engine, PinningEngine):
                driver.engine.tick(self.now)
            limits = self.ledger.limits.get(name)
            pressure = None if limits is None else limits.pressure
            quarantines = 0 if pressure is None else pressure.quarantines
            self.ledger.observe_scrape(
                name,
                now=self.now,
                preemptions_total=driver.engine.counters.preemptions,
                waiting=len(driver.engine.waiting),
                kv_usage=driver.engine.pool.usage,
            )
            if self.weights is not None and pressure is not None:
                self.weights.attribute_scrape(name, now=self.now, entered=pressure.quarantines - quarantines)
            self._dispatch()
        self.ledger.tick(now=self.now)  # held turns and caps follow the clock, as in the router's round
        self._dispatch()
        if self.renewals is not None:
            self._renew_due()
        self._push(self.now + self.cfg.scrape_interval_s, SCRAPE, None)

    def _renew_due(self) -> None:
        assert self.renewals is not None  # noqa: S101 -- called only with renewal on
        for sid in self.renewals.clock.due(now=self.now):
            traj = self.trajs[int(sid)]  # a finished session is forgotten by the clock
            session = self.ledger.lookup(sid)
            if session is None or traj.inflight:  # pragma: no cover - an idle live session is bound and idle
                continue
            if not self.ledger.renews(sid, resident=self._resident(traj, session.replica)):
                self.renewals.clock.skipped(sid, now=self.now)  # let go, or evicted: asked again an interval later
                continue
            self._rid += 1
            context = traj.prev_context + 1  # the last turn's prompt + output, as the client sent and received it
            request = self.renewals.request(self._rid, chain_hashes=traj.chain.hashes, context_tokens=context, tag=sid)
            self._enqueue(session.replica, request)

    def _renewed(self, replica: str, req: Request) -> None:
        assert self.renewals is not None  # noqa: S101 -- called only with renewal on
        traj = self.trajs.get(int(req.tag))
        if traj is None:  # the session's last turn finished while its renewal waited in the engine
            return
        # a renewal that found the prefix evicted computed it again: that is the live session's re-prefill
        # (done early; the next turn then finds it cached), and the fast quarantine sees it as it would a turn's
        self._count_reprefill(traj, replica, req)
        if not traj.inflight:  # still idle: renew again later
            self.renewals.clock.idle(req.tag, now=self.now)

    def _weights(self, step: str) -> None:
        """The weight-update scenario's steps: pause, flush once every engine is idle, resume."""
        weights = self.weights
        assert weights is not None  # noqa: S101 -- scheduled only with the scenario
        if step == "pause":
            weights.pause(now=self.now)
            self._push(self.now + weights.config.every_s, WEIGHTS, "pause")
            step = "flush"
        if step == "flush":
            resume_at = weights.try_flush({n: d.engine for n, d in self.drivers.items()}, now=self.now)
            if resume_at is not None:
                self._push(resume_at, WEIGHTS, "resume")
        elif step == "resume":
            for replica, request in weights.resume(now=self.now):
                self._enqueue(replica, request)

    def _control(self) -> None:
        assert self.law is not None  # noqa: S101 -- scheduled only with a law
        work = self.ledger.work
        controls = self.law.step(
            now=self.now,
            engines={n: d.engine for n, d in self.drivers.items()},
            live={n: self.table.replicas[n].live for n in self.names},
            reprefill=self.live_reprefill,
            held={n: 0 if work is None else work.held(n) for n in self.names},
            queued=len(self.ledger.queue),
        )
        status = {  # what the operator writes into the pool's status, applied by the router as a whole
            name: OperatorLimit(control.target, control.quarantined, control.reason if control.quarantined else None)
            for name, control in controls.items()
        }
        self.ledger.set_operator_limits(status, now=self.now)
        self._dispatch()
        self._push(self.now + self.cfg.control_interval_s, CONTROL, None)

    def _sample(self) -> None:
        for name, driver in self.drivers.items():
            c = driver.engine.counters
            q0, h0 = self._last_counts[name]
            dq, dh = c.prefix_queries - q0, c.prefix_hits - h0
            self._last_counts[name] = (c.prefix_queries, c.prefix_hits)
            self.samples.append(
                Sample(
                    t=self.now,
                    replica=name,
                    live=self.table.replicas[name].live,
                    hit_ratio=dh / dq if dq else None,
                    usage=driver.engine.pool.usage,
                    quarantined=self.table.replicas[name].quarantined,
                    queued=len(self.ledger.queue),
                )
            )
        self._push(self.now + self.cfg.sample_interval_s, SAMPLE, None)
