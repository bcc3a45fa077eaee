"""Continuum's pinning: a turn that ends in a tool call keeps its KV pinned for a TTL (pure, no clock).

Sources: Li et al., *Continuum* (arXiv 2511.02230) and its released code (``Hanchenli/vllm-continuum``,
a fork of vLLM's scheduler). When a request of a multi-turn program finishes in a tool call, its KV blocks
stay referenced (pinned: vLLM's LRU cannot evict them) until the program's next request arrives or the
TTL ends. The paper chooses the TTL from the tool's duration distribution against the cost of reloading
(recomputing) the context; the released code pins for a fixed 2 s. Both are here: ``paper`` (the default)
and ``fixed``.

``paper``, as we formulate it (``docs/peers.md``): with the tool durations seen ``T``, pinning ``c`` tokens
for ``tau`` seconds costs ``E[min(T, tau)] * c / capacity`` engine-seconds of KV (the share of the pool held,
for as long as it is held) and saves the context's prefill (:meth:`CostModel.prefill_seconds`) with
probability ``P(T <= tau)``; the TTL minimises ``hold + P(T > tau) * prefill`` over the durations seen (at
most ``max_ttl_s``); until ``min_samples`` durations are seen, the fixed rule's 2 s.

Where blocks run short (a running request needs one, the waiting head does not fit), pins are let go first,
the one expiring soonest first, before anything is preempted: pinning never costs a running request its
KV. The caller owns the clock: :meth:`PinningEngine.tick` expires pins as time passes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rolloutpool.engine.model.core import Engine, EngineConfig, Request

__all__ = ["FIXED_TTL_S", "PinConfig", "PinningEngine", "paper_ttl"]

FIXED_TTL_S = 2.0
"""The released code's TTL."""


@dataclass(frozen=True)
class PinConfig:
    """How Continuum picks its TTL."""

    rule: str = "paper"
    """``paper`` (from the tool durations and the reload cost) or ``fixed`` (2 s)."""
    max_ttl_s: float = 60.0
    min_samples: int = 16
    window: int = 512
    """Tool durations remembered (the most recent)."""

    def __post_init__(self) -> None:
        if self.rule not in ("paper", "fixed"):
            raise ValueError(f"rule must be 'paper' or 'fixed', got {self.rule!r}")
        if self.max_ttl_s < 0 or self.min_samples < 1 or self.window < 1:
            raise ValueError("need max_ttl_s >= 0, min_samples >= 1, window >= 1")


def paper_ttl(durations: list[float], *, hold_per_s: float, reload_s: float, max_ttl_s: float) -> float:
    """The TTL minimising expected hold cost plus expected reload cost over sorted ``durations`` (pure)."""
    n = len(durations)
    best_tau, best = 0.0, reload_s  # no pin: always reload
    done = 0.0  # the durations at most tau, summed
    for i, t in enumerate(durations):
        if t > max_ttl_s:
            break
        done += t
        later = n - i - 1  # calls still out at tau = t
        cost = hold_per_s * (done + t * later) / n + reload_s * later / n
        if cost < best:
            best, best_tau = cost, t
    return best_tau


@dataclass
class _Pin:
    hashes: list[int]
    blocks: int
    until: float
    since: float


class PinningEngine(Engine):
    """An engine that pins a finished turn's KV for a TTL (Continuum)."""

    def __init__(
        self, config: EngineConfig, pins: PinConfig | None = None, *, program: Callable[[Request], object] | None = None
    ) -> None:
        super().__init__(config)
        self.pin_config = pins or PinConfig()
        self.program = program or _tag
        """A request's program (its pin's key; None: none, nothing pinned): its tag unless told."""
        self.pins: dict[object, _Pin] = {}
        self.now = 0.0
        self._durations: deque[float] = deque(maxlen=self.pin_config.window)
        self._sorted: list[float] | None = None
        self.pinned_turns = 0
        self.pin_hits = 0
        """Pins whose program came back before they ended."""
        self.pins_relieved = 0
        """Pins let go early because blocks ran short."""
        self._finished: dict[object, float] = {}
        """Program -> when its last turn ended in a tool call (the engine times its tools: vllm-continuum does)."""

    # -- the caller's clock ---------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Time passed: pins whose TTL ended are let go."""
        self.now = now
        for key in [k for k, p in self.pins.items() if p.until <= now]:
            self._unpin(key)

    # -- pins ---------------------------------------------------------------------------

    def ttl(self, tokens: int) -> float:
        """The TTL of a pin of ``tokens`` context now."""
        cfg = self.pin_config
        if cfg.rule == "fixed" or len(self._durations) < cfg.min_samples:
            return min(FIXED_TTL_S, cfg.max_ttl_s)
        if self._sorted is None:
            self._sorted = sorted(self._durations)
        capacity = self.config.kv_capacity_tokens
        return paper_ttl(
            self._sorted,
            hold_per_s=tokens / capacity,
            reload_s=self.config.cost.prefill_seconds(tokens),
            max_ttl_s=cfg.max_ttl_s,
        )

    def pin(self, key: object, request: Request) -> float:
        """A turn of program ``key`` ended in a tool call: pin its cached KV; the TTL given (0: nothing pinned)."""
        self._unpin(key)
        self._finished[key] = self.now
        n = self.pool.count_hits(request.hashes, len(request.hashes))
        if n == 0:
            return 0.0
        ttl = self.ttl(n * self.config.block_size)
        if ttl <= 0:
            return 0.0
        hashes = request.hashes[:n]
        self.pool.take_cached(hashes, n)
        self.pins[key] = _Pin(hashes, n, self.now + ttl, self.now)
        self.pinned_turns += 1
        return ttl

    def add(self, request: Request) -> None:
        """A request arrives (at :attr:`now`): a program's tool call is timed and its pin has done its work."""
        key = self.program(request)
        ended = None if key is None else self._finished.pop(key, None)
        if ended is not None:
            self.returned(self.now - ended)
        if key is not None and key in self.pins:
            self.pin_hits += 1
            self._unpin(key)
        super().add(request)

    def returned(self, seconds: float) -> None:
        """A tool call took ``seconds`` (from its turn's end to the program's next request)."""
        self._durations.append(seconds)
        self._sorted = None

    def _unpin(self, key: object) -> None:
        pin = self.pins.pop(key, None)
        if pin is not None:
            self.pool.release(pin.hashes, pin.blocks, 0)

    # -- the engine's hooks ------------------------------------------------------------

    def _relieve(self, blocks: int) -> bool:
        if not self.pins:
            return False
        key = min(self.pins, key=lambda k: self.pins[k].until)
        self._unpin(key)
        self.pins_relieved += 1
        return True

    def _relievable(self) -> int:
        return sum(p.blocks for p in self.pins.values())


def _tag(request: Request) -> object:
    return request.tag
