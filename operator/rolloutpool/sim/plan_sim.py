"""``rolloutpool plan --simulate``: which cap and how many replicas serve a workload file's rollouts.

Reads the ``plan`` command's parameters, checks them (``click.UsageError`` names the option), runs
the fixed-cap grid of :mod:`rolloutpool.sim.plan_choice` per fleet size with the adaptive policy and
sticky least-loaded beside it (:func:`rolloutpool.sim.runner.run_jobs`, in parallel processes, with
progress), prints the table and the recommendation, and writes ``plan.json`` and ``plan.png``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rolloutpool.capacity import conservative_cap
from rolloutpool.sim.config import ADAPTIVE, FleetConfig
from rolloutpool.sim.hardware import ReplicaHardware, replica_hardware, with_hardware
from rolloutpool.sim.plan_choice import FleetPoint, PlanChoice, choose_fleet, coarse_caps, fleet_point, refine_caps
from rolloutpool.sim.results import RunResult
from rolloutpool.sim.runner import Job, run_jobs
from rolloutpool.sim.workload import Scenario
from rolloutpool.sim.workload_file import WorkloadFileError, load_workload

__all__ = ["PlanSimInputs", "plan_simulate", "replica_counts"]

_console = Console()
_UNCAPPED = "sticky-least-loaded"


@dataclass(frozen=True)
class PlanSimInputs:
    """What ``plan --simulate`` runs, checked."""

    workload_file: Path
    workload: Scenario
    hardware: ReplicaHardware
    in_flight: int
    replica_counts: tuple[int, ...]
    target_tokens_per_s: float | None
    knee: float
    cap_points: int
    headroom: float
    duration_s: float
    seed: int
    workers: int
    out_dir: Path
    as_json: bool


def replica_counts(max_replicas: int) -> tuple[int, ...]:
    """1, 2, 4, ... below ``max_replicas``, then ``max_replicas`` (pure)."""
    counts = []
    n = 1
    while n < max_replicas:
        counts.append(n)
        n *= 2
    return (*counts, max_replicas)


def _flag(ctx: click.Context, name: str) -> str:
    for param in ctx.command.params:
        if param.name == name and isinstance(param, click.Option):
            return param.opts[0]
    return name  # pragma: no cover - every name passed here is an option of plan


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in {None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP}


def _inputs(ctx: click.Context) -> PlanSimInputs:
    p = ctx.params
    for name in ("residencies", "max_sessions_per_replica"):
        if _given(ctx, name):
            raise click.UsageError(f"{_flag(ctx, name)} does not apply to --simulate: the simulation measures caps")
    if p["sim_workload"] is None:
        raise click.UsageError("--simulate needs --workload FILE (see examples/workloads/)")
    if p["sim_in_flight"] is None:
        raise click.UsageError("--simulate needs --in-flight N: the rollouts your trainer keeps in flight")
    try:
        workload = load_workload(p["sim_workload"])
    except WorkloadFileError as err:
        raise click.UsageError(str(err)) from err
    if _given(ctx, "max_model_len") and p["max_model_len"] != workload.max_model_len:
        raise click.UsageError(
            f"--max-model-len {p['max_model_len']} differs from the workload's maxModelLen {workload.max_model_len}"
        )
    if p["sim_kv_capacity_tokens"] is not None and _given(ctx, "gpu_memory_utilization"):
        raise click.UsageError("--gpu-memory-utilization only sizes the estimate: give it or --kv-capacity-tokens")
    try:
        hardware = replica_hardware(
            model=p["model"], gpu=p["gpu"], max_model_len=workload.max_model_len,
            gpus_per_replica=p["gpus_per_replica"], gpu_memory_utilization=p["gpu_memory_utilization"],
            kv_dtype=p["kv_dtype"], kv_capacity_tokens=p["sim_kv_capacity_tokens"],
        )  # fmt: skip
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    counts = (p["replicas"],) if _given(ctx, "replicas") else replica_counts(p["sim_max_replicas"])
    return PlanSimInputs(
        workload_file=p["sim_workload"], workload=workload, hardware=hardware, in_flight=p["sim_in_flight"],
        replica_counts=counts, target_tokens_per_s=p["sim_target"], knee=p["sim_knee"],
        cap_points=p["sim_cap_points"], headroom=p["headroom"], duration_s=p["sim_duration_s"], seed=p["sim_seed"],
        workers=p["sim_workers"], out_dir=p["sim_out"], as_json=p["as_json"],
    )  # fmt: skip


def _jobs(inputs: PlanSimInputs, base: FleetConfig, floor: int, caps: dict[int, list[int]]) -> list[Job]:
    jobs = []
    for replicas, fixed in caps.items():
        config = replace(base, replicas=replicas)
        load = inputs.in_flight / (replicas * floor)
        jobs += [Job(load, "rolloutpool", replace(config, fixed_cap=c)) for c in fixed]
    return jobs


def _run(inputs: PlanSimInputs) -> tuple[list[FleetPoint], float]:
    scenario = inputs.workload
    floor = conservative_cap(capacity_tokens=inputs.hardware.kv_capacity_tokens, max_model_len=scenario.max_model_len)
    base = with_hardware(
        FleetConfig(scenario=scenario, in_flight=inputs.in_flight, duration_s=inputs.duration_s, seed=inputs.seed),
        inputs.hardware,
    )  # fmt: skip
    coarse = {
        n: coarse_caps(floor=floor, in_flight=inputs.in_flight, replicas=n, points=inputs.cap_points)
        for n in inputs.replica_counts
    }
    peers = [
        Job(inputs.in_flight / (n * floor), policy, replace(base, replicas=n))
        for n in inputs.replica_counts
        for policy in (ADAPTIVE, _UNCAPPED)
    ]
    fixed: dict[int, dict[int, float]] = {n: {} for n in inputs.replica_counts}
    others: dict[tuple[int, str], RunResult] = {}
    started = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=_console, disable=inputs.as_json,
    ) as progress:  # fmt: skip
        task = progress.add_task("simulating", total=0)

        def done(job: Job, result: RunResult, wall: float) -> None:
            progress.advance(task)
            n, cap = job.config.replicas, job.config.fixed_cap
            if cap is None:
                others[n, job.policy] = result
            else:
                fixed[n][cap] = result.tokens_per_s
            what = job.policy if cap is None else f"cap {cap}"
            if not inputs.as_json:
                progress.console.log(f"Finished {n} replicas {what} tok/s={result.tokens_per_s:,.0f} in {wall:.1f}s")

        first = _jobs(inputs, base, floor, coarse) + peers
        progress.update(task, total=len(first))
        run_jobs(first, workers=inputs.workers, on_done=done)
        fine = _jobs(inputs, base, floor, {n: refine_caps(fixed[n], floor=floor) for n in inputs.replica_counts})
        progress.update(task, total=len(first) + len(fine))
        run_jobs(fine, workers=inputs.workers, on_done=done)
    points = []
    for n in inputs.replica_counts:
        adaptive = others.get((n, ADAPTIVE))
        uncapped = others.get((n, _UNCAPPED))
        points.append(
            fleet_point(
                replicas=n, in_flight=inputs.in_flight, floor=floor, fixed=fixed[n],
                adaptive=None if adaptive is None else (adaptive.tokens_per_s, adaptive.mean_target),
                uncapped=None if uncapped is None else uncapped.tokens_per_s,
            )
        )  # fmt: skip
    return points, time.perf_counter() - started


def _spec(inputs: PlanSimInputs, choice: PlanChoice) -> dict[str, Any]:
    return {"replicas": choice.replicas, "concurrency": {"maxSessionsPerReplica": choice.cap}}


def _ratio(value: float | None, reference: float) -> str:
    return "-" if value is None else f"{value:,.0f} ({value / reference:.3f})" if reference else f"{value:,.0f}"


def _table(inputs: PlanSimInputs, points: list[FleetPoint], wall: float) -> Table:
    table = Table(
        title=f"{inputs.workload.name}: {inputs.in_flight} rollouts in flight, {inputs.hardware.label} "
        f"({inputs.hardware.kv_capacity_tokens:,} KV tokens, floor {points[0].floor}), {inputs.duration_s:g} "
        f"simulated s, {wall:.0f}s wall; adaptive and no cap: tok/s (over the best cap's)"
    )
    for name in ("replicas", "in flight/replica", "best cap", "plateau", "tok/s", "tok/s/replica", "adaptive",
                 "no cap"):  # fmt: skip
        table.add_column(name, justify="right")
    for p in points:
        table.add_row(
            str(p.replicas), f"{p.in_flight / p.replicas:.1f}", str(p.best_cap), str(p.plateau_cap),
            f"{p.tokens_per_s:,.0f}", f"{p.tokens_per_s_per_replica:,.0f}",
            _ratio(p.adaptive_tokens_per_s, p.tokens_per_s), _ratio(p.uncapped_tokens_per_s, p.tokens_per_s),
        )  # fmt: skip
    return table


def _answer(choice: PlanChoice, spec: dict[str, Any], point: FleetPoint) -> list[str]:
    verdict = "reaches" if choice.met else "is the fastest fleet tried, and misses"
    concurrency = spec["concurrency"]
    binding = (
        " The cap does not bind there: every rollout in flight is admitted at once."
        if choice.cap >= math.ceil(point.in_flight / choice.replicas)
        else ""
    )
    lines = [
        f"{choice.replicas} replica(s) with cap {choice.cap} per replica: {choice.tokens_per_s:,.0f} tok/s, which "
        f"{verdict} the target of {choice.target_tokens_per_s:,.0f} tok/s ({choice.target}).{binding}",
        f"In the pool: spec.replicas: {spec['replicas']}, spec.concurrency.maxSessionsPerReplica: "
        f"{concurrency['maxSessionsPerReplica']} (a ceiling over the routers' turn scheduling).",
    ]
    if point.adaptive_tokens_per_s is not None:
        lines.append(
            f"With spec.autoscaling.enabled instead, the adaptive law reached {point.adaptive_tokens_per_s:,.0f} "
            f"tok/s on that fleet ({point.adaptive_tokens_per_s / point.tokens_per_s:.3f} of the best fixed cap)."
        )
    return lines


def plan_simulate(ctx: click.Context) -> None:
    """Run ``plan --simulate`` on the ``plan`` command's parameters."""
    inputs = _inputs(ctx)
    if not inputs.as_json:
        _console.print(
            f"{inputs.workload.name}: fleets of {', '.join(map(str, inputs.replica_counts))} replicas, "
            f"{inputs.cap_points} fixed caps each (+2 refined), the adaptive law and {_UNCAPPED}, "
            f"{inputs.duration_s:g} simulated s per run on {inputs.workers} worker(s)"
        )
    points, wall = _run(inputs)
    choice = choose_fleet(points, target_tokens_per_s=inputs.target_tokens_per_s, knee=inputs.knee)
    spec = _spec(inputs, choice)
    from rolloutpool.sim.plan_sim_report import plan_json, write_plan_plot  # noqa: PLC0415 - matplotlib

    meta = {
        "workload": inputs.workload.name, "workload_file": str(inputs.workload_file),
        "max_model_len": inputs.workload.max_model_len, "in_flight": inputs.in_flight,
        "duration_s": inputs.duration_s, "seed": inputs.seed, "headroom": inputs.headroom, "wall_s": wall,
        "replica": inputs.hardware.describe(),
    }  # fmt: skip
    inputs.out_dir.mkdir(parents=True, exist_ok=True)
    text = plan_json(meta=meta, points=points, choice=choice, spec=spec)
    (inputs.out_dir / "plan.json").write_text(text)
    title = f"{inputs.workload.name}: {inputs.in_flight} rollouts in flight, {inputs.hardware.label}"
    png = write_plan_plot(points, choice, inputs.out_dir / "plan.png", title=title)
    if inputs.as_json:
        click.echo(text)
        return
    _console.print(_table(inputs, points, wall))
    chosen = next(p for p in points if p.replicas == choice.replicas)
    for line in _answer(choice, spec, chosen):
        _console.print(line)
    _console.print(f"Wrote {inputs.out_dir / 'plan.json'}, {png}")
