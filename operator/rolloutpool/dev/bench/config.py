"""What one ``rolloutpool bench`` is: its knobs, the workload scaled to the bench's KV pool, its figures (pure data).

:mod:`rolloutpool.dev.bench.runner` runs it; the report, the sweep and ``bench --simulate`` read these shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rolloutpool.capacity import conservative_cap
from rolloutpool.dev.bench.overhead import OverheadConfig, OverheadRow
from rolloutpool.engine.model.cost import CostModel, hardware_preset
from rolloutpool.sim.workload import Lognormal, Scenario

__all__ = [
    "ENGINE_HARDWARE",
    "LAG_WARNING_PCT",
    "BenchConfig",
    "BenchResult",
    "RouterRun",
    "describe",
    "scaled_scenario",
]

LAG_WARNING_PCT = 5.0
"""Engine lag (percent of the window) past which a run's figures say more about the CPU than the routers."""
ENGINE_HARDWARE = "h100-80gb"
"""The engine-sims' cost-model preset (their KV capacity is the bench's own); our router knows its step floor."""


def scaled_scenario(base: Scenario, *, context_scale: float, max_model_len: int) -> Scenario:
    """``base`` with prompt, action and observation lengths scaled by ``context_scale`` (pure)."""

    def scale(d: Lognormal) -> Lognormal:
        return Lognormal(max(1.0, d.median * context_scale), max(1.0, d.p90 * context_scale))

    return base.with_(
        prompt_tokens=scale(base.prompt_tokens),
        action_tokens=scale(base.action_tokens),
        observation_tokens=scale(base.observation_tokens),
        max_model_len=max_model_len,
    )


@dataclass(frozen=True)
class BenchConfig:
    """Every knob of ``rolloutpool bench``."""

    scenario: Scenario
    routers: tuple[str, ...]
    replicas: int = 4
    kv_capacity_tokens: int = 65536
    time_scale: float = 10.0
    duration_s: float = 90.0
    in_flight: int = 0
    """0: ``load`` x the fleet's conservative capacity."""
    load: float = 2.0
    seed: int = 0
    engine_seed: int = 0
    scrape_interval_s: float = 0.5
    queue_timeout_s: float = 600.0
    vllm_router_bin: str = "vllm-router"
    out_dir: Path = Path("out/bench")
    overhead: OverheadConfig | None = field(default_factory=OverheadConfig)
    ready_timeout_s: float = 60.0
    context_scale: float = 1.0
    """How ``scenario`` was scaled (reported only)."""
    prefill_cost_scale: float = 1.0
    """The engine-sims' ``--prefill-cost-scale``: what prefill costs in their step-time model (0.5 halves)."""
    kv_events: bool = True
    """Every engine-sim publishes KV events (``--kv-events-config``) and our router subscribes (``--kv-events``), as
    a RolloutPool deploys them by default (``spec.router.kvEvents``); off: our router presumes a prefix it let go is
    gone. vllm-router does not read them."""
    renew_every_s: float | None = None
    """Our router renews the prefixes its turn scheduler keeps every this many engine seconds (``--renew-every``,
    passed in wall seconds); None: off, its default."""
    group_hint: bool = False
    """The client sends each trajectory's GRPO group in ``X-Session-Group`` (our router's group hint: it counts a
    group's shared prompt once and co-locates the group); off, as vllm-router's clients: session ids only."""

    @property
    def engine_cost(self) -> CostModel:
        """The engine-sims' step-time model: their hardware preset's, with ``prefill_cost_scale``."""
        return hardware_preset(ENGINE_HARDWARE).cost.with_prefill_cost_scale(self.prefill_cost_scale)

    @property
    def max_model_len(self) -> int:
        """The scenario's context limit, also every engine's and our router's."""
        return self.scenario.max_model_len

    @property
    def fleet_floor(self) -> int:
        """Sessions the fleet holds without any eviction: replicas x (KV // maxModelLen)."""
        per = conservative_cap(capacity_tokens=self.kv_capacity_tokens, max_model_len=self.max_model_len)
        return per * self.replicas

    @property
    def resolved_in_flight(self) -> int:
        """Trajectories kept in flight."""
        return self.in_flight or max(1, round(self.load * self.fleet_floor))

    @property
    def typical_prefill_tokens(self) -> int:
        """New tokens of a typical returning turn (median action + observation)."""
        s = self.scenario
        return round(s.action_tokens.median + s.observation_tokens.median)


@dataclass
class RouterRun:
    """One configuration's figures (times in simulated seconds unless named wall)."""

    router: str
    in_flight: int
    window_wall_s: float
    generated_tokens: int
    tokens_per_s: float
    started: int
    completed: int
    completed_per_hour: float
    turns: int
    reprefilled_tokens: int
    prompt_tokens: int
    cached_tokens: int
    preemptions: int
    prefix_hit_ratio: float
    p50_trajectory_s: float | None
    p90_trajectory_s: float | None
    retries: int
    errors: int
    finish_failures: int
    pids: list[int]
    """Every process of this configuration (engines and router)."""
    leftover_pids: list[int]
    """Those still alive after the stop (should be none)."""
    prefill_tokens: int = 0
    """Prompt tokens the engines computed (prompt - cached, every turn)."""
    evicted_pct: float = 0.0
    """Re-prefilled tokens over prefilled tokens, in percent."""
    first_turn_p50_s: float | None = None
    """Start of a trajectory to its first response (simulated seconds): admission queueing included."""
    first_turn_p90_s: float | None = None
    queued_mean: float = 0.0
    """Trajectories waiting for their first response, averaged over the window."""
    law: dict[str, object] | None = None
    """``rolloutpool-adaptive``: the law's steps, cuts, raises, quarantines and final caps."""
    engine_lag_pct: float = 0.0
    """Simulated time the engines lost behind their time scale, in percent of the window (mean over engines)."""


@dataclass
class BenchResult:
    """The whole benchmark."""

    config: dict[str, object]
    runs: list[RouterRun]
    overhead: list[OverheadRow]


def describe(config: BenchConfig) -> dict[str, object]:
    """The configuration as plain JSON data."""
    s = config.scenario
    return {
        "scenario": s.name,
        "context_scale": config.context_scale,
        "prefill_cost_scale": config.prefill_cost_scale,
        "kv_events": config.kv_events,
        "group_hint": config.group_hint,
        "renew_every_s": config.renew_every_s,
        "group_size": s.group_size,
        "prompt_tokens": [s.prompt_tokens.median, s.prompt_tokens.p90],
        "action_tokens": [s.action_tokens.median, s.action_tokens.p90],
        "observation_tokens": [s.observation_tokens.median, s.observation_tokens.p90],
        "tool_latency_s": [s.tool_latency_s.median, s.tool_latency_s.p90],
        "turns": [s.turns.median, s.turns.p90],
        "max_model_len": s.max_model_len,
        "routers": list(config.routers),
        "replicas": config.replicas,
        "kv_capacity_tokens": config.kv_capacity_tokens,
        "fleet_floor": config.fleet_floor,
        "in_flight": config.resolved_in_flight,
        "time_scale": config.time_scale,
        "duration_s": config.duration_s,
        "seed": config.seed,
        "engine_seed": config.engine_seed,
        "scrape_interval_s": config.scrape_interval_s,
        "queue_timeout_s": config.queue_timeout_s,
    }
