"""Many pure-decode steps at once: the engine's decode runs and the decode cache that plans them (pure).

:class:`DecodeRuns` is the base of :class:`~rolloutpool.engine.model.core.Engine`. When every running
request is decoding, nobody can be admitted and blocks suffice, the engine advances many steps in one
:meth:`~DecodeRuns.decode_run`, identical to repeated single steps. The decode cache (each running request's
last step on a clock of decode steps and its block phase) makes planning a run cost little more than the run;
with ``EngineConfig.lazy_decode`` a run touches only the requests it finishes (the others catch up in
:meth:`~rolloutpool.engine.model.core.Engine.settle`). The engine owns every attribute declared here.
"""

from __future__ import annotations

from collections import deque

from rolloutpool.engine.model.blocks import BlockPool
from rolloutpool.engine.model.cache_events import BlocksStored
from rolloutpool.engine.model.request import EngineConfig, EngineCounters, Request, StepOutcome

__all__ = ["DecodeRuns"]


class DecodeRuns:
    """Decode runs of the engine (its base; the engine sets every attribute declared here)."""

    config: EngineConfig
    pool: BlockPool
    waiting: deque[Request]
    running: list[Request]
    counters: EngineCounters
    _bs: int
    _kv: int
    _clock: int
    _fins: list[tuple[int, int, Request]] | None
    _phase_counts: list[int]
    _lazy: bool
    _lazy_clock: int
    _dirty: bool

    def settle(self) -> None:
        """Bring every lazy decoder's counters and seals up to date (the engine's)."""
        raise NotImplementedError

    def _catch_up(self, req: Request, clock: int) -> None:
        raise NotImplementedError

    def _admissible(self) -> bool:
        raise NotImplementedError

    def _finish(self, finished: list[Request]) -> None:
        raise NotImplementedError

    def decode_run_length(self, max_steps: int) -> int:
        """Steps that would all be pure decode with an unchanged batch (0: use :meth:`step`).

        True when every running request is decoding, nobody can be admitted, and blocks
        suffice; the run ends at the first finish (included) or before a block shortage.

        The block limit is closed form: a request with ``c`` computed tokens holds
        ``ceil(c / bs)`` blocks and needs a new one at steps ``a + 1``, ``a + 1 + bs``,
        ... where ``a = bs - 1 - (c - 1) % bs``, so ``s = q * bs + t`` steps cost
        ``batch * q`` blocks plus one per request with ``(c - 1) % bs >= bs - t``.

        The per-request figures (last step, phase ``(c - 1) % bs``) are kept in a cache
        on a clock of decode steps, so that after a decode run only the finished requests
        leave it; any other change to the batch drops it.
        """
        running = self.running
        if not running or max_steps < 1:
            return 0
        batch = len(running)
        if batch > self.config.max_num_batched_tokens:
            return 0
        fins = self._fins if self._fins is not None else self._decode_cache()
        if fins is None:
            return 0
        remaining = min(fins[0][0] - self._clock, max_steps)
        if remaining < 1 or self._admissible():
            return 0
        # the largest s with _blocks_needed(s) <= free: whole cycles of bs steps cost
        # one block per request; the leftover blocks cover the `spare` requests whose
        # next block comes soonest (largest phase)
        cycles, spare = divmod(self.pool.num_free, batch)
        bs, clock, counts = self._bs, self._clock, self._phase_counts
        phase = bs - 1
        while True:
            spare -= counts[(phase - clock) % bs]
            if spare < 0:
                break
            phase -= 1
        steps = cycles * bs + bs - 1 - phase
        return min(remaining, steps) if steps >= 1 else 0

    def _decode_cache(self) -> list[tuple[int, int, Request]] | None:
        """Build the decode cache when every running request is decoding (else None)."""
        self.settle()
        bs, model_len, clock = self._bs, self.config.max_model_len, self._clock
        last = self.running[-1]  # the newest (just admitted, perhaps still in prefill): a quick no
        if last.prompt_len + last.num_output - last.num_computed != 1 or last.num_output == 0:
            return None
        fins: list[tuple[int, int, Request]] = []
        counts = [0] * bs
        for req in self.running:
            computed, out = req.num_computed, req.num_output
            seq_len = req.prompt_len + out
            if seq_len - computed != 1 or out == 0:
                return None
            fins.append((clock + min(req.max_tokens - out, model_len - seq_len), req.batch_order, req))
            counts[(computed - 1 - clock) % bs] += 1
        fins.sort()
        self._fins, self._phase_counts = fins, counts
        return fins

    def decode_run_seconds(self, steps: int) -> float:
        """Duration of the first ``steps`` steps of a decode run (pure arithmetic)."""
        return self.config.cost.decode_run_seconds(steps=steps, batch=len(self.running), kv_tokens_read=self._kv)

    def decode_steps_within(self, seconds: float, max_steps: int) -> int:
        """The most steps (up to ``max_steps``, at least 0) of a decode run that end by ``seconds``."""
        return self.config.cost.decode_steps_within(
            seconds, max_steps=max_steps, batch=len(self.running), kv_tokens_read=self._kv
        )

    def decode_run(self, steps: int) -> StepOutcome:
        """Advance ``steps`` pure-decode steps (``steps <= decode_run_length(...)``)."""
        duration = self.decode_run_seconds(steps)
        if self._lazy and self._fins is not None and self.pool.events is None:
            return self._lazy_decode_run(steps, duration)
        self.settle()
        running = self.running
        bs, seal, clock, events = self._bs, self.pool.seal, self._clock, self.pool.events
        fins, counts = self._fins, self._phase_counts
        need = self._decode_blocks_needed(steps)
        if need and not self.pool.take_new(need):  # pragma: no cover - guarded by decode_run_length
            raise RuntimeError("decode_run asked for more steps than blocks allow")
        # below a block of steps, a request whose (num_computed - 1) % bs stays clear of the
        # block edges neither fills a block nor starts one: only its counters move
        edge = steps if steps < bs else bs
        last = bs - 1
        for req in running:  # the loop of step() with its seal, inlined: this is the hot path
            computed = req.num_computed + steps
            req.num_computed = computed
            req.num_output += steps
            phase = (computed - 1) % bs
            if phase >= edge and phase != last:
                continue
            full = computed // bs
            n_hashed = req.n_hashed
            if n_hashed < full:
                hashes = req.hashes
                full = min(full, len(hashes))
                if n_hashed < full:
                    if events is not None:
                        events.append(BlocksStored(req, n_hashed, full))
                    req.pool_hint = seal(hashes, n_hashed, full, req.pool_hint)
                    req.n_hashed = full
            req.n_private = -(-computed // bs) - full
        clock += steps
        self._clock = clock
        self._kv += steps * len(running)
        finished = self._decoded_finished() if fins is None or fins[0][0] <= clock else []
        generated = steps * len(running)
        if fins is not None and finished:
            del fins[: len(finished)]
            for req in finished:
                counts[(req.num_computed - 1 - clock) % bs] -= 1
        return self._decoded(steps, duration, finished, generated)

    def _lazy_decode_run(self, steps: int, duration: float) -> StepOutcome:
        """:meth:`decode_run` touching only the requests it finishes (the decode cache is valid)."""
        fins, counts, bs, running = self._fins, self._phase_counts, self._bs, self.running
        assert fins is not None  # noqa: S101 -- checked by the caller
        need = self._decode_blocks_needed(steps)
        if need and not self.pool.take_new(need):  # pragma: no cover - guarded by decode_run_length
            raise RuntimeError("decode_run asked for more steps than blocks allow")
        clock = self._clock + steps
        self._clock = clock
        lazy_clock = self._lazy_clock + steps
        self._lazy_clock = lazy_clock
        self._dirty = True
        self._kv += steps * len(running)
        finished: list[Request] = []
        if fins[0][0] <= clock:  # the front of the list, in batch order: _decoded_finished's order
            done = 0
            for fin, _, req in fins:
                if fin > clock:
                    break
                done += 1
                self._finish_lazy(req, lazy_clock)
                finished.append(req)
                counts[(req.num_computed - 1 - clock) % bs] -= 1
            del fins[:done]
        generated = steps * len(running)
        return self._decoded(steps, duration, finished, generated)

    def _decoded(self, steps: int, duration: float, finished: list[Request], generated: int) -> StepOutcome:
        """A decode run's end: its finished requests leave the batch, the counters take its steps."""
        self._finish(finished)
        counters = self.counters
        counters.generation_tokens += generated
        counters.steps += steps
        counters.busy_seconds += duration
        counters.token_step_seconds += duration / steps * generated if steps else 0.0
        return StepOutcome(duration, steps, finished, [], [], generated)

    def _decode_blocks_needed(self, steps: int) -> int:
        """:meth:`_blocks_needed` of a decode run: from the phase counts when the decode cache is valid."""
        bs, running = self._bs, self.running
        if self._fins is None:
            return sum(-(-(r.num_computed + steps) // bs) - r.n_hashed - r.n_private for r in running)
        clock, counts = self._clock, self._phase_counts
        need = len(running) * (steps // bs)
        for phase in range(bs - steps % bs, bs):
            need += counts[(phase - clock) % bs]
        return need

    def _finish_lazy(self, req: Request, lazy_clock: int) -> None:
        """A lazy decoder the decode cache says finishes now: its counters caught up and its finish reason set."""
        self._catch_up(req, lazy_clock)
        if req.num_output >= req.max_tokens:
            req.finish_reason = "stop"
        elif req.prompt_len + req.num_output >= self.config.max_model_len:
            req.finish_reason = "length"
        else:  # pragma: no cover - the decode cache's last step says it finishes
            raise RuntimeError("decode cache out of step with a request")

    def _decoded_finished(self) -> list[Request]:
        """The running requests a decode run just finished, in batch order, with their finish reasons."""
        finished: list[Request] = []
        model_len = self.config.max_model_len
        for req in self.running:
            if req.num_output >= req.max_tokens:
                req.finish_reason = "stop"
                finished.append(req)
            elif req.prompt_len + req.num_output >= model_len:
                req.finish_reason = "length"
                finished.append(req)
        return finished
