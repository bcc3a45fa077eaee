"""``rolloutpool simulate``: a fleet in virtual time under every placement policy, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from rolloutpool.sim.simulate_run import DEFAULT_DURATION_S, replica_options

if TYPE_CHECKING:
    from rolloutpool.sim.results import RunResult
    from rolloutpool.sim.runner import Job

__all__ = ["simulate"]

_console = Console()


def _compiled_note() -> str:
    """The banner's note of what runs: the compiled engine (the README's set-up builds it) or pure Python."""
    from rolloutpool.native import state  # noqa: PLC0415

    now = state()
    if now == "compiled":
        return " (engine compiled with mypyc)"
    if now == "stale":
        return (
            " (pure Python: the compiled engine is older than its sources; `python -m rolloutpool.sim.compiled ensure`"
            " rebuilds it)"
        )
    return (
        " (pure Python; in a source checkout with the dev extra, `python -m rolloutpool.sim.compiled ensure` compiles"
        " the engine, as `bash .ci/dev setup` does: about 0.44 of the time)"
    )


@click.command()
@click.option("--scenario", "scenario_name", default="agentic-grpo", show_default=True, help="Named workload.")
@click.option(
    "--workload",
    "workload_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Your own workload (YAML: docs/simulate-your-workload.md, examples/workloads/) instead of --scenario.",
)
@click.option("--replicas", type=click.IntRange(min=1, max=256), default=8, show_default=True)
@replica_options
@click.option(
    "--duration", "duration_s", type=click.FloatRange(min=1), default=DEFAULT_DURATION_S, show_default=True,
    help="Simulated seconds of each run (the default's 42 runs of 8 replicas: ~31 s on 2 idle cores compiled, as the "
    "README's set-up leaves it; ~72 s in pure Python: docs/simulator-speed.md).",
)  # fmt: skip
@click.option(
    "--load",
    "loads",
    type=click.FloatRange(min=0.01),
    multiple=True,
    help="In-flight rollouts as a multiple of the fleet's conservative capacity (repeatable). "
    "Default: 0.5, 1, 1.5, 2, 3, 4.",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    help="Policy to run (repeatable). Default: all, rolloutpool-adaptive too; the peers' turn schedulers "
    "(thunderagent, progress-ttl, continuum, continuum-fixed) only when named.",
)
@click.option(
    "--renew-every",
    "renew_every_s",
    type=click.FloatRange(min=0.1),
    default=None,
    help="Our policy renews an idle live session's cached prefix every SECONDS (default: no renewal).",
)
@click.option(
    "--weight-update-every",
    "weight_update_every_s",
    type=click.FloatRange(min=1),
    default=None,
    metavar="SECONDS",
    help="Weight-update scenario: every SECONDS pause the engines (in-flight requests finish), reset every "
    "prefix cache, load for --weight-update-load and resume, as an RL step does (default: no updates).",
)
@click.option("--weight-update-load", "weight_update_load_s", type=click.FloatRange(min=0), default=20.0)
@click.option(
    "--weight-update-unannounced",
    is_flag=True,
    help="Control run: the router, its fast quarantine and the law are not told of the updates.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("out/simulate"))
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option(
    "--trace",
    "trace_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Replay this turn trace (the router's --trace-file) under each policy instead of the scenario.",
)
@click.option(
    "--trace-time-scale",
    type=click.FloatRange(min=0.001),
    default=1.0,
    show_default=True,
    help="Simulated seconds per recorded second (the recording engine-sim's --time-scale).",
)
@click.option(
    "--trace-cap",
    type=click.IntRange(min=1),
    default=None,
    help="Replay with this fixed live-session cap per replica for our policies (e.g. the cap the operator "
    "published for the recorded pool) instead of KV admission.",
)
@click.option(
    "--write-trace",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the first (load, policy) run of the scenario as a turn trace to this file, and stop.",
)
def simulate(
    scenario_name: str,
    workload_file: Path | None,
    replicas: int,
    duration_s: float,
    loads: tuple[float, ...],
    policies: tuple[str, ...],
    renew_every_s: float | None,
    weight_update_every_s: float | None,
    weight_update_load_s: float,
    weight_update_unannounced: bool,
    seed: int,
    workers: int,
    out_dir: Path,
    no_plots: bool,
    trace_file: Path | None,
    trace_time_scale: float,
    trace_cap: int | None,
    write_trace: Path | None,
    **replica: Any,
) -> None:
    """Simulate a fleet in virtual time under every placement policy, side by side."""
    import time  # noqa: PLC0415

    from rolloutpool.routing.policies import POLICIES  # noqa: PLC0415
    from rolloutpool.sim.fleet import ADAPTIVE, FleetConfig  # noqa: PLC0415
    from rolloutpool.sim.hardware import with_hardware  # noqa: PLC0415
    from rolloutpool.sim.peers import PEERS  # noqa: PLC0415
    from rolloutpool.sim.report import (  # noqa: PLC0415
        markdown_from_json,
        results_json,
        results_table,
        write_plots,
    )
    from rolloutpool.sim.runner import fleet_floor, plan_jobs  # noqa: PLC0415
    from rolloutpool.sim.simulate_run import (  # noqa: PLC0415
        DEFAULT_LOADS,
        DEFAULT_POLICIES,
        ratio_lines,
        replica_from_options,
        run_meta,
    )
    from rolloutpool.sim.weights import WeightUpdateConfig, weight_update_lines  # noqa: PLC0415
    from rolloutpool.sim.workload import scenario  # noqa: PLC0415

    known = (*POLICIES, ADAPTIVE, *PEERS)  # the peers' (sim/peers.py) only when asked for: not in the defaults
    unknown = [p for p in policies if p not in known]
    if unknown:
        raise click.UsageError(f"unknown policy {unknown[0]!r}; choose from {', '.join(known)}")
    try:
        if workload_file is not None:
            from rolloutpool.sim.workload_file import load_workload  # noqa: PLC0415

            chosen = load_workload(workload_file)
        else:
            chosen = scenario(scenario_name)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    hardware = replica_from_options(replica, max_model_len=chosen.max_model_len)
    base = FleetConfig(
        scenario=chosen,
        in_flight=1,
        replicas=replicas,
        duration_s=duration_s,
        seed=seed,
        renew_every_s=renew_every_s,
        weight_updates=None
        if weight_update_every_s is None
        else WeightUpdateConfig(
            every_s=weight_update_every_s, load_s=weight_update_load_s, excuse=not weight_update_unannounced
        ),
    )
    base = with_hardware(base, hardware)
    jobs = plan_jobs(base, loads or DEFAULT_LOADS, policies or DEFAULT_POLICIES)
    if trace_file is not None or write_trace is not None:
        from rolloutpool.sim.trace_cli import trace_mode  # noqa: PLC0415

        trace_mode(base=base, jobs=jobs, trace_file=trace_file, write_trace=write_trace, time_scale=trace_time_scale,
                   cap=trace_cap, out_dir=out_dir, console=_console)  # fmt: skip
        return
    _console.print(
        f"{chosen.name}: {replicas} x {hardware.label} ({hardware.kv_capacity_tokens:,} KV tokens each, "
        f"prefill cost x{hardware.cost.prefill_cost_scale:g}), "
        f"fleet conservative capacity {fleet_floor(base)} sessions, "
        f"{duration_s / 3600:g} simulated hours, {len(jobs)} runs on {workers} worker(s)" + _compiled_note()
    )
    started = time.perf_counter()
    runs = _run_with_progress(jobs, workers)
    wall = time.perf_counter() - started
    _console.print(results_table(runs, f"{chosen.name}, seed {seed}, {wall:.0f}s wall"))
    for line in [*ratio_lines(runs), *weight_update_lines([(job.load, result) for job, result, _ in runs])]:
        _console.print(line)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"scenario": chosen.name, "replicas": replicas, "hardware": hardware.gpu, "duration_s": duration_s,
            "seed": seed, "wall_s": wall,
            **run_meta(hardware, runs)}  # fmt: skip
    if renew_every_s is not None:
        meta["renew_every_s"] = renew_every_s
    if weight_update_every_s is not None:
        meta["weight_update_every_s"] = weight_update_every_s
        meta["weight_update_announced"] = not weight_update_unannounced
    text = results_json(runs, meta)
    (out_dir / "results.json").write_text(text)
    (out_dir / "results.md").write_text(markdown_from_json(json.loads(text)))
    written = [] if no_plots else write_plots(runs, out_dir)
    _console.print(f"Wrote {out_dir / 'results.json'}, {out_dir / 'results.md'}" + "".join(f", {p}" for p in written))


def _run_with_progress(jobs: list[Job], workers: int) -> list[tuple[Job, RunResult, float]]:
    """Run the simulation jobs on ``workers`` processes with a progress bar and a line per finished run."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from rolloutpool.sim.runner import run_jobs  # noqa: PLC0415

    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=_console,
    ) as progress:  # fmt: skip
        task = progress.add_task("simulating", total=len(jobs))

        def done(job: object, result: object, wall: float) -> None:
            progress.advance(task)
            progress.console.log(
                f"Finished {getattr(result, 'policy', '?')} at load {getattr(job, 'load', '?')}x in {wall:.1f}s"
            )

        return run_jobs(jobs, workers=workers, on_done=done)
