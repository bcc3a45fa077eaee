"""The options ``plan --simulate`` adds to ``rolloutpool plan`` (kept light: ``plan`` imports it at start-up)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

__all__ = ["DEFAULT_PLAN_DURATION_S", "SIMULATE_ONLY", "plan_simulate_options", "wants_simulation"]

_F = TypeVar("_F", bound=Callable[..., Any])

DEFAULT_PLAN_DURATION_S = 1800.0
"""Simulated seconds of each run of ``plan --simulate`` (36 runs of up to 8 replicas: 109 s of CPU)."""

_OPTIONS = (
    click.option("--simulate", is_flag=True,
                 help="Simulate the workload of --workload over fixed caps and fleet sizes: which cap and how many "
                 "replicas serve --in-flight rollouts (table, JSON and PNG in --out)."),
    click.option("--workload", "sim_workload", type=click.Path(dir_okay=False, path_type=Path), default=None,
                 help="With --simulate: the workload file (YAML; its maxModelLen is the engines')."),
    click.option("--in-flight", "sim_in_flight", type=click.IntRange(min=1), default=None,
                 help="With --simulate: rollouts the trainer keeps in flight."),
    click.option("--target-tokens-per-s", "sim_target", type=click.FloatRange(min=0, min_open=True), default=None,
                 help="With --simulate: fleet throughput to reach (generated tokens/s). Default: --knee of the best "
                 "fleet's."),
    click.option("--knee", "sim_knee", type=click.FloatRange(min=0.5, max=1.0), default=0.9, show_default=True,
                 help="With --simulate and no target: the fewest replicas reaching this share of the best fleet's "
                 "throughput."),
    click.option("--max-replicas", "sim_max_replicas", type=click.IntRange(min=1, max=64), default=8,
                 show_default=True,
                 help="With --simulate: fleets of 1, 2, 4, ... up to this many replicas (--replicas N: only N)."),
    click.option("--cap-points", "sim_cap_points", type=click.IntRange(min=2, max=16), default=5, show_default=True,
                 help="With --simulate: fixed caps per fleet in the coarse grid (two more are refined)."),
    click.option("--kv-capacity-tokens", "sim_kv_capacity_tokens", type=click.IntRange(min=16), default=None,
                 help="With --simulate: KV tokens per replica instead of the estimate."),
    click.option("--duration", "sim_duration_s", type=click.FloatRange(min=10), default=DEFAULT_PLAN_DURATION_S,
                 show_default=True, help="With --simulate: simulated seconds of each run."),
    click.option("--seed", "sim_seed", type=int, default=0, show_default=True, help="With --simulate."),
    click.option("--workers", "sim_workers", type=click.IntRange(min=1), default=2, show_default=True,
                 help="With --simulate: processes."),
    click.option("--out", "sim_out", type=click.Path(file_okay=False, path_type=Path), default=Path("out/plan"),
                 show_default=True, help="With --simulate: where plan.json and plan.png go."),
)  # fmt: skip

SIMULATE_ONLY = ("sim_workload", "sim_in_flight", "sim_target", "sim_kv_capacity_tokens")
"""Options that mean nothing without ``--simulate`` (an error if given alone)."""


def plan_simulate_options(command: _F) -> _F:
    """Add ``--simulate`` and its options to ``rolloutpool plan``."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def wants_simulation(ctx: click.Context) -> bool:
    """Whether ``plan`` was given ``--simulate``; ``click.UsageError`` for a simulation option without it."""
    if ctx.params.get("simulate"):
        return True
    for param in ctx.command.params:
        if param.name in SIMULATE_ONLY and ctx.params.get(param.name) is not None:
            flag = param.opts[0] if isinstance(param, click.Option) else param.name
            raise click.UsageError(f"{flag} needs --simulate")
    return False
