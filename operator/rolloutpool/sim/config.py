"""Configuration of one simulated fleet run."""

from __future__ import annotations

from dataclasses import dataclass, field

from rolloutpool.autoscale import LawParams
from rolloutpool.engine.model.cost import CostModel
from rolloutpool.engine.model.request import DEFAULT_MAX_NUM_SEQS
from rolloutpool.routing.admission_kv import GROWTH_SHARE
from rolloutpool.routing.eviction_budget import EvictionBudgetConfig
from rolloutpool.routing.quarantine import QuarantineConfig
from rolloutpool.routing.workingset import WorkingSetConfig
from rolloutpool.sim.weights import WeightUpdateConfig
from rolloutpool.sim.workload import Scenario

__all__ = ["ADAPTIVE", "FleetConfig"]

ADAPTIVE = "rolloutpool-adaptive"
"""Our placement with the operator's control law setting caps and quarantine from scraped signals."""


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
    expected_residency: float = 0.5
    headroom: float = 0.1
    kv_admission: bool = True
    """Our policy also admits a new session only while its replica's projected KV tokens fit (the router's
    default); False: by the session-count cap alone (the fixed cap from ``expected_residency``)."""
    growth_share: float = GROWTH_SHARE
    """Share of its expected remaining growth our policy projects a live session with (KV admission)."""
    eviction_budget: EvictionBudgetConfig | None = field(default_factory=EvictionBudgetConfig)
    """Our policy's KV admission also admits past its projection while measured eviction is cheap (the router's
    default, :mod:`rolloutpool.routing.eviction_budget`); None: the projection alone."""
    working_set: WorkingSetConfig | None = None
    """Our policy schedules turns by each replica's working set (routing/workingset.py); None: session caps."""
    fixed_cap: int | None = None
    """Override the residency-derived cap of capped policies (hindsight sweeps)."""
    co_locate_groups: bool = True
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
    """The adaptive policy's law; None: defaults with floor = KV capacity // maxModelLen, ceiling = max_num_seqs."""
    weight_updates: WeightUpdateConfig | None = None
    """The weight-update scenario (pause, flush, resume every ``every_s``); None: no updates."""
