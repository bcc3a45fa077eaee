"""The engine loop of the simulator server: one asyncio task drives the pure engine.

While the engine has work, the loop takes a step, or a run of pure-decode steps
capped at a small slice of simulated time so new arrivals are admitted promptly,
advances the simulated clock by the step's duration, sleeps the matching wall time
(``duration / time_scale``) and then publishes the step's tokens to the waiting
handlers (one :class:`Job` per request, woken through an ``asyncio.Event``).

The simulated clock advances by step durations while the engine is busy, so the
latencies the metrics report are the cost model's, not Python's overhead; while the
engine idles the clock follows the wall clock times ``time_scale``. When Python
falls behind the wall target the loop re-anchors instead of bursting to catch up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from rolloutpool.engine.model.core import Engine, EngineConfig, Request, StepOutcome
from rolloutpool.engine.model.hashing import hash_token_blocks
from rolloutpool.engine.model.pins import PinConfig, PinningEngine
from rolloutpool.engine.server.instruments import CacheConfigInfo, EngineMetrics
from rolloutpool.engine.server.kv_publisher import KvEventPublisher

__all__ = ["EngineRunner", "Job"]

_log = logging.getLogger(__name__)

_STALL_SLEEP_S = 0.001
"""Wall sleep when a step scheduled nothing, so a stuck queue cannot spin the CPU."""


@dataclass(eq=False)
class Job:
    """One request as the HTTP handler sees it: planned output and published progress."""

    request: Request
    output_ids: list[int]
    arrival: float
    """Simulated time the request reached the engine."""
    visible: int = 0
    """Output tokens published to the handler so far."""
    done: bool = False
    last_token_at: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    token_ids: list[int] = field(default_factory=list)
    """Prompt then planned output (what the request's block hashes cover; its KV events carry them)."""
    session_id: str | None = None
    """The session vLLM would stamp on the request's ``BlockStored`` events."""
    cache_salt: str | None = None

    @property
    def finish_reason(self) -> str:
        """vLLM's reason: the simulator never samples EOS, so a finished request hit a length limit."""
        return "abort" if self.request.finish_reason == "abort" else "length"


class EngineRunner:
    """Owns the engine, the simulated clock and the loop task."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        time_scale: float,
        decode_slice_s: float,
        model_name: str,
        cache_info: CacheConfigInfo,
        pins: PinConfig | None = None,
    ) -> None:
        self.engine = Engine(config) if pins is None else PinningEngine(config, pins, program=_session_of)
        """With ``pins``, Continuum's engine (a peer, engine/model/pins.py): a session's finished turn stays pinned."""
        self.time_scale = time_scale
        self.decode_slice_s = decode_slice_s
        self.clock = 0.0
        self._wall_anchor = time.monotonic()
        self._sim_anchor = 0.0
        self._jobs: dict[int, Job] = {}
        self._next_rid = 0
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.frozen = False
        """No engine step is taken while set (:meth:`freeze`)."""
        self.metrics = EngineMetrics(self.engine, model_name=model_name, cache_info=cache_info)
        self.kv_events: KvEventPublisher | None = None
        """Where each step's KV events go (``--kv-events-config``); None: not recorded at all."""

    def publish_kv_events(self, publisher: KvEventPublisher) -> None:
        """Record the engine's cache events from now on and send them to ``publisher`` after every step."""
        self.kv_events = publisher
        self.engine.record_cache_events()

    def flush_kv_events(self) -> None:
        """Publish the events recorded since the last flush as one batch (no-op when not publishing)."""
        if self.kv_events is not None:
            self.kv_events.publish(self.engine.take_cache_events())

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``: False (nothing changes) while a request holds blocks.

        Its ``AllBlocksCleared`` event leaves with the next step's batch, as in vLLM (the block
        pool queues it; the scheduler publishes its queue after a step).
        """
        return self.engine.pool.reset_prefix_cache()

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop task (call from a running event loop)."""
        self._wall_anchor = time.monotonic()
        self._sim_anchor = self.clock
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        """Cancel the loop task and wake every handler so it can notice the shutdown."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for job in list(self._jobs.values()):
            self.abort(job)

    # -- clock -----------------------------------------------------------------------

    def now(self) -> float:
        """Current simulated time: the engine clock while busy, the scaled wall clock while idle or frozen."""
        if self.engine.has_work and not self.frozen:
            return self.clock
        return self._sim_anchor + (time.monotonic() - self._wall_anchor) * self.time_scale

    def _reanchor(self, sim: float) -> None:
        self.clock = sim
        self._sim_anchor = sim
        self._wall_anchor = time.monotonic()

    # -- intake ----------------------------------------------------------------------

    def submit(
        self,
        prompt_ids: list[int],
        output_ids: list[int],
        *,
        hash_parent: int = 0,
        skip_cache_read: bool = False,
        session_id: str | None = None,
        cache_salt: str | None = None,
    ) -> Job:
        """Queue a request whose output is planned; ``ValueError`` when the prompt does not fit.

        ``hash_parent`` seeds the block chain (a ``cache_salt``: other salts share no block);
        ``skip_cache_read`` makes it find no cached block (vLLM, for ``prompt_logprobs``);
        ``session_id`` and ``cache_salt`` go into its KV events.
        """
        bs = self.engine.config.block_size
        rid = self._next_rid
        self._next_rid += 1
        token_ids = prompt_ids + output_ids
        request = Request(
            rid,
            prompt_len=len(prompt_ids),
            max_tokens=len(output_ids),
            hashes=hash_token_blocks(token_ids, bs, parent=hash_parent),
        )
        request.skip_cache_read = skip_cache_read
        idle = not self.engine.has_work
        arrival = self.now()
        request.tag = session_id  # until it is added: the program a pinning engine keys it by
        if isinstance(self.engine, PinningEngine):
            self.engine.tick(arrival)
        self.engine.add(request)  # raises before any state changes
        if idle:
            self._reanchor(arrival)
        job = Job(
            request=request,
            output_ids=output_ids,
            arrival=arrival,
            last_token_at=arrival,
            token_ids=token_ids,
            session_id=session_id,
            cache_salt=cache_salt,
        )
        request.tag = job  # what its KV events need to know of it
        self._jobs[rid] = job
        self._work.set()
        return job

    def abort(self, job: Job) -> None:
        """The client went away: free the request's blocks and count it as aborted."""
        if job.done:
            return
        self.engine.abort(job.request)
        job.request.finish_reason = "abort"
        self._finish(job, self.clock)

    def abort_all(self) -> int:
        """Abort every request in the engine (``/pause?mode=abort``); returns how many."""
        jobs = list(self._jobs.values())
        for job in jobs:
            self.abort(job)
        return len(jobs)

    @property
    def in_flight(self) -> int:
        """Requests in the engine, waiting or running."""
        return len(self._jobs)

    def freeze(self, frozen: bool) -> None:
        """Stop taking engine steps (``/pause?mode=keep``: requests stay, frozen) or resume them."""
        if frozen == self.frozen:
            return
        if frozen:
            self._reanchor(self.clock)  # from here the clock follows the wall, as when idle
            self.frozen = True
            return
        self._reanchor(self.now())
        self.frozen = False
        self._work.set()

    def _finish(self, job: Job, at: float) -> None:
        engine = self.engine
        if isinstance(engine, PinningEngine) and job.session_id and job.request.finish_reason != "abort":
            engine.tick(at)  # Continuum: the session's turn may have ended in a tool call; pin its KV
            engine.pin(job.session_id, job.request)
        job.done = True
        self._jobs.pop(job.request.rid, None)
        self.metrics.record_finished(
            reason=job.finish_reason, e2e_seconds=max(0.0, at - job.arrival), preemptions=job.request.preemptions
        )
        job.changed.set()

    # -- the loop --------------------------------------------------------------------

    async def _run(self) -> None:
        engine = self.engine
        while True:
            if not engine.has_work or self.frozen:
                self._work.clear()
                await self._work.wait()
                continue
            if isinstance(engine, PinningEngine):
                engine.tick(self.clock)  # pins expire as steps start
            outcome = self._advance()
            start = self.clock
            self.clock += outcome.duration
            if outcome.steps == 0:
                await asyncio.sleep(_STALL_SLEEP_S)
            else:
                await self._sleep_until_clock()
            self.flush_kv_events()  # as vLLM: the step's events leave with its outputs
            self._publish(outcome, start)

    def _advance(self) -> StepOutcome:
        engine = self.engine
        if engine.running:
            first = engine.decode_run_seconds(1)
            max_steps = max(1, int(self.decode_slice_s / first)) if first > 0 else 1
            steps = engine.decode_run_length(max_steps)
            if steps > 0:
                return engine.decode_run(steps)
        return engine.step()

    async def _sleep_until_clock(self) -> None:
        target = self._wall_anchor + (self.clock - self._sim_anchor) / self.time_scale
        delay = target - time.monotonic()
        if delay < 0:
            self.metrics.lag_seconds += -delay * self.time_scale
            self._reanchor(self.clock)  # behind the wall target: carry on from here, no burst
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(delay)

    def _publish(self, outcome: StepOutcome, start: float) -> None:
        """Hand the step's tokens to the handlers and record latencies (simulated seconds)."""
        now = self.clock
        metrics = self.metrics
        per_step = outcome.duration / outcome.steps if outcome.steps else 0.0
        finished = {id(r) for r in outcome.finished}
        for job in list(self._jobs.values()):
            req = job.request
            new = req.num_output - job.visible
            if new > 0:
                if job.visible == 0:
                    metrics.ttft.observe(now - job.arrival)
                    new_gaps = new - 1
                    if outcome.steps > 1:
                        metrics.observe_itl(per_step, new_gaps)
                else:
                    new_gaps = new
                    if outcome.steps > 1:
                        # a decode run: the first gap absorbs any wait before the run
                        metrics.observe_itl(start + per_step - job.last_token_at, 1)
                        metrics.observe_itl(per_step, new_gaps - 1)
                    else:
                        metrics.observe_itl(now - job.last_token_at, 1)
                job.visible = req.num_output
                job.last_token_at = now
                job.changed.set()
            if id(req) in finished:
                self._finish(job, now)


def _session_of(request: Request) -> object:
    """The program of a request in the engine: its job's session (the tag is the session id until it is added)."""
    tag = request.tag
    return tag.session_id if isinstance(tag, Job) else tag
