"""The turn scheduler's settings and state (pure data): its targets, a session's phase at the tool boundary, and a
replica's working set; :mod:`rolloutpool.routing.workingset` decides with them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Phase", "ReplicaWork", "Tracked", "WorkingSetConfig"]


@dataclass(frozen=True)
class WorkingSetConfig:
    """The scheduler's few targets."""

    target: float = 0.9
    """Share of a replica's KV capacity its working set may fill."""
    limit: float = 1.0
    """Share of the KV capacity the working set never exceeds: past it idle sessions are let go however recently
    they went idle (the engine would evict them anyway, oldest first), so their turns wait for room."""
    keep_s: float = 20.0
    """An idle session's prefix is kept at least this long while the working set is under ``limit``; with
    ``keep_quantile``, only until the router has seen tool times (the prior of the learned lease)."""
    keep_quantile: float | None = 0.99
    """The lease: an idle session's prefix is kept until this quantile of its predicted tool time
    (:mod:`~rolloutpool.routing.tooltime`: learned from the gaps between its turns and the fleet's), and no longer
    than its break-even (``prefill_tokens_per_s``); None: ``keep_s``. At 0.99 the break-even is the lease but for the
    slowest tools: in the simulator (8 pressured workloads at 2x-4x) 0.99 gave +0.4 % over 0.9 at the published
    prefill price (from -1.4 % to +2.8 %), +1.0 % at twice it (up to +5.5 %) and +0.0 % at half it."""
    prefill_tokens_per_s: float | None = 40_000.0
    """The engines' prefill rate (tokens per second of the engines' clock): an idle prefix is kept no longer than
    its break-even, the time its re-prefill would stall the replica's decode batch (None: the lease alone)."""
    prefill_attention_tokens: float = 45_000.0
    """The context at which a prefill's attention costs as much as the rest of it (quadratic past it): an 8B model on
    an H100 at about 45,000 tokens (docs/cost-model.md), so re-prefilling 128K tokens costs nearly 4x their count
    at ``prefill_tokens_per_s``."""
    hold_limit_s: float = 300.0
    """A held turn is served after this long whatever the room (bounded wait)."""
    fair_after_s: float = 10.0
    """A held turn waiting this long is passed by no younger one (fairness)."""
    smoothing: float = 0.05
    """Weight of each new measurement in the growth and first-context means."""
    first_context: int = 2048
    """A new session's first context until measured (prompt + first output, tokens)."""
    growth: int = 1024
    """A turn's growth until measured (tokens)."""
    move: bool = True
    """A turn that would be held moves once to a replica with room when its prefix is not resident."""
    block_tolerance: int = 256
    """A prefix counts as resident when at most this many of its last tokens are not cached (the partial last block,
    a re-tokenized answer's last block)."""

    def __post_init__(self) -> None:
        if not 0 < self.target <= self.limit <= 2:
            raise ValueError(f"need 0 < target <= limit <= 2, got target {self.target} and limit {self.limit}")
        for name in ("keep_s", "hold_limit_s", "fair_after_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.prefill_tokens_per_s is not None and self.prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be > 0 (None: no break-even)")
        if self.prefill_attention_tokens <= 0:
            raise ValueError("prefill_attention_tokens must be > 0")
        if self.keep_quantile is not None and not 0 < self.keep_quantile < 1:
            raise ValueError(f"keep_quantile must be in (0, 1), got {self.keep_quantile}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")


class Phase(Enum):
    """Where a session stands at the tool boundary."""

    GENERATING = "generating"
    IDLE = "idle"
    """Waiting on its tool; its prefix is kept (counted in the working set)."""
    LET_GO = "let_go"
    """Waiting on its tool; its prefix is not counted (the engine may evict it)."""
    HELD = "held"
    """Its next turn arrived and waits for room."""
    WITHDRAWN = "withdrawn"
    """Its held turn was withdrawn (its client gave up); counted as ``LET_GO``, but its next turn is a retry, not the
    end of a tool call (no tool time is taken from it)."""


@dataclass(slots=True)
class Tracked:
    """One live session as the scheduler sees it."""

    replica: str
    context: int
    """Its context after its last turn (tokens)."""
    phase: Phase
    since: float
    """When it entered its phase."""
    until: float = 0.0
    """While idle: when its lease ends (after which its prefix may be let go)."""
    counted: int = 0
    """Its tokens in the replica's working set (0 when let go or held)."""
    let_go: int = 0
    """How often its prefix was let go (for metrics)."""
    lapsed: bool = False
    """Its turn now (or last) was served after its prefix had been let go: its re-prefill is by decision."""
    group: str | None = None
    """Its group (a GRPO group shares its prompt's cached blocks)."""
    shared: int = 0
    """Tokens of its context its group shares (the group's prompt): counted once per replica."""
    moved: bool = False
    """It moved to another replica once (it never moves again)."""


@dataclass
class ReplicaWork:
    """One replica's working set and held turns."""

    name: str
    capacity: int | None
    target: float | None = None
    """This replica's target when the operator set one (its control law), else the configured one."""
    counted: int = 0
    """Tokens in the working set."""
    idle: dict[str, None] = field(default_factory=dict)
    """Idle sessions whose prefix is kept, oldest first (the order they may be let go in)."""
    held: deque[str] = field(default_factory=deque)
    """Sessions whose turn waits, in arrival order."""
    out: set[str] = field(default_factory=set)
    """Sessions whose prefix is let go (waiting on a tool, or held)."""
    members: int = 0
    """Live sessions placed on it (in any phase)."""
    groups: dict[str, list[int]] = field(default_factory=dict)
    """Group -> [members counted, shared tokens]: the shared prompt is in the working set once, not per member."""
    holds: int = 0
    """Turns held (cumulative)."""
    resumes: int = 0
    """Held turns served when room freed (cumulative)."""
    lets_go: int = 0
    """Idle sessions' prefixes let go (cumulative)."""
    forced: int = 0
    """Held turns served at ``hold_limit_s`` over the target (cumulative)."""
    moves: int = 0
    """Sessions that moved here instead of waiting on their replica (cumulative)."""

    @property
    def generating(self) -> int:
        """Sessions generating a turn: the decode batch a re-prefill stalls."""
        return self.members - len(self.idle) - len(self.out)

    @property
    def kept(self) -> int:
        """Idle sessions whose prefix is kept."""
        return len(self.idle)

    def budget(self, target: float) -> int | None:
        """Tokens the working set may hold (this replica's own target over ``target``); None while the capacity is
        unknown (then the working set limits nothing)."""
        return None if self.capacity is None else int(self.capacity * (self.target or target))
