"""``rolloutpool bench --simulate``: the simulator on a bench run's own fleet, workload, window and seed.

A real-process figure means most beside what the simulator says of the same point: where they
agree the processes, HTTP and the engines' clocks reproduce the model, and where they part one
of them is wrong. This runs :func:`rolloutpool.sim.fleet.simulate_policy` on a
:class:`~rolloutpool.sim.config.FleetConfig` built from the :class:`~rolloutpool.dev.bench.config.BenchConfig`
(replicas, KV blocks, in-flight count, simulated window = wall window x time scale, seed,
the router's scrape interval in simulated seconds, every trajectory started at
once as the bench's client starts them), for every router that has a simulated policy, sticky
least-loaded always among them as the baseline, and the no-eviction bound last (sticky least-loaded
on a KV pool that holds every session in flight). vllm-router's program scheduling, cache-aware and
power-of-two have no model in the simulator; nor does ``--engine-seed`` (the engine-sims' generated
ids and fault draws, which the simulator does not model). "Evicted %" is every re-prefill over the
prefilled tokens, as the bench's client counts it (the shortfall of ``cached_tokens`` against the
session's previous context, whatever the cause).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rolloutpool.capacity import DEFAULT_BLOCK_SIZE
from rolloutpool.dev.bench.config import BenchConfig
from rolloutpool.dev.bench.peers import ADAPTIVE, OURS, PEER_ROUTERS
from rolloutpool.sim.compare import every_session_resident
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.fleet import simulate_policy

__all__ = ["SIMULATED_POLICIES", "SimulatedRun", "fleet_config", "simulate_bench", "simulated_table"]

BASELINE = "vllm-sticky-least-loaded"
BOUND = "no-eviction bound"
"""Sticky least-loaded on a KV pool that holds every session in flight: what no scheduler beats with that placement
on the same compute (the last row of every simulated table)."""
SIMULATED_POLICIES: dict[str, str] = {
    OURS: "rolloutpool",
    ADAPTIVE: "rolloutpool-adaptive",
    BASELINE: "sticky-least-loaded",
    "vllm-consistent-hash": "consistent-hash",
    "vllm-round-robin": "round-robin",
    **{name: name for name in PEER_ROUTERS},  # the peers' turn schedulers (docs/peers.md): the same names
}
"""Bench router -> the simulator's policy that models it (the others have none)."""


@dataclass(frozen=True)
class SimulatedRun:
    """One router's simulated figures."""

    router: str
    policy: str
    tokens_per_s: float
    vs_baseline: float
    evicted_share: float
    """Re-prefilled over prefilled tokens (every cause, as the bench's client counts it)."""
    completed: int


def fleet_config(config: BenchConfig) -> FleetConfig:
    """The simulated fleet of a bench run (pure)."""
    return FleetConfig(
        scenario=config.scenario,
        in_flight=config.resolved_in_flight,
        replicas=config.replicas,
        num_gpu_blocks=config.kv_capacity_tokens // DEFAULT_BLOCK_SIZE,  # as engine-sim --kv-capacity-tokens
        cost=config.engine_cost,
        duration_s=config.duration_s * config.time_scale,
        seed=config.seed,
        scrape_interval_s=config.scrape_interval_s * config.time_scale,
        start_spread_s=0.0,
        group_hint=config.group_hint,
        kv_events=config.kv_events,
        renew_every_s=config.renew_every_s,
    )


def simulate_bench(
    config: BenchConfig, routers: Sequence[str], progress: Callable[[str], None] | None = None
) -> tuple[list[SimulatedRun], list[str]]:
    """Each of ``routers`` that has a simulated policy (the baseline first, :data:`BOUND` last), and the names of those
    that have none."""
    fleet = fleet_config(config)
    chosen = [BASELINE, *(r for r in dict.fromkeys(routers) if r in SIMULATED_POLICIES and r != BASELINE)]
    missing = [r for r in dict.fromkeys(routers) if r not in SIMULATED_POLICIES]
    results = []
    for router in chosen:
        if progress is not None:
            progress(f"simulating {router} ({fleet.in_flight} in flight, {fleet.duration_s:.0f} simulated s)")
        results.append((router, simulate_policy(fleet, SIMULATED_POLICIES[router])))
    if progress is not None:
        progress("simulating the no-eviction bound (sticky least-loaded, every session resident)")
    bound = simulate_policy(every_session_resident(fleet), SIMULATED_POLICIES[BASELINE])
    base = results[0][1].tokens_per_s
    runs = [
        SimulatedRun(
            router=router,
            policy=SIMULATED_POLICIES[BASELINE] if router == BOUND else SIMULATED_POLICIES[router],
            tokens_per_s=r.tokens_per_s,
            vs_baseline=r.tokens_per_s / base if base > 0 else 0.0,
            evicted_share=r.reprefilled_tokens / r.prefilled_tokens if r.prefilled_tokens else 0.0,
            completed=r.completed,
        )
        for router, r in [*results, (BOUND, bound)]
    ]
    return runs, missing


def simulated_table(runs: Sequence[SimulatedRun]) -> str:
    """Markdown rows of :func:`simulate_bench` (pure)."""
    lines = [
        f"| router | simulated policy | gen tok/s | / {BASELINE} | evicted % | completed |",
        "|---|---|--:|--:|--:|--:|",
    ]
    lines += [
        f"| {r.router} | {r.policy} | {r.tokens_per_s:,.0f} | {r.vs_baseline:.3f} | {100 * r.evicted_share:.1f} "
        f"| {r.completed} |"
        for r in runs
    ]
    return "\n".join(lines)
