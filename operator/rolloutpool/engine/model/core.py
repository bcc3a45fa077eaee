"""A vLLM-like continuous-batching scheduler over :class:`BlockPool` (pure, no I/O, no clock).

Behaviours copied from vLLM's V1 scheduler (DESIGN section 5):

- running requests are served first, in admission order; each step a request computes
  ``len(sequence) - num_computed`` new tokens (its prompt in chunks of the per-step
  token budget, then one token per step), and samples one token when it has
  computed its whole sequence;
- a running request that cannot get a block preempts the newest running request by
  recompute (blocks freed, request back at the head of the waiting queue); no waiting
  request is admitted in a step with a preemption;
- waiting requests are admitted FIFO under ``max_num_seqs`` and the token budget; the
  prefix-cache hit covers whole blocks of ``sequence[:-1]``; a head that cannot get its
  blocks blocks the queue;
- the prefix-cache and prompt counters count a request's first admission only: a
  preempted request re-admitted is not counted again (vLLM keeps those figures in
  ``PrefixCacheStats.preempted_*``, which it does not export);
- full blocks are sealed (made shareable) as soon as they are full, prompt or output.

Time is not read here: :meth:`Engine.step` returns the step's duration from the cost
model, and the caller (fleet simulator or HTTP server) owns the clock. For speed, the
engine's base :class:`~rolloutpool.engine.model.decoderuns.DecodeRuns` advances many
pure-decode steps at once when nothing can change the batch in between, identical to
repeated single steps; ``tests/test_engine.py`` checks its decode cache and the batch's KV
sum against a recomputation after every step, and ``tests/test_engine_lazy.py`` runs lazy
(``EngineConfig.lazy_decode``: a request catches up in :meth:`Engine.settle`) and eager
engines in lockstep.
"""

from __future__ import annotations

import bisect
from collections import deque

from rolloutpool.engine.model.blocks import BlockPool
from rolloutpool.engine.model.cache_events import BlocksStored, CacheEvent
from rolloutpool.engine.model.decoderuns import DecodeRuns
from rolloutpool.engine.model.request import EngineConfig, EngineCounters, Request, StepOutcome

__all__ = ["Engine", "EngineConfig", "EngineCounters", "Request", "StepOutcome"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Engine(DecodeRuns):
    """One replica: waiting queue, running batch, block pool, counters."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.pool = BlockPool(config.num_gpu_blocks, config.block_size)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.counters = EngineCounters()
        self._bs = config.block_size
        self._caching = config.enable_prefix_caching
        self._kv = 0  # sum of num_computed over the running batch
        # the decode cache (see decode_run_length): valid while only decode runs changed the batch
        self._clock = 0  # decode-run steps applied so far
        self._fins: list[tuple[int, int, Request]] | None = None
        # running requests' (last step on the clock, batch order, request), ascending
        self._phase_counts: list[int] = []  # running requests by (num_computed - 1 - clock) % block_size
        self._admitted = 0  # requests that joined the batch so far: their batch order
        self._lazy = config.lazy_decode
        self._lazy_clock = 0  # lazy decode-run steps so far; a running request is settled up to its lazy_since
        self._dirty = False  # some running request is behind the lazy clock (only while the decode cache is valid)

    # -- intake ---------------------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a request. Raises ``ValueError`` when its prompt cannot fit the context."""
        if request.prompt_len >= self.config.max_model_len:
            raise ValueError(
                f"prompt of {request.prompt_len} tokens does not fit max_model_len {self.config.max_model_len}"
            )
        self.waiting.append(request)

    def abort(self, request: Request) -> bool:
        """Drop a request wherever it is; returns whether it was found."""
        self.settle()
        if request in self.running:
            self.running.remove(request)
            self._kv -= request.num_computed
            self._fins = None
        elif request in self.waiting:
            self.waiting.remove(request)
        else:
            return False
        self._free(request)
        request.finish_reason = "abort"
        return True

    def record_cache_events(self) -> None:
        """Record the prefix cache's changes (vLLM's KV events) from now on, for :meth:`take_cache_events`."""
        if self.pool.events is None:
            self.pool.events = []

    def take_cache_events(self) -> list[CacheEvent]:
        """The cache events recorded since the last call, oldest first (empty while not recording)."""
        events = self.pool.events
        if not events:
            return []
        self.pool.events = []
        return events

    @property
    def has_work(self) -> bool:
        """Whether a step would do anything."""
        return bool(self.running or self.waiting)

    # -- one step -------------------------------------------------------------------

    def settle(self) -> None:
        """Bring every running request's counters and block seals up to date (lazy decode; else a no-op)."""
        if not self._dirty:
            return
        clock = self._lazy_clock
        for req in self.running:
            if req.lazy_since != clock:
                self._catch_up(req, clock)
        self._dirty = False

    def _catch_up(self, req: Request, clock: int) -> None:
        """Apply the lazy decode steps a request has not seen yet: its counters, then its full blocks' seals."""
        steps = clock - req.lazy_since
        req.lazy_since = clock
        computed = req.num_computed + steps
        req.num_computed = computed
        req.num_output += steps
        bs = self._bs
        full = computed // bs
        n_hashed = req.n_hashed
        if n_hashed < full:
            hashes = req.hashes
            full = min(full, len(hashes))
            if n_hashed < full:
                req.pool_hint = self.pool.seal(hashes, n_hashed, full, req.pool_hint)
                req.n_hashed = n_hashed = full
        req.n_private = -(-computed // bs) - n_hashed

    def step(self) -> StepOutcome:
        """Schedule and execute one engine step."""
        if self._lazy and self._fins is not None and self.pool.events is None:
            out = self._lazy_step()
            if out is not None:
                return out
        self.settle()
        fins, self._fins = self._fins, None
        bs, pool = self._bs, self.pool
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed
            n_new = min(req.prompt_len + req.num_output - computed, budget)
            need = -(-(computed + n_new) // bs) - req.n_hashed - req.n_private
            if need:
                while need > pool.num_free:
                    if self._relieve(need - pool.num_free):
                        continue
                    victim = running.pop()
                    self._kv -= victim.num_computed
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is req:
                        break
                if preempted and preempted[-1] is req:
                    break
                pool.take_new(need)
                req.n_private += need
            scheduled.append((req, n_new))
            budget -= n_new
            i += 1
        if preempted:
            return self._execute(scheduled, preempted)
        self._admit(budget, scheduled)
        out = self._execute(scheduled, preempted)
        if fins is not None and i == len(fins):  # every cached request decoded one token
            self._step_decode_cache(fins, [req for req, _ in scheduled[i:]], out.finished)
        return out

    def _lazy_step(self) -> StepOutcome | None:
        """:meth:`step` beside a batch of pure decoders (the decode cache is valid), touching only the requests it
        admits or finishes; None (nothing done) when the decoders' next blocks would not fit: the eager step preempts.

        The decoders' one token each is a lazy decode run of one step: their blocks for it are taken at once
        (the eager step takes them request by request, before admitting: the same blocks leave the free queue),
        their tokens and KV enter the step's cost as sums, and their counters and seals wait for :meth:`settle`.
        """
        fins, running, pool = self._fins, self.running, self.pool
        assert fins is not None  # noqa: S101 -- checked by the caller
        batch = len(running)
        budget = self.config.max_num_batched_tokens - batch
        if budget < 0:
            return None
        need = self._decode_blocks_needed(1)
        if need > pool.num_free:
            return None
        if need:
            pool.take_new(need)
        decoders_kv = self._kv
        self._fins = None  # admission reads no decode cache
        self._lazy_clock += 1
        self._dirty = True
        scheduled: list[tuple[Request, int]] = []
        self._admit(budget, scheduled)
        clock, lazy_clock = self._clock + 1, self._lazy_clock
        ended: list[Request] = []
        for fin, _, req in fins:  # decoders this step finishes: the front of the list, in batch order
            if fin > clock:
                break
            self._finish_lazy(req, lazy_clock)
            ended.append(req)
        out = self._execute(scheduled, [], decoders=batch, decoders_kv=decoders_kv, ended=ended)
        self._step_decode_cache(fins, [req for req, _ in scheduled], out.finished)
        return out

    def _step_decode_cache(
        self, fins: list[tuple[int, int, Request]], admitted: list[Request], finished: list[Request]
    ) -> None:
        """Carry the decode cache over a step in which every cached request decoded one token.

        The step is one more tick of the cache's clock for them; the ones it finished
        leave, and the requests it admitted join if they are decoding now.
        """
        bs, counts = self._bs, self._phase_counts
        clock = self._clock + 1
        self._clock = clock
        new = {id(req) for req in admitted}
        ended = {id(req) for req in finished}
        done = 0
        for req in finished:
            if id(req) not in new:
                done += 1
                counts[(req.num_computed - 1 - clock) % bs] -= 1
        del fins[:done]  # their last step was this one: the front of the list
        model_len = self.config.max_model_len
        for req in admitted:
            if id(req) in ended:
                continue
            out = req.num_output
            seq_len = req.prompt_len + out
            if seq_len - req.num_computed != 1 or out == 0:
                return  # still in prefill: the cache stays dropped
            bisect.insort(fins, (clock + min(req.max_tokens - out, model_len - seq_len), req.batch_order, req))
            counts[(req.num_computed - 1 - clock) % bs] += 1
        self._fins = fins

    def _admit(self, budget: int, scheduled: list[tuple[Request, int]]) -> int:
        bs, pool = self._bs, self.pool
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            total = req.seq_len
            lookup = self._caching and not req.skip_cache_read
            hits, held = pool.count_hits_held(req.hashes, (total - 1) // bs) if lookup else (0, 0)
            hit_tokens = hits * bs
            n_new = min(total - hit_tokens, budget)
            need = _ceil_div(hit_tokens + n_new, bs) - hits
            if need > pool.num_free - (hits - held):
                if self._relieve(need - pool.num_free + hits - held):
                    continue  # blocks a subclass kept were let go: look again
                break  # head-of-line blocking
            self.waiting.popleft()
            pool.take_cached(req.hashes, hits)
            pool.take_new(need)
            req.n_hashed, req.n_private, req.num_computed = hits, need, hit_tokens
            sealed = min((hit_tokens + n_new) // bs, len(req.hashes))
            if sealed > hits:  # vLLM caches the blocks a step fills when it allocates them: a later request of the
                # same step (another choice of one prompt, an identical prompt) finds them
                if pool.events is not None:
                    pool.events.append(BlocksStored(req, hits, sealed))
                req.pool_hint = pool.seal(req.hashes, hits, sealed, req.pool_hint)
                req.n_hashed, req.n_private = sealed, need - (sealed - hits)
            if not req.scheduled_once:  # vLLM exports no figure of preempted re-admissions
                req.scheduled_once = True
                req.cached_tokens = hit_tokens
                counters = self.counters
                if lookup:  # vLLM counts no query for a request that skips the lookup
                    counters.prefix_queries += total
                    counters.prefix_hits += hit_tokens
                counters.prompt_tokens += req.prompt_len
                counters.prompt_tokens_cached += hit_tokens
            self._admitted += 1
            req.batch_order = self._admitted
            req.lazy_since = self._lazy_clock
            self.running.append(req)
            self._kv += hit_tokens
            scheduled.append((req, n_new))
            budget -= n_new
        return budget

    def _step_cost(self, scheduled: list[tuple[Request, int]], decoders: int, decoders_kv: int) -> tuple[float, int]:
        """The step's duration and its new tokens: ``scheduled`` chunks beside ``decoders`` more decoding over
        ``decoders_kv`` computed tokens."""
        prefill_tokens = free = 0  # free: tokens restored at no cost (EngineConfig.free_restore)
        kv_read, kv_new = decoders_kv, decoders
        pairs = 0.0  # prefill attention: a chunk of q tokens over p computed ones, q * (p + q / 2) query-key pairs
        restoring = self.config.free_restore
        for req, n_new in scheduled:
            computed = req.num_computed
            kv_read += computed
            kv_new += n_new
            if n_new > 1 or req.num_output == 0:
                restored = min(n_new, req.free_tokens - computed) if restoring else 0
                paid = n_new
                if restored > 0:
                    free += restored
                    computed += restored
                    paid -= restored
                prefill_tokens += paid
                pairs += paid * (computed + paid / 2)
        if not kv_new:
            return 0.0, 0
        seconds = self.config.cost.step_seconds(
            prefill_tokens=prefill_tokens,
            decode_tokens=kv_new - prefill_tokens - free,
            kv_tokens_read=kv_read,
            attention_pairs=pairs,
        )
        return seconds, kv_new

    def _execute(
        self,
        scheduled: list[tuple[Request, int]],
        preempted: list[Request],
        *,
        decoders: int = 0,
        decoders_kv: int = 0,
        ended: list[Request] | None = None,
    ) -> StepOutcome:
        """Run the scheduled chunks: their cost, counters, seals and finishes.

        ``decoders`` more requests (the batch before ``scheduled``) decoded one token each over ``decoders_kv``
        computed tokens, lazily: they count in the cost and the counters, and ``ended`` of them finished.
        """
        duration, kv_new = self._step_cost(scheduled, decoders, decoders_kv)
        finished: list[Request] = [] if ended is None else ended  # the batch's order: decoders first
        first: list[Request] = []
        generated = decoders
        bs, seal, model_len, events = self._bs, self.pool.seal, self.config.max_model_len, self.pool.events
        for req, n_new in scheduled:  # _seal and _done, inlined
            computed = req.num_computed + n_new
            req.num_computed = computed
            full = computed // bs
            n_hashed = req.n_hashed
            if n_hashed < full:
                hashes = req.hashes
                full = min(full, len(hashes))
                if n_hashed < full:
                    if events is not None:
                        events.append(BlocksStored(req, n_hashed, full))
                    req.pool_hint = seal(hashes, n_hashed, full, req.pool_hint)
                    req.n_private -= full - n_hashed
                    req.n_hashed = full
            out = req.num_output
            if computed == req.prompt_len + out:
                out += 1
                req.num_output = out
                generated += 1
                if out == 1:
                    first.append(req)
                if out >= req.max_tokens:
                    req.finish_reason = "stop"
                    finished.append(req)
                elif req.prompt_len + out >= model_len:
                    req.finish_reason = "length"
                    finished.append(req)
        self._kv += kv_new
        self._finish(finished)
        stepped = 1 if scheduled or decoders else 0
        self.counters.generation_tokens += generated
        self.counters.steps += stepped
        self.counters.busy_seconds += duration
        self.counters.token_step_seconds += duration * generated
        return StepOutcome(duration, stepped, finished, first, preempted, generated)

    def _blocks_needed(self, steps: int) -> int:
        bs = self._bs
        return sum(_ceil_div(r.num_computed + steps, bs) - r.held_blocks for r in self.running)

    def _admissible(self) -> bool:
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return False
        req = self.waiting[0]
        bs = self._bs
        budget = self.config.max_num_batched_tokens - len(self.running)
        if budget <= 0:
            return False
        lookup = self._caching and not req.skip_cache_read
        hits, held = self.pool.count_hits_held(req.hashes, (req.seq_len - 1) // bs) if lookup else (0, 0)
        n_new = min(req.seq_len - hits * bs, budget)
        need = _ceil_div(hits * bs + n_new, bs) - hits
        return need <= self.pool.num_free + self._relievable() - (hits - held)

    def _relieve(self, blocks: int) -> bool:
        """Blocks run short by ``blocks``: a subclass holding blocks beyond requests (pins) lets some go; whether
        it freed any. The plain engine holds none."""
        return False

    def _relievable(self) -> int:
        """Blocks :meth:`_relieve` could free (the plain engine: none)."""
        return 0

    # -- bookkeeping --------------------------------------------------------------------

    def _finish(self, finished: list[Request]) -> None:
        if not finished:
            return
        done = {id(r) for r in finished}
        self.running = [r for r in self.running if id(r) not in done]
        for req in finished:
            self._kv -= req.num_computed
            self._free(req)
            if req.finish_reason == "stop":
                self.counters.finished_stop += 1
            else:
                self.counters.finished_length += 1

    def _free(self, req: Request) -> None:
        self.pool.release(req.hashes, req.n_hashed, req.n_private)
        req.n_hashed = req.n_private = 0

    def _preempt(self, req: Request) -> None:
        self._free(req)
        if self.config.free_restore:
            req.free_tokens = max(req.free_tokens, req.num_computed)
        req.num_computed = 0
        req.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(req)
