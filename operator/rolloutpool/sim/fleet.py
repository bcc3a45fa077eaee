"""Discrete-event simulation, in virtual time, of a fleet of engine replicas behind one policy.

The replicas run the same engine model as ``engine-sim`` (:mod:`rolloutpool.engine`), the
session lifecycle is the router's own ledger (:class:`~rolloutpool.routing.ledger.Ledger`:
placement, caps, fast quarantine, admission queue, release), and the workload is
:mod:`rolloutpool.sim.workload`. An engine computes a step when it starts and the
step's results reach the router when it ends; a run of pure-decode steps is applied
lazily and cut short at the step boundary after a new request arrives, so arrivals are
admitted exactly when a step-by-step engine would admit them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from rolloutpool.engine.model.core import Engine, EngineConfig, Request
from rolloutpool.engine.model.cost import hardware_preset
from rolloutpool.engine.model.hashing import SegmentChain
from rolloutpool.engine.model.pins import PinningEngine
from rolloutpool.routing.caps import CapRule
from rolloutpool.routing.events import Admitted, Bound, Resumed
from rolloutpool.routing.ledger import Ledger, LedgerConfig, Usage
from rolloutpool.routing.policies import Clairvoyant, Placement, Policy, SessionAware, make_policy
from rolloutpool.routing.quarantine import expected_cached_tokens
from rolloutpool.routing.renewal import RenewalConfig
from rolloutpool.routing.table import Session
from rolloutpool.sim.adaptive import AdaptiveTargets
from rolloutpool.sim.config import ADAPTIVE, FleetConfig
from rolloutpool.sim.fleet_loops import ARRIVE, CONTROL, ENGINE, SAMPLE, SCRAPE, WEIGHTS, Driver, RouterLoops, Traj
from rolloutpool.sim.peers import PeerSetup, peer_setup
from rolloutpool.sim.renewal import SimRenewals
from rolloutpool.sim.results import RunResult, Sample, summarize
from rolloutpool.sim.trace_feed import TrajectoryFeed, TurnRecorder
from rolloutpool.sim.weights import SimWeightUpdates
from rolloutpool.sim.workload import TrajectorySource

__all__ = ["ADAPTIVE", "FleetConfig", "simulate_policy"]

_MAX_RUN = 1_000_000
_SEGMENT_BASE = 1 << 40  # segment ids above this are per-trajectory; below, group prompts


class _Fleet(RouterLoops):
    def __init__(
        self,
        config: FleetConfig,
        policy: Policy,
        progress: Callable[[float], None] | None,
        *,
        adaptive: bool = False,
        source: TrajectoryFeed | None = None,
        recorder: TurnRecorder | None = None,
        peer: PeerSetup | None = None,
    ) -> None:
        self.cfg = config
        self.policy = policy
        self.clairvoyant = isinstance(policy, Clairvoyant)
        self.progress = progress
        preset = hardware_preset(config.hardware)
        blocks = config.num_gpu_blocks or preset.num_gpu_blocks
        ecfg = EngineConfig(
            num_gpu_blocks=blocks,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.scenario.max_model_len,
            cost=config.cost or preset.cost,
            lazy_decode=True,  # nothing here looks up a decoding request's own output blocks: engine/model/core.py
            free_restore=config.free_restore,
        )
        self.capacity = ecfg.kv_capacity_tokens
        self.block_size = ecfg.block_size
        self.names = [f"r{i}" for i in range(config.replicas)]
        pins = None if peer is None else peer.pins
        self.drivers = {n: Driver(n, Engine(ecfg) if pins is None else PinningEngine(ecfg, pins)) for n in self.names}
        self.pinning = pins is not None  # Continuum: every engine pins a turn that ends in a tool call
        self.law = AdaptiveTargets.for_fleet(config, self.names, self.capacity) if adaptive else None
        ours = isinstance(policy, SessionAware)  # the router we ship: its turn scheduling and its fast quarantine
        self.groups_known = config.group_hint or (ours and config.infer_groups)  # by the opening prompt: proxy.py
        fixed = config.fixed_cap if ours and self.law is None else None  # a fixed cap replaces the turn scheduling
        scheduler = None if peer is None else peer.scheduler  # a peer's per-turn scheduler (sim/peers.py)
        self.known_tools = config.known_tools and ours and scheduler is None  # a reference: ours told each tool time
        self.ledger = Ledger(
            LedgerConfig(
                caps=CapRule(fixed=fixed),
                quarantine=config.quarantine if ours else None,
                working_set=config.working_set if ours and fixed is None else None,
                scheduler=None if scheduler is None else (lambda: scheduler),
                default_block_size=ecfg.block_size,
            ),
            policy=policy,
        )
        self.table = self.ledger.table
        for n in self.names:
            self.ledger.add_replica(n, now=0.0, capacity_tokens=self.capacity)
        self.cap = fixed
        self.ledger.take_events()
        self.live_reprefill = dict.fromkeys(self.names, 0)  # the router's counter: live sessions' evicted tokens
        every = config.renew_every_s if isinstance(policy, SessionAware) else None  # renewal is our policy's
        self.renewals = None if every is None else SimRenewals(RenewalConfig(every))
        self.source: TrajectoryFeed = source or TrajectorySource(config.scenario, config.seed)
        self.recorder = recorder  # a trace of the run's turns (sim/trace_feed.py)
        self.trajs: dict[int, Traj] = {}
        self.events: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._rid = 0
        self.now = 0.0
        self.completed_times: list[float] = []
        self.reprefilled = 0
        self.evicted_reprefill = 0
        self.samples: list[Sample] = []
        self._last_counts = dict.fromkeys(self.names, (0, 0))
        updates = config.weight_updates  # the weight-update scenario: sim/weights.py
        self.weights = None if updates is None else SimWeightUpdates(updates, self.names)
        if self.weights is not None and self.weights.config.excuse:
            self.ledger.weights = self.weights.tracker  # the router learns of each flush (its fan-out)
        if self.weights is not None and self.law is not None:
            self.law.weight_updates = self.weights.weight_updates

    # -- the run --------------------------------------------------------------------------

    def run(self) -> RunResult:
        cfg = self.cfg
        for i in range(cfg.in_flight):
            self._start_trajectory(cfg.start_spread_s * i / max(1, cfg.in_flight))
        self._push(cfg.scrape_interval_s, SCRAPE, None)
        self._push(0.0, SAMPLE, None)
        if self.law is not None:
            self._push(cfg.control_interval_s, CONTROL, None)
        if self.weights is not None:
            self._push(self.weights.config.every_s, WEIGHTS, "pause")
        next_progress = 0.0
        while self.events:
            t, _, kind, data = heapq.heappop(self.events)
            if t > cfg.duration_s or not self.trajs:  # no trajectory left: a replayed trace has ended
                break
            self.now = t
            if kind == ENGINE:
                self._engine_done(data)  # type: ignore[arg-type]
            elif kind == ARRIVE:
                self._arrive(data)  # type: ignore[arg-type]
            elif kind == SCRAPE:
                self._scrape()
            elif kind == CONTROL:
                self._control()
            else:
                self._sample() if kind == SAMPLE else self._weights(data)  # type: ignore[arg-type]
            if self.progress is not None and t >= next_progress:
                self.progress(t)
                next_progress = t + 60.0
        self.now = cfg.duration_s
        result = summarize(
            policy=self.policy.name,
            config=cfg,
            engines=[d.engine for d in self.drivers.values()],
            completed_times=self.completed_times,
            reprefilled=self.reprefilled,
            evicted_reprefill=self.evicted_reprefill,
            quarantines=sum(limits.pressure.quarantines for limits in self.ledger.limits.values() if limits.pressure),
            samples=self.samples,
            cap=self.cap,
            law=self.law,
            renewals=None if self.renewals is None else self.renewals.totals(),
        )
        if self.weights is None:
            return result
        return self.weights.annotate(result, law=self.law)

    # -- trajectories -------------------------------------------------------------------

    def _start_trajectory(self, t: float) -> None:
        plan = self.source.next(t)
        if plan is None:
            return
        chain = SegmentChain()
        chain.extend(plan.group, plan.prompt_tokens)
        proj = plan.final_context(self.cfg.scenario.max_model_len)
        self.trajs[plan.index] = Traj(plan=plan, start=t, chain=chain, proj=proj)
        self._push(t, ARRIVE, plan.index)

    def _arrive(self, idx: int) -> None:
        traj = self.trajs[idx]
        if self.recorder is not None:
            self.recorder.arrived(str(idx), now=self.now, group=str(traj.plan.group))
        resident = None if traj.replica is None else self._resident(traj, traj.replica)
        placement = self._placement(traj, resident)
        decision = self.ledger.arrive(placement, now=self.now)
        if isinstance(decision, Bound):
            self._submit(traj, decision.session)
        self._dispatch()  # a Queued session is submitted when the ledger admits it

    def _placement(self, traj: Traj, resident: int | None) -> Placement:
        """What the router knows of a turn: the session, its group (ours infers it from the opening prompt, which a
        GRPO group's rollouts share; the others know it when the clients send it), what KV events say is resident; a
        prompt's size only from the turn's usage, so only the clairvoyant reference is told it here."""
        return Placement(
            str(traj.plan.index),
            group=str(traj.plan.group) if self.groups_known else None,
            projected_tokens=traj.proj if self.clairvoyant else 0,
            prompt_tokens=traj.chain.length if self.clairvoyant else 0,
            resident_tokens=resident,
        )

    def _dispatch(self) -> None:
        """Submit the first turn of every session the ledger admitted from its queue, and every held turn resumed."""
        for event in self.ledger.take_events():
            if isinstance(event, Admitted | Resumed):
                self._submit(self.trajs[int(event.session.session_id)], event.session)

    def _submit(self, traj: Traj, session: Session) -> None:
        replica = session.replica
        max_len = self.cfg.scenario.max_model_len
        prompt_len = traj.chain.length
        max_tokens = min(traj.plan.actions[traj.turn], max_len - prompt_len)
        # the turn's output extends the chain in place and the request reads the chain's
        # own hash list: nothing reads the chain again until the turn completes, and
        # the list only grows (by the next observation) after the request is done
        traj.chain.extend(_SEGMENT_BASE + traj.plan.index * 256 + traj.turn * 2, max_tokens)
        traj.replica = replica
        traj.session = session
        traj.inflight = True
        if self.renewals is not None:
            self.renewals.clock.busy(str(traj.plan.index))
        self._rid += 1
        request = Request(
            self._rid, prompt_len=prompt_len, max_tokens=max_tokens, hashes=traj.chain.hashes, tag=traj.plan.index
        )
        if self.cfg.free_restore:  # what a cache that evicted nothing would hit comes back free
            request.free_tokens = expected_cached_tokens(
                previous_context=traj.prev_context, prompt_tokens=prompt_len, block_size=self.block_size
            )
        self.ledger.turn_started(session)
        self._enqueue(replica, request)

    def _complete_turn(self, replica: str, req: Request) -> None:
        traj = self.trajs[req.tag]
        traj.inflight = False
        session = traj.session
        assert session is not None  # noqa: S101 -- set when the turn was submitted
        if self.recorder is not None:
            usage = Usage(req.prompt_len, req.num_output, req.cached_tokens)
            self.recorder.turn(str(req.tag), replica=replica, usage=usage, now=self.now)
        self._count_reprefill(traj, replica, req, turn=session)  # the router's finish_turn, then end
        plan = traj.plan
        told = self.known_tools and traj.turn < len(plan.tool_latencies)  # the tool call after this turn
        self.ledger.turn_ended(session, now=self.now, tool_s=plan.tool_latencies[traj.turn] if told else None)
        traj.prev_replica = replica
        traj.prev_context = req.seq_len - 1  # the last sampled token's KV is never computed
        traj.turn += 1
        max_len = self.cfg.scenario.max_model_len
        ended = (
            req.finish_reason == "length"
            or traj.turn >= plan.turns
            or traj.chain.length + plan.observations[traj.turn - 1] >= max_len - 1
        )
        if ended:
            self._finish_trajectory(traj)
            return
        if self.pinning:  # the turn ended in a tool call: Continuum pins its KV (engine/model/pins.py)
            engine = self.drivers[replica].engine
            assert isinstance(engine, PinningEngine)  # noqa: S101 -- every engine pins when one does
            engine.tick(self.now)
            engine.pin(req.tag, req)
        traj.chain.extend(_SEGMENT_BASE + plan.index * 256 + (traj.turn - 1) * 2 + 1, plan.observations[traj.turn - 1])
        if self.renewals is not None:
            self.renewals.clock.idle(str(plan.index), now=self.now)
        self._push(self.now + plan.tool_latencies[traj.turn - 1], ARRIVE, plan.index)

    def _count_reprefill(self, traj: Traj, replica: str, req: Request, *, turn: Session | None = None) -> None:
        """Context computed before that missed the cache on this request (a turn, or a renewal that found it gone).

        All causes count in the fleet's re-prefill (a session that moved replica too); what the router sees of a
        session on its own replica (the live re-prefill that feeds quarantine and the law) is the ledger's answer,
        for a turn (``turn``: its binding; its context then moves on) or a renewal (context unchanged).
        """
        limit = expected_cached_tokens(
            previous_context=traj.prev_context, prompt_tokens=req.prompt_len, block_size=self.block_size
        )
        missed = max(0, limit - req.cached_tokens)
        self.reprefilled += missed
        usage = Usage(req.prompt_len, req.num_output, req.cached_tokens)
        limits = self.ledger.limits.get(replica)
        pressure = None if limits is None else limits.pressure
        quarantines, excused = (0 if pressure is None else pressure.quarantines), self.ledger.weights.excused_turns
        if turn is not None:
            _, live = self.ledger.finish_turn(turn, now=self.now, usage=usage)
        else:
            session = self.ledger.lookup(str(traj.plan.index))
            _, live = (0, 0) if session is None else self.ledger.observe_cached(session, now=self.now, usage=usage)
        if self.weights is not None:  # what a weight update's flush cost: sim/weights.py
            self.weights.attribute_turn(
                str(traj.plan.index),
                replica,
                excused=self.ledger.weights.excused_turns > excused,
                missed=missed,
                live=live,
                entered=0 if pressure is None else pressure.quarantines - quarantines,
            )
        self.evicted_reprefill += live
        self.live_reprefill[replica] += live
        self._dispatch()

    def _finish_trajectory(self, traj: Traj) -> None:
        self.ledger.release(str(traj.plan.index), how="finished", now=self.now)
        if self.recorder is not None:
            self.recorder.released(str(traj.plan.index), how="finished", now=self.now)
        if self.renewals is not None:
            self.renewals.clock.forget(str(traj.plan.index))
        self.completed_times.append(self.now - traj.start)
        del self.trajs[traj.plan.index]
        self._start_trajectory(self.now)
        self._dispatch()

    # -- engines ------------------------------------------------------------------------

    def _enqueue(self, replica: str, request: Request) -> None:
        if self.weights is not None and self.weights.hold(replica, request):
            return  # paused for a weight update
        driver = self.drivers[replica]
        if driver.busy and driver.run_steps and self.now < driver.end:
            self._cut_run(driver)
        if isinstance(driver.engine, PinningEngine):
            driver.engine.tick(self.now)
        driver.engine.add(request)
        if not driver.busy:
            self._start_engine(replica)

    def _cut_run(self, driver: Driver) -> None:
        engine = driver.engine
        steps = engine.decode_steps_within(self.now - driver.run_start, driver.run_steps - 1) + 1
        if steps >= driver.run_steps:
            return
        end = driver.run_start + engine.decode_run_seconds(steps)
        driver.outcome = engine.decode_run(steps)
        driver.run_steps = 0
        driver.end = end
        driver.version += 1
        self._push(end, ENGINE, (driver.name, driver.version))

    def _start_engine(self, replica: str) -> None:
        driver = self.drivers[replica]
        engine = driver.engine
        if isinstance(engine, PinningEngine):
            engine.tick(self.now)  # pins expire as steps start (and at every scrape)
        if not engine.has_work:
            driver.busy = False
            if self.weights is not None and self.weights.pausing:
                self._weights("flush")
            return
        driver.busy = True
        driver.version += 1
        k = engine.decode_run_length(_MAX_RUN)
        if k > 0:
            driver.run_start, driver.run_steps = self.now, k
            driver.end = self.now + engine.decode_run_seconds(k)
            driver.outcome = None
        else:
            out = engine.step()
            if out.steps == 0:  # nothing could be scheduled: wait for an arrival
                driver.busy = False
                return
            driver.run_steps = 0
            driver.end = self.now + out.duration
            driver.outcome = out
        self._push(driver.end, ENGINE, (replica, driver.version))

    def _engine_done(self, data: tuple[str, int]) -> None:
        replica, version = data
        driver = self.drivers[replica]
        if version != driver.version:
            return
        out = driver.outcome if driver.run_steps == 0 else driver.engine.decode_run(driver.run_steps)
        driver.run_steps = 0
        driver.outcome = None
        if out is not None:
            for req in out.finished:
                if self.renewals is not None and self.renewals.finished(req):
                    self._renewed(replica, req)
                else:
                    self._complete_turn(replica, req)
        self._start_engine(replica)


def simulate_policy(
    config: FleetConfig,
    policy_name: str,
    progress: Callable[[float], None] | None = None,
    *,
    source: TrajectoryFeed | None = None,
    recorder: TurnRecorder | None = None,
) -> RunResult:
    """Run one policy on one fleet configuration; deterministic for a given config.

    ``source`` replaces the scenario's trajectories (a replayed trace: the run ends when its last one
    does); ``recorder`` is told every turn (a trace of the run).
    """
    adaptive = policy_name == ADAPTIVE
    peer = peer_setup(policy_name)  # a peer's turn scheduler or pinning (sim/peers.py)
    policy = peer.policy if peer is not None else make_policy("rolloutpool" if adaptive else policy_name)
    if isinstance(policy, SessionAware):
        policy.co_locate_groups = config.co_locate_groups
        policy.name = policy_name
    fleet = _Fleet(config, policy, progress, adaptive=adaptive, source=source, recorder=recorder, peer=peer)
    return fleet.run()
