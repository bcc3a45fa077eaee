"""Discrete-event simulation, in virtual time, of a fleet of engine replicas behind one policy.

The replicas run the same engine model as ``engine-sim`` (:mod:`rolloutpool.engine`),
placement is the router's pure code (:mod:`rolloutpool.routing`), and the workload is
:mod:`rolloutpool.sim.workload`. An engine computes a step when it starts and the
step's results reach the router when it ends; a run of pure-decode steps is applied
lazily and cut short at the step boundary after a new request arrives, so arrivals are
admitted exactly when a step-by-step engine would admit them.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rolloutpool.autoscale import initial_cap
from rolloutpool.capacity import oversubscribed_cap
from rolloutpool.engine.core import Engine, EngineConfig, Request, StepOutcome
from rolloutpool.engine.cost import hardware_preset
from rolloutpool.engine.hashing import SegmentChain
from rolloutpool.routing.policies import Placement, Policy, SessionAware, make_policy
from rolloutpool.routing.quarantine import PressureState, expected_cached_tokens
from rolloutpool.routing.renewal import RenewalConfig
from rolloutpool.routing.table import SessionTable
from rolloutpool.sim.adaptive import AdaptiveCaps
from rolloutpool.sim.config import ADAPTIVE, FleetConfig
from rolloutpool.sim.metrics import RunResult, Sample, summarize
from rolloutpool.sim.renewal import SimRenewals
from rolloutpool.sim.weights import SimWeightUpdates
from rolloutpool.sim.workload import Trajectory, TrajectorySource

__all__ = ["ADAPTIVE", "FleetConfig", "simulate_policy"]

_ENGINE, _ARRIVE, _SCRAPE, _SAMPLE, _CONTROL, _WEIGHTS = 0, 1, 2, 3, 4, 5
_MAX_RUN = 1_000_000
_SEGMENT_BASE = 1 << 40  # segment ids above this are per-trajectory; below, group prompts


@dataclass
class _Traj:
    plan: Trajectory
    start: float
    chain: SegmentChain
    proj: int
    """Its largest context (``plan.final_context``), computed once."""
    turn: int = 0
    replica: str | None = None
    prev_replica: str | None = None
    prev_context: int = 0
    inflight: bool = False


@dataclass
class _Driver:
    name: str
    engine: Engine
    version: int = 0
    busy: bool = False
    run_start: float = 0.0
    run_steps: int = 0
    end: float = 0.0
    outcome: StepOutcome | None = None


class _Fleet:
    def __init__(
        self, config: FleetConfig, policy: Policy, progress: Callable[[float], None] | None, *, adaptive: bool = False
    ) -> None:
        self.cfg = config
        self.policy = policy
        self.progress = progress
        preset = hardware_preset(config.hardware)
        blocks = config.num_gpu_blocks or preset.num_gpu_blocks
        ecfg = EngineConfig(
            num_gpu_blocks=blocks,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.scenario.max_model_len,
            cost=preset.cost,
        )
        self.capacity = ecfg.kv_capacity_tokens
        self.names = [f"r{i}" for i in range(config.replicas)]
        self.drivers = {n: _Driver(n, Engine(ecfg)) for n in self.names}
        self.table = SessionTable()
        self.law = AdaptiveCaps.for_fleet(config, self.names, self.capacity) if adaptive else None
        cap = None if self.law is None else initial_cap(self.law.params)  # the law's first cap (RunResult.cap: None)
        if self.law is None and policy.capped and isinstance(policy, SessionAware):
            cap = config.fixed_cap or oversubscribed_cap(
                capacity_tokens=self.capacity,
                max_model_len=config.scenario.max_model_len,
                expected_residency=config.expected_residency,
                headroom=config.headroom,
            )
        self.cap = cap if self.law is None else None
        for n in self.names:
            self.table.add_replica(n, cap=cap, kv_capacity_tokens=self.capacity)
        self.pressure = {n: PressureState(config.quarantine) for n in self.names}
        self.live_reprefill = dict.fromkeys(self.names, 0)  # the router's counter: live sessions' evicted tokens
        self.use_quarantine = isinstance(policy, SessionAware)
        every = config.renew_every_s if isinstance(policy, SessionAware) else None  # renewal is our policy's
        self.renewals = None if every is None else SimRenewals(RenewalConfig(every))
        self.source = TrajectorySource(config.scenario, config.seed)
        self.trajs: dict[int, _Traj] = {}
        self.queue: deque[int] = deque()
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
        if self.weights is not None and self.law is not None:
            self.law.weight_updates = self.weights.weight_updates

    # -- event plumbing ---------------------------------------------------------------

    def _push(self, t: float, kind: int, data: object) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, data))

    def run(self) -> RunResult:
        cfg = self.cfg
        for i in range(cfg.in_flight):
            self._start_trajectory(cfg.start_spread_s * i / max(1, cfg.in_flight))
        self._push(cfg.scrape_interval_s, _SCRAPE, None)
        self._push(0.0, _SAMPLE, None)
        if self.law is not None:
            self._push(cfg.control_interval_s, _CONTROL, None)
        if self.weights is not None:
            self._push(self.weights.config.every_s, _WEIGHTS, "pause")
        next_progress = 0.0
        while self.events:
            t, _, kind, data = heapq.heappop(self.events)
            if t > cfg.duration_s:
                break
            self.now = t
            if kind == _ENGINE:
                self._engine_done(data)  # type: ignore[arg-type]
            elif kind == _ARRIVE:
                self._arrive(data)  # type: ignore[arg-type]
            elif kind == _SCRAPE:
                self._scrape()
            elif kind == _CONTROL:
                self._control()
            else:
                self._sample() if kind == _SAMPLE else self._weights(data)  # type: ignore[arg-type]
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
            quarantines=sum(p.quarantines for p in self.pressure.values()),
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
        chain = SegmentChain()
        chain.extend(plan.group, plan.prompt_tokens)
        proj = plan.final_context(self.cfg.scenario.max_model_len)
        self.trajs[plan.index] = _Traj(plan=plan, start=t, chain=chain, proj=proj)
        self._push(t, _ARRIVE, plan.index)

    def _arrive(self, idx: int) -> None:
        traj = self.trajs[idx]
        sid = str(idx)
        session = self.table.lookup(sid)
        if session is not None and self.policy.sticky:
            session.last_seen = self.now
            self._submit(traj, session.replica)
            return
        if session is None and self.queue and self.policy.capped:
            self.queue.append(idx)  # FIFO: nobody overtakes the queue
            return
        replica = self.policy.choose(self._placement(traj), self.table)
        if replica is None:
            self.queue.append(idx)
            return
        self._bind(traj, replica)
        self._submit(traj, replica)

    def _placement(self, traj: _Traj) -> Placement:
        return Placement(
            str(traj.plan.index),
            group=str(traj.plan.group),
            projected_tokens=traj.proj,
            prompt_tokens=traj.chain.length,
        )

    def _drain_queue(self) -> None:
        while self.queue:
            idx = self.queue[0]
            traj = self.trajs[idx]
            replica = self.policy.choose(self._placement(traj), self.table)
            if replica is None:
                return
            self.queue.popleft()
            self._bind(traj, replica)
            self._submit(traj, replica)

    def _bind(self, traj: _Traj, replica: str) -> None:
        session = self.table.bind(
            str(traj.plan.index),
            replica,
            now=self.now,
            group=str(traj.plan.group),
            projected_tokens=traj.proj,
            prompt_tokens=traj.plan.prompt_tokens,
        )
        session.context_tokens = traj.chain.length

    def _submit(self, traj: _Traj, replica: str) -> None:
        max_len = self.cfg.scenario.max_model_len
        prompt_len = traj.chain.length
        max_tokens = min(traj.plan.actions[traj.turn], max_len - prompt_len)
        # the turn's output extends the chain in place and the request reads the chain's
        # own hash list: nothing reads the chain again until the turn completes, and
        # the list only grows (by the next observation) after the request is done
        traj.chain.extend(_SEGMENT_BASE + traj.plan.index * 256 + traj.turn * 2, max_tokens)
        traj.replica = replica
        traj.inflight = True
        if self.renewals is not None:
            self.renewals.clock.busy(str(traj.plan.index))
        self._rid += 1
        request = Request(
            self._rid, prompt_len=prompt_len, max_tokens=max_tokens, hashes=traj.chain.hashes, tag=traj.plan.index
        )
        self.table.replicas[replica].inflight += 1
        self._enqueue(replica, request)

    def _complete_turn(self, replica: str, req: Request) -> None:
        traj = self.trajs[req.tag]
        traj.inflight = False
        state = self.table.replicas.get(replica)
        if state is not None:
            state.inflight -= 1
        self._count_reprefill(traj, replica, req)
        traj.prev_replica = replica
        traj.prev_context = req.seq_len - 1  # the last sampled token's KV is never computed
        session = self.table.lookup(str(traj.plan.index))
        if session is not None:
            session.context_tokens = req.seq_len
        traj.turn += 1
        plan = traj.plan
        max_len = self.cfg.scenario.max_model_len
        ended = (
            req.finish_reason == "length"
            or traj.turn >= plan.turns
            or traj.chain.length + plan.observations[traj.turn - 1] >= max_len - 1
        )
        if ended:
            self._finish_trajectory(traj)
            return
        traj.chain.extend(_SEGMENT_BASE + plan.index * 256 + (traj.turn - 1) * 2 + 1, plan.observations[traj.turn - 1])
        if self.renewals is not None:
            self.renewals.clock.idle(str(plan.index), now=self.now)
        self._push(self.now + plan.tool_latencies[traj.turn - 1], _ARRIVE, plan.index)

    def _count_reprefill(self, traj: _Traj, replica: str, req: Request) -> None:
        """Context computed before that missed the cache on this request (a turn, or a renewal that found it gone)."""
        limit = expected_cached_tokens(previous_context=traj.prev_context, prompt_tokens=req.prompt_len)
        missed = max(0, limit - req.cached_tokens)
        self.reprefilled += missed
        state = self.pressure[replica] if self.use_quarantine else None
        if self.weights is not None and self.weights.excused(
            str(traj.plan.index), replica, missed if traj.prev_replica == replica else 0, state=state, now=self.now,
            expected=limit, cached=req.cached_tokens,
        ):  # fmt: skip
            return  # a weight update's flush, not eviction
        if traj.prev_replica == replica:
            self.evicted_reprefill += missed
            self.live_reprefill[replica] += missed
            if self.use_quarantine:
                self.pressure[replica].observe_response(now=self.now, expected_cached=limit, cached=req.cached_tokens)
                self._quarantine(replica)

    def _finish_trajectory(self, traj: _Traj) -> None:
        session = self.table.release(str(traj.plan.index))
        if self.renewals is not None:
            self.renewals.clock.forget(str(traj.plan.index))
        if session is not None and self.use_quarantine:
            self.pressure[session.replica].session_finished()
            self._quarantine(session.replica)
        self.completed_times.append(self.now - traj.start)
        del self.trajs[traj.plan.index]
        self._start_trajectory(self.now)
        if self.policy.capped:
            self._drain_queue()

    # -- engines ------------------------------------------------------------------------

    def _enqueue(self, replica: str, request: Request) -> None:
        if self.weights is not None and self.weights.hold(replica, request):
            return  # paused for a weight update
        driver = self.drivers[replica]
        if driver.busy and driver.run_steps and self.now < driver.end:
            self._cut_run(driver)
        driver.engine.add(request)
        if not driver.busy:
            self._start_engine(replica)

    def _cut_run(self, driver: _Driver) -> None:
        engine = driver.engine
        steps = engine.decode_steps_within(self.now - driver.run_start, driver.run_steps - 1) + 1
        if steps >= driver.run_steps:
            return
        end = driver.run_start + engine.decode_run_seconds(steps)
        driver.outcome = engine.decode_run(steps)
        driver.run_steps = 0
        driver.end = end
        driver.version += 1
        self._push(end, _ENGINE, (driver.name, driver.version))

    def _start_engine(self, replica: str) -> None:
        driver = self.drivers[replica]
        engine = driver.engine
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
        self._push(driver.end, _ENGINE, (replica, driver.version))

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

    # -- router loops ---------------------------------------------------------------------

    def _scrape(self) -> None:
        if self.use_quarantine:
            lifted = False
            for name, driver in self.drivers.items():
                state = self.pressure[name]
                before = state.quarantined
                preempted, waiting = driver.engine.counters.preemptions, len(driver.engine.waiting)
                if self.weights is None:
                    state.observe_scrape(now=self.now, preemptions_total=preempted, waiting=waiting)
                else:  # excused in the grace after a weight update's flush
                    self.weights.observe_scrape(state, name, now=self.now, preemptions_total=preempted, waiting=waiting)
                self._quarantine(name)
                lifted |= before and not state.quarantined
            if lifted:
                self._drain_queue()
        if self.renewals is not None:
            self._renew_due()
        self._push(self.now + self.cfg.scrape_interval_s, _SCRAPE, None)

    def _renew_due(self) -> None:
        assert self.renewals is not None  # noqa: S101 -- called only with renewal on
        for sid in self.renewals.clock.due(now=self.now):
            traj = self.trajs[int(sid)]  # a finished session is forgotten by the clock
            session = self.table.lookup(sid)
            if session is None or traj.inflight:  # pragma: no cover - an idle live session is bound and idle
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
            self._push(self.now + weights.config.every_s, _WEIGHTS, "pause")
            step = "flush"
        if step == "flush":
            resume_at = weights.try_flush({n: d.engine for n, d in self.drivers.items()}, now=self.now)
            if resume_at is not None:
                self._push(resume_at, _WEIGHTS, "resume")
        elif step == "resume":
            for replica, request in weights.resume(now=self.now):
                self._enqueue(replica, request)

    def _quarantine(self, name: str) -> None:
        law = self.law.controls[name].quarantined if self.law is not None else False
        self.table.replicas[name].quarantined = self.pressure[name].quarantined or law

    def _control(self) -> None:
        assert self.law is not None  # noqa: S101 -- scheduled only with a law
        engines = {n: d.engine for n, d in self.drivers.items()}
        live = {n: self.table.replicas[n].live for n in self.names}
        controls = self.law.step(
            now=self.now, engines=engines, live=live, reprefill=self.live_reprefill, queued=len(self.queue)
        )
        for name, control in controls.items():
            self.table.replicas[name].cap = control.cap
            self._quarantine(name)
        self._drain_queue()
        self._push(self.now + self.cfg.control_interval_s, _CONTROL, None)

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
                    queued=len(self.queue),
                )
            )
        self._push(self.now + self.cfg.sample_interval_s, _SAMPLE, None)


def simulate_policy(
    config: FleetConfig, policy_name: str, progress: Callable[[float], None] | None = None
) -> RunResult:
    """Run one policy on one fleet configuration; deterministic for a given config."""
    adaptive = policy_name == ADAPTIVE
    policy = make_policy("rolloutpool" if adaptive else policy_name)
    if isinstance(policy, SessionAware):
        policy.co_locate_groups = config.co_locate_groups
        policy.name = policy_name
    return _Fleet(config, policy, progress, adaptive=adaptive).run()
