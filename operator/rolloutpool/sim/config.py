"""Configuration of one simulated fleet run."""

from __future__ import annotations

from dataclasses import dataclass, field

from rolloutpool.autoscale import LawParams
from rolloutpool.engine.model.cost import CostModel
from rolloutpool.engine.model.request import DEFAULT_MAX_NUM_SEQS
from rolloutpool.routing.quarantine import QuarantineConfig
from rolloutpool.routing.workingset import WorkingSetConfig
from rolloutpool.sim.weights import WeightUpdateConfig
from rolloutpool.sim.workload import Scenario

__all__ = ["ADAPTIVE", "FleetConfig"]

ADAPTIVE = "rolloutpool-adaptive"
"""Our router with the operator's control law tuning each replica's working-set target from scraped signals."""


@dataclass(frozen=True)
class FleetConfig:
    """One simulated fleet and its offered load."""

    scenario: Scenario
    in_flight: int
    replicas: int = 8
    hardware: str = "h100-80gb"
    num_gpu_blocks: int | None = None
    cost: CostModel | None = None
    """The engines' step-time model; None: the ``hardware`` preset's (:mod:`rolloutpool.sim.hardware` builds both)."""
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = 8192
    duration_s: float = 7200.0
    seed: int = 0
    working_set: WorkingSetConfig | None = field(default_factory=WorkingSetConfig)
    """Our policy schedules turns by each replica's working set (routing/workingset.py, the router's default)."""
    fixed_cap: int | None = None
    """Our policy with this fixed live-session cap and no turn scheduling instead (hindsight sweeps: the best fixed
    cap is a peer)."""
    co_locate_groups: bool = True
    group_hint: bool = False
    """The clients tell the router each rollout's GRPO group (``X-Session-Group``). Off, as vllm-router's clients and
    ``rolloutpool bench``'s by default: our router still names a group by its rollouts' opening prompt
    (``RouterConfig.infer_groups``), the peers learn none (the engines share a group's prompt blocks either way)."""
    infer_groups: bool = True
    """Our router names a group by its rollouts' opening prompt (``RouterConfig.infer_groups``, the same default)."""
    kv_events: bool = True
    """The engines publish KV events and the router subscribes (a RolloutPool's default): a returning turn's resident
    context is known exactly. Off, as a router without them (``rolloutpool router`` without ``--kv-events``): unknown,
    so a turn of a session let go is served only when its whole context fits (its blocks are presumed evicted)."""
    free_restore: bool = False
    """A bound, not a fleet: the engines restore context computed before at no cost (``EngineConfig.free_restore``),
    on the same KV pool (the free-restore bound of sticky least-loaded)."""
    known_tools: bool = False
    """A reference, not a router: ours is told each tool call's duration as the call starts, and keeps the session's
    prefix exactly that long where that pays (``WorkingSet.turn_finished``'s ``tool_s``), not its learned lease."""
    scrape_interval_s: float = 1.0
    """The router's fast loop (engine scrape for the fast quarantine)."""
    sample_interval_s: float = 30.0
    start_spread_s: float = 30.0
    quarantine: QuarantineConfig = field(default_factory=QuarantineConfig)
    control_interval_s: float = 15.0
    """The adaptive policy's control step: the Prometheus scrape interval."""
    renew_every_s: float | None = None
    """Our policy renews an idle live session's prefix every this many seconds (None: no renewal)."""
    law: LawParams | None = None
    """The adaptive policy's law; None: the operator's defaults, starting at the working set's target."""
    weight_updates: WeightUpdateConfig | None = None
    """The weight-update scenario (pause, flush, resume every ``every_s``); None: no updates."""
