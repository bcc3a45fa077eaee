"""``rolloutpool simulate-caps``: the hindsight cap sweep against the adaptive control law."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rolloutpool.sim.workload import SCENARIOS

if TYPE_CHECKING:
    from rolloutpool.sim.config import FleetConfig

__all__ = ["caps_command", "compare_command"]

_console = Console()
_DEFAULT_SCENARIOS = ("agentic-grpo", "tool-chat", "high-pressure", "policy-drift")
_PREFILL_SCALE = click.option(
    "--prefill-cost-scale", type=click.FloatRange(min=0.01, max=100.0), default=1.0, show_default=True,
    help="Multiply what prefill tokens cost in the engines' step-time model (0.5 halves, 2.0 doubles).",
)  # fmt: skip


@click.command("simulate-caps")
@click.option("--scenario", "scenarios", type=click.Choice(sorted(SCENARIOS)), multiple=True, help="Default: all.")
@click.option("--load", "loads", type=click.FloatRange(min=0.01), multiple=True, help="Default: 1, 1.5, 2, 3.")
@click.option("--duration", "duration_s", type=click.FloatRange(min=60), default=2400.0, show_default=True)
@click.option(
    "--drift-duration", "drift_duration_s", type=click.FloatRange(min=60), default=5400.0, show_default=True,
    help="Simulated seconds of the policy-drift scenario (its drift runs from minute 15 to 75).",
)  # fmt: skip
@click.option("--step", type=click.IntRange(min=1), default=4, show_default=True, help="Coarse grid step of caps.")
@click.option("--replicas", type=click.IntRange(min=1, max=256), default=4, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("out/caps"))
@click.option("--fresh", is_flag=True, help="Ignore the runs cached in OUT/sweep.json.")
@click.option("--rerun-adaptive", is_flag=True, help="Keep cached fixed-cap runs, rerun the adaptive ones.")
@click.option("--fixed-only", is_flag=True, help="Run only the fixed caps (e.g. while the law is being tuned).")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@_PREFILL_SCALE
def caps_command(  # noqa: PLR0917 - click passes every option as a positional parameter
    scenarios: tuple[str, ...],
    loads: tuple[float, ...],
    duration_s: float,
    drift_duration_s: float,
    step: int,
    replicas: int,
    seed: int,
    workers: int,
    out_dir: Path,
    fresh: bool,
    rerun_adaptive: bool,
    fixed_only: bool,
    no_plots: bool,
    prefill_cost_scale: float,
) -> None:
    """Every fixed cap from the floor up (hindsight) vs the adaptive control law, per scenario and load."""
    from rolloutpool.sim.config import FleetConfig  # noqa: PLC0415
    from rolloutpool.sim.sweep import Point, SweepRun, run_sweep, sweep_points  # noqa: PLC0415
    from rolloutpool.sim.sweep_report import (  # noqa: PLC0415
        load_meta,
        load_runs,
        points_markdown,
        runs_json,
        write_cap_plots,
    )
    from rolloutpool.sim.workload import scenario  # noqa: PLC0415

    names = scenarios or _DEFAULT_SCENARIOS
    base = _with_prefill_scale(
        FleetConfig(scenario=scenario(names[0]), in_flight=1, replicas=replicas, duration_s=duration_s, seed=seed),
        prefill_cost_scale,
    )
    cached_scale = float(load_meta(out_dir / "sweep.json").get("prefill_cost_scale", 1.0))
    if not fresh and cached_scale != prefill_cost_scale:
        raise click.UsageError(
            f"{out_dir / 'sweep.json'} holds runs with prefill cost scale {cached_scale:g}: "
            "give --fresh or another --out"
        )
    cache = {} if fresh else load_runs(out_dir / "sweep.json")
    if rerun_adaptive:
        cache = {k: r for k, r in cache.items() if r.cap is not None}
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)

    def save(runs: dict[str, SweepRun], wall: float) -> list[Point]:
        points = sweep_points(runs)
        meta = {"replicas": replicas, "duration_s": duration_s, "drift_duration_s": drift_duration_s, "step": step,
                "seed": seed, "prefill_cost_scale": prefill_cost_scale, "wall_s": wall}  # fmt: skip
        (out_dir / "sweep.json").write_text(runs_json(runs, points, meta))
        return points

    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=_console,
    ) as progress:  # fmt: skip
        task = progress.add_task("sweeping caps", total=0)

        def planned(count: int) -> None:
            progress.update(task, total=(progress.tasks[0].total or 0) + count)

        def done(job: object, result: object, wall: float) -> None:
            progress.advance(task)
            cap = getattr(getattr(job, "config", None), "fixed_cap", None)
            progress.console.log(
                f"Finished {getattr(result, 'scenario', '?')} load={getattr(job, 'load', '?')}x "
                f"cap={cap if cap is not None else 'adaptive'} tok/s={getattr(result, 'tokens_per_s', 0):,.0f} "
                f"in {wall:.1f}s"
            )

        runs = run_sweep(
            base=base, scenarios=names, loads=loads or (1.0, 1.5, 2.0, 3.0), step=step, workers=workers, cache=cache,
            durations={"policy-drift": drift_duration_s}, on_done=done, on_planned=planned,
            adaptive=not fixed_only, on_saved=lambda done: save(done, time.perf_counter() - started),
        )  # fmt: skip
    points = save(runs, time.perf_counter() - started)
    table = points_markdown(points)
    (out_dir / "sweep.md").write_text(table)
    _console.print(table)
    written = [] if no_plots else write_cap_plots(runs, points, out_dir)
    _console.print(f"Wrote {out_dir / 'sweep.json'}, {out_dir / 'sweep.md'}" + "".join(f", {p}" for p in written))


@click.command("simulate-compare")
@click.option("--scenario", "scenarios", type=click.Choice(sorted(SCENARIOS)), multiple=True)
@click.option(
    "--workload", "workloads", type=click.Path(exists=True, dir_okay=False, path_type=Path), multiple=True,
    help="Your own workload (YAML: docs/simulate-your-workload.md), beside or instead of --scenario.",
)  # fmt: skip
@click.option("--load", "loads", type=click.FloatRange(min=0.01), multiple=True, help="Default: 1, 3.")
@click.option("--seed", "seeds", type=int, multiple=True, help="Default: 0.")
@click.option(
    "--variant", "variants", multiple=True,
    help="Default: all named ones (sticky-least-loaded is always run). Also fixed-cap:N (a fixed session cap, no "
    "turn scheduling), turns:KEY=VALUE:... (the turn scheduler with other targets, e.g. turns:target=0.95), "
    "law:KEY=VALUE:... (under the operator's law with other knobs, e.g. law:maximum=1.0) and the "
    "peers' schedulers thunderagent, progress-ttl, continuum, continuum-fixed (docs/peers.md), and any other "
    "simulate --policy (consistent-hash, clairvoyant, ...); any of them as LABEL+free-restore on engines whose "
    "re-prefill of context computed before is free (free-restore: sticky least-loaded so), or as LABEL+no-groups "
    "with no GRPO group known to the router or named by it (as `router --no-infer-groups`), or as LABEL+known-tools "
    "with our router told each tool call's duration as it starts (a reference: no router knows it), or as "
    "LABEL+renew with our router renewing the prefixes it keeps every 2 s (as `router --renew-every 2`).",
)  # fmt: skip
@click.option("--duration", "duration_s", type=click.FloatRange(min=60), default=1200.0, show_default=True)
@click.option("--replicas", type=click.IntRange(min=1, max=256), default=4, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Markdown.")
@click.option(
    "--json", "json_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Every row as JSON (`rolloutpool.sim.compare.load_rows` reads it back).",
)  # fmt: skip
@_PREFILL_SCALE
@click.option(
    "--group-hint", is_flag=True,
    help="The clients tell the router each rollout's GRPO group (X-Session-Group: its shared prompt is counted once, "
    "the group co-located). Default: session ids only, as vllm-router's clients and `rolloutpool bench`'s send.",
)  # fmt: skip
def compare_command(  # noqa: PLR0917 - click passes every option as a positional parameter
    scenarios: tuple[str, ...],
    workloads: tuple[Path, ...],
    loads: tuple[float, ...],
    seeds: tuple[int, ...],
    variants: tuple[str, ...],
    duration_s: float,
    replicas: int,
    workers: int,
    out_file: Path | None,
    json_file: Path | None,
    prefill_cost_scale: float,
    group_hint: bool,
) -> None:
    """Our router (turn scheduling, under the operator's law, a fixed cap) over sticky least-loaded, side by side."""
    from rolloutpool.sim.compare import (  # noqa: PLC0415
        BASELINE,
        VARIANTS,
        compare_jobs,
        rows_json,
        rows_markdown,
        run_compare,
        variant,
    )
    from rolloutpool.sim.config import FleetConfig  # noqa: PLC0415
    from rolloutpool.sim.workload import Scenario, scenario  # noqa: PLC0415
    from rolloutpool.sim.workload_file import WorkloadFileError, load_workload  # noqa: PLC0415

    chosen_scenarios: list[str | Scenario] = list(scenarios)
    for path in workloads:
        try:
            chosen_scenarios.append(load_workload(path))
        except WorkloadFileError as e:
            raise click.UsageError(str(e)) from None
    if not chosen_scenarios:
        raise click.UsageError("name a --scenario or a --workload file")
    for label in variants:
        try:
            variant(label)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    chosen = [BASELINE, *(v for v in (variants or VARIANTS) if v != BASELINE)]
    first = chosen_scenarios[0]
    base = FleetConfig(
        scenario=scenario(first) if isinstance(first, str) else first,
        in_flight=1,
        replicas=replicas,
        duration_s=duration_s,
        group_hint=group_hint,
    )
    base = _with_prefill_scale(base, prefill_cost_scale)
    jobs = compare_jobs(
        base, scenarios=chosen_scenarios, loads=loads or (1.0, 3.0), seeds=seeds or (0,), variants=chosen
    )
    started = time.perf_counter()

    def done(job: object, result: object, wall: float) -> None:
        _console.log(
            f"Finished {getattr(result, 'scenario', '?')} {getattr(job, 'load', '?')}x "
            f"{getattr(result, 'policy', '?')} in {wall:.1f}s"
        )

    rows = run_compare(jobs, workers=workers, on_done=done)
    table = rows_markdown(rows)
    _console.print(table)
    _console.print(
        f"{replicas} replicas, {duration_s:g} simulated s, prefill cost x{prefill_cost_scale:g}, "
        f"{time.perf_counter() - started:.0f}s wall"
    )
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text(table)
    if json_file is not None:
        json_file.parent.mkdir(parents=True, exist_ok=True)
        meta = {"replicas": replicas, "duration_s": duration_s, "prefill_cost_scale": prefill_cost_scale,
                "group_hint": group_hint, "wall_s": time.perf_counter() - started}  # fmt: skip
        json_file.write_text(rows_json(rows, meta))


def _with_prefill_scale(base: FleetConfig, scale: float) -> FleetConfig:
    """``base`` whose engines run their hardware preset's cost model with prefill ``scale`` times as dear."""
    from dataclasses import replace  # noqa: PLC0415

    from rolloutpool.engine.model.cost import hardware_preset  # noqa: PLC0415

    return replace(base, cost=hardware_preset(base.hardware).cost.with_prefill_cost_scale(scale))
