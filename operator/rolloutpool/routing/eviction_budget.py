"""Eviction that pays: how far past its KV projection a replica admits, learned from its measured re-prefill (pure).

KV admission (:mod:`~rolloutpool.routing.admission_kv`) admits while the projected contexts of a
replica's live sessions fit its cache. Where a re-prefill is dear (long contexts, an engine busy
prefilling) that is the right cap. Where contexts are short and rollouts spend most of their time in
tool calls, it holds sessions back from an engine that idles with a cache full of idle prefixes:
evicting those and re-prefilling them when their sessions return costs a few milliseconds of engine
time per turn, while every session held back costs its whole rollout. Sticky least-loaded, which
admits everyone, then serves more (``rolloutpool bench --load 3``: 0.66x of it before this module).

The budget tells the two cases apart from what the router measures: the evicted re-prefill of live
sessions (the shortfalls of ``cached_tokens`` the fast quarantine sees), per replica, as a rate over
``window_seconds``. It scales the KV budget of every replica's projection by one factor
(:attr:`EvictionBudget.scale`, at least 1: never fewer sessions than the projection admits), moved
at most every sixth of ``window_seconds``:

- the mean rate over ``reprefill_tokens_per_s``: eviction costs more than it buys, the factor falls by
  ``step_factor`` (down to 1);
- under ``grow_below`` of it while new sessions wait: one more eviction pays for itself, the factor
  rises by ``step_factor`` (up to ``max_scale``), at most once per window; once per step while the
  eviction is of idle prefixes (some measured, and the engines' KV usage averaged under ``idle_usage``
  over the window: the running sessions hold a quarter of the cache, the rest is prefixes of sessions
  in their tool calls), the same mark as the control law's (``LawParams.idle_eviction_usage``; the
  ledger feeds it the scraped usage, except within a weight update's grace after a flush);
- otherwise it holds.

Unless the engines have room to compute: while the engines' token-weighted mean step (the mean
inter-token latency, ``vllm:inter_token_latency_seconds``, over the window) stays under
``headroom_ratio`` times a step's floor (``step_floor_seconds``: its fixed overhead and one read of the
weights), a step is mostly that fixed cost and the decode batches are small, so one more session adds
about its share of tokens while a re-prefill rides in a step that is paid for anyway. Then measured
eviction, over the budget or not, is no reason to fall, and the factor rises as it would under the
budget. On ``rolloutpool bench``'s fleet at 4x (65,536 KV tokens per engine, contexts x0.25) sticky
least-loaded re-prefills 3,500-5,900 tokens/s per replica and still serves the most: its steps run
at 1.5-2.0 times the floor, with 6-9 sequences in a batch. On the H100 fleet, where eviction of long
contexts is a storm, the steps of every capped run that evicts are 2.2-3 times the floor and those of
sticky least-loaded 4-6 times. No floor known (None, the default of a router without one): no
headroom, the budget alone.

One factor for the fleet, applied to each replica's own KV tokens, keeps the replicas balanced (a
replica alone over-admitted would take the whole queue from least-loaded placement). The factor is used
by :meth:`rolloutpool.routing.ledger.Ledger.cap_of` while no operator cap and no fixed cap apply (the
operator's control law then decides, with the same threshold). The default budget is the law's
(:data:`REPREFILL_BUDGET_TOKENS_PER_S`): about 10 % of an 8B model's prefill rate on one H100, where the
simulator's throughput-versus-cap curves peak. It is engine time, so an engine that runs ``k`` times
faster (``engine-sim --time-scale k``) takes ``k`` times the budget and ``1/k`` the windows.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import TypeVar

from rolloutpool.routing.window import WindowSum

_Sample = TypeVar("_Sample", tuple[float, float], tuple[float, float, float])
"""A timed sample: its time first."""

__all__ = [
    "IDLE_PREFIX_USAGE",
    "REPREFILL_BUDGET_TOKENS_PER_S",
    "STEP_HEADROOM_RATIO",
    "EvictionBudget",
    "EvictionBudgetConfig",
    "reads_cheaply",
]

REPREFILL_BUDGET_TOKENS_PER_S = 2000.0
"""Evicted re-prefill of live sessions (tokens/s per replica) above which eviction is pressure: the router's
budget and the control law's threshold (``LawParams.reprefill_tokens_per_s``)."""

IDLE_PREFIX_USAGE = 0.25
"""KV usage, averaged over a window, under which measured eviction is of idle prefixes: the running sessions hold a
quarter of the cache, the rest is prefixes of sessions in their tool calls. The router's budget
(``EvictionBudgetConfig.idle_usage``, the fleet's mean) and the control law (``LawParams.idle_eviction_usage``, each
replica's) use the same mark."""

STEP_HEADROOM_RATIO = 2.0
"""Mean inter-token latency, as a multiple of a step's floor (overhead + one read of the weights), under which the
engines have room to compute: the router's budget (``EvictionBudgetConfig.headroom_ratio``) and the control law
(``LawParams.headroom_ratio``) use the same mark."""


def reads_cheaply(*, step_floor_seconds: float | None, cache_read_seconds: float | None, headroom_ratio: float) -> bool:
    """Whether a step that reads a replica's whole KV cache (``cache_read_seconds``) stays under ``headroom_ratio``
    times the step floor (pure; False when either is unknown). Then the weights dominate every step whatever the
    cache holds, eviction costs re-prefill alone, and sticky least-loaded, which admits everyone, serves the most:
    the control law starts at its ceiling there (``autoscale.cheap_cache_reads``) and the router's KV admission
    gives way to its ceiling (:meth:`EvictionBudgetConfig.reads_cheaply`)."""
    floor, read = step_floor_seconds, cache_read_seconds
    return floor is not None and read is not None and floor + read < headroom_ratio * floor


@dataclass(frozen=True)
class EvictionBudgetConfig:
    """How the factor moves."""

    reprefill_tokens_per_s: float = REPREFILL_BUDGET_TOKENS_PER_S
    window_seconds: float = 60.0
    """Window of the measured rate: a few turns of every session, so one long re-prefill is no storm. The factor
    moves at most every sixth of it, and rises at most once per window (and not in the first one): the eviction a
    rise causes shows only when the sessions it admitted return from their tool calls, longer each turn."""
    grow_below: float = 0.8
    """The factor rises while the mean rate is under this share of the budget (and sessions wait)."""
    step_factor: float = 1.1
    max_scale: float = 8.0
    idle_usage: float = IDLE_PREFIX_USAGE
    """KV usage (the fleet's mean over the window) under which measured eviction is of idle prefixes: the factor may
    rise every step instead of every window. 0 turns that off."""
    step_floor_seconds: float | None = None
    """A step's fixed cost in engine seconds (overhead + one weight read: ``CostModel.fixed_step_seconds`` for
    engine-sims); None: unknown, no headroom rule."""
    headroom_ratio: float = STEP_HEADROOM_RATIO
    """The fleet's mean inter-token latency under this multiple of ``step_floor_seconds``: the engines have room."""
    kv_read_seconds_per_token: float | None = None
    """What a step spends reading one token's KV (KV bytes per token / HBM bandwidth, engine seconds:
    ``CostModel.kv_read_seconds(1)`` for engine-sims); None: unknown, no replica reads cheaply."""

    def __post_init__(self) -> None:
        if not (self.reprefill_tokens_per_s > 0 and self.window_seconds > 0):
            raise ValueError("eviction budget: reprefill_tokens_per_s and window_seconds must be positive")
        if not (0 < self.grow_below <= 1 and self.step_factor > 1 and self.max_scale >= 1):
            raise ValueError("eviction budget: grow_below in (0, 1], step_factor > 1 and max_scale >= 1")
        if not 0 <= self.idle_usage <= 1:
            raise ValueError("eviction budget: idle_usage in [0, 1]")
        if (self.step_floor_seconds is not None and self.step_floor_seconds <= 0) or self.headroom_ratio <= 1:
            raise ValueError("eviction budget: step_floor_seconds must be positive and headroom_ratio over 1")
        if self.kv_read_seconds_per_token is not None and self.kv_read_seconds_per_token <= 0:
            raise ValueError("eviction budget: kv_read_seconds_per_token must be positive")

    def reads_cheaply(self, capacity_tokens: int) -> bool:
        """Whether a replica of ``capacity_tokens`` reads its whole cache cheaply (:func:`reads_cheaply`)."""
        per_token = self.kv_read_seconds_per_token
        read = None if per_token is None else capacity_tokens * per_token
        return reads_cheaply(
            step_floor_seconds=self.step_floor_seconds, cache_read_seconds=read, headroom_ratio=self.headroom_ratio
        )

    @property
    def step_seconds(self) -> float:
        """Time between two moves of the factor."""
        return self.window_seconds / 6.0

    def scaled(self, time_scale: float) -> EvictionBudgetConfig:
        """The same budget for an engine ``time_scale`` times faster than real time (pure)."""
        return replace(
            self,
            reprefill_tokens_per_s=self.reprefill_tokens_per_s * time_scale,
            window_seconds=self.window_seconds / time_scale,
        )


class EvictionBudget:
    """The fleet's factor and the evicted re-prefill each replica measured (pure)."""

    def __init__(self, config: EvictionBudgetConfig) -> None:
        self.config = config
        self.scale = 1.0
        """Multiplier of every replica's KV budget in its projection (1: the projection alone)."""
        self.rises = 0
        self.falls = 0
        self._windows: dict[str, WindowSum] = {}
        self._usage: dict[str, deque[tuple[float, float]]] = {}
        self._itl: dict[str, deque[tuple[float, float, float]]] = {}
        """Replica -> scrapes of its inter-token latency counters ``(t, seconds_total, count_total)`` in the window."""
        self._since: float | None = None
        self._last_step = -math.inf
        self._last_move = -math.inf

    def observe(self, replica: str, *, now: float, tokens: int) -> None:
        """A returning turn of a live session on ``replica`` re-prefilled ``tokens`` of its evicted prefix (0: none)."""
        if self._since is None:
            self._since = now
        window = self._windows.setdefault(replica, WindowSum(self.config.window_seconds))
        if tokens > 0:
            window.add(tokens, now=now)

    def _within(self, samples: deque[_Sample], now: float) -> deque[_Sample]:
        """``samples`` (timed first) within the window that ends at ``now``: the older ones are forgotten."""
        while samples and samples[0][0] < now - self.config.window_seconds:
            samples.popleft()
        return samples

    def observe_usage(self, replica: str, *, now: float, usage: float) -> None:
        """A scrape of the replica's KV usage (0..1)."""
        self._within(self._usage.setdefault(replica, deque()), now).append((now, usage))

    def observe_itl(self, replica: str, *, now: float, seconds_total: float, count_total: float) -> None:
        """A scrape of the replica's inter-token latency histogram: its ``_sum`` and ``_count`` (engine seconds)."""
        samples = self._itl.setdefault(replica, deque())
        if samples and count_total < samples[-1][2]:  # the engine restarted: its counters begin again
            samples.clear()
        self._within(samples, now).append((now, seconds_total, count_total))

    def mean_itl(self, replica: str, now: float) -> float | None:
        """The replica's mean inter-token latency over the window; None under two scrapes or without a token."""
        samples = self._within(self._itl.get(replica, deque()), now)
        if len(samples) < 2:
            return None
        (_, s0, c0), (_, s1, c1) = samples[0], samples[-1]
        return (s1 - s0) / (c1 - c0) if c1 > c0 else None

    def headroom(self, replicas: list[str], now: float) -> bool:
        """Whether the engines have room to compute: the mean over ``replicas`` of their mean inter-token latency under
        ``headroom_ratio`` x ``step_floor_seconds`` (False without a floor or while a replica has no mean)."""
        floor = self.config.step_floor_seconds
        if floor is None or not replicas:
            return False
        means = [self.mean_itl(name, now) for name in replicas]
        known = [m for m in means if m is not None]
        return len(known) == len(means) and sum(known) / len(known) < self.config.headroom_ratio * floor

    def forget(self, replica: str) -> None:
        """A replica left the fleet."""
        self._windows.pop(replica, None)
        self._usage.pop(replica, None)
        self._itl.pop(replica, None)

    def mean_usage(self, replicas: list[str], now: float) -> float | None:
        """The mean over ``replicas`` of each one's KV usage averaged over the window; None: none scraped in it."""
        means = []
        for name in replicas:
            samples = self._within(self._usage.get(name, deque()), now)
            if samples:
                means.append(sum(u for _, u in samples) / len(samples))
        return sum(means) / len(means) if means else None

    def rate(self, replica: str, now: float) -> float:
        """The replica's evicted re-prefill tokens per second over the window (0 before any turn returned)."""
        window = self._windows.get(replica)
        if window is None or self._since is None:
            return 0.0
        span = max(min(self.config.window_seconds, now - self._since), self.config.step_seconds)
        return window.trim(now) / span

    def step(self, replicas: list[str], *, now: float, waiting: bool) -> bool:
        """Move the factor once per ``step_seconds`` from the mean rate of ``replicas``; whether it moved.

        ``waiting``: new sessions wait for a slot (a factor nobody waits for stays put).
        """
        cfg = self.config
        if now - self._last_step < cfg.step_seconds or self._since is None or not replicas:
            return False
        self._last_step = now
        mean = sum(self.rate(name, now) for name in replicas) / len(replicas)
        usage = self.mean_usage(replicas, now)
        idle = mean > 0.0 and usage is not None and usage < cfg.idle_usage
        room = self.headroom(replicas, now)
        if mean > cfg.reprefill_tokens_per_s and self.scale > 1.0 and not room:
            self.scale = max(1.0, self.scale / cfg.step_factor)
            self.falls += 1
        elif (
            waiting
            and (mean < cfg.grow_below * cfg.reprefill_tokens_per_s or room)
            and self.scale < cfg.max_scale
            and now - self._since >= cfg.window_seconds
            and now - self._last_move >= (cfg.step_seconds if idle else cfg.window_seconds)
        ):
            self.scale = min(cfg.max_scale, self.scale * cfg.step_factor)
            self.rises += 1
        else:
            return False
        self._last_move = now
        return True
