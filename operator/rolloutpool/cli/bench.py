"""The ``rolloutpool bench`` click command (registered on the main group by ``rolloutpool.cli``)."""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from rolloutpool.dev.bench.peers import DEFAULT_ROUTERS, ROUTER_NAMES, uses_vllm_router
from rolloutpool.sim.workload import SCENARIOS, scenario

if TYPE_CHECKING:
    from rolloutpool.dev.bench.config import BenchConfig
    from rolloutpool.dev.bench.sweep import SweepResult

__all__ = ["bench_command"]

_console = Console(width=160)


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through every ProcessSet, which stops its children


@contextlib.contextmanager
def _processes_stopped_on_exit() -> Iterator[None]:
    """SIGTERM as Ctrl-C while a benchmark runs; either, or a failure, ends in one line saying so."""
    from rolloutpool.dev.bench.processes import ReadinessError  # noqa: PLC0415

    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        yield
    except KeyboardInterrupt:
        click.echo("Interrupted; every process the benchmark started was stopped.", err=True)
        sys.exit(130)
    except (ReadinessError, RuntimeError) as err:
        raise click.ClickException(f"{err} (every process the benchmark started was stopped)") from err
    finally:
        signal.signal(signal.SIGTERM, previous)


def _find_vllm_router(name: str) -> str:
    # on PATH, or installed next to this Python (a venv's bin/ when the venv is not activated)
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise click.UsageError(f"{name!r} not found; `pip install vllm-router` or pick --router rolloutpool")
    return found


def _overhead_only(
    chosen: tuple[str, ...], vllm_router_bin: str, *, rounds: int, duration_s: float, out_dir: Path
) -> None:
    from rolloutpool.dev.bench.overhead_only import OverheadOnlyConfig, markdown, run_overhead_only  # noqa: PLC0415

    peer = _find_vllm_router(vllm_router_bin) if any(uses_vllm_router(r) for r in chosen) else None
    config = OverheadOnlyConfig(out_dir=out_dir, vllm_router_bin=peer, rounds=rounds, duration_s=duration_s)
    started = time.monotonic()
    with _processes_stopped_on_exit():
        summary = run_overhead_only(config, lambda m: click.echo(f"[{time.monotonic() - started:6.1f}s] {m}"))
    summary["command"] = shlex.join(["rolloutpool", *sys.argv[1:]])
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    click.echo(markdown(summary))
    click.echo(f"Wrote {out_dir / 'summary.json'} and {out_dir / 'summary.md'}")


def _write_sweep(sweep: SweepResult, command: str, out_dir: Path) -> None:
    from rolloutpool.dev.bench.sweep_report import ratio_markdown, write_sweep_outputs  # noqa: PLC0415

    sweep.command = command
    click.echo("\n".join(ratio_markdown(sweep)))
    paths = write_sweep_outputs(sweep, out_dir)
    leftovers = [pid for p in sweep.points for run in p.result.runs for pid in run.leftover_pids]
    click.echo("Wrote " + ", ".join(map(str, paths)) + (f"; processes left behind: {leftovers}" if leftovers else ""))


def _combine(paths: tuple[Path, ...], out_dir: Path) -> None:
    from rolloutpool.dev.bench.sweep import median_rows  # noqa: PLC0415
    from rolloutpool.dev.bench.sweep_report import median_markdown, write_combined_outputs  # noqa: PLC0415

    runs: list[list[dict[str, Any]]] = []
    points: dict[tuple[str, float], dict[str, Any]] = {}
    commands: list[str] = []
    for path in paths:
        try:
            document = json.loads(path.read_text())
            runs.append(document["ratios"])
            for point in document.get("points") or []:  # what ran (scenario, load, config), not its runs
                key = (point["scenario"], point["load"])
                points.setdefault(key, {"scenario": key[0], "load": key[1], "config": point.get("config")})
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise click.UsageError(f"{path}: not the bench.json of a multi-point run ({err})") from err
        if document.get("command"):
            commands.append(str(document["command"]))
    rows = median_rows(runs)
    click.echo("\n".join(median_markdown(rows)))
    written = write_combined_outputs(
        rows, [str(p) for p in paths], out_dir, points=list(points.values()), commands=commands
    )
    click.echo("Wrote " + ", ".join(map(str, written)))


def _simulate(
    configs: list[tuple[str, float, BenchConfig]], command: str, out_dir: Path, progress: Callable[[str], None]
) -> None:
    """``--simulate``: each point's simulated runs, printed and written to ``out_dir/simulated.md``."""
    from rolloutpool.dev.bench.simulated import simulate_bench, simulated_table  # noqa: PLC0415

    sections = [f"# bench --simulate\n\n```\n{command}\n```"]
    for name, load, config in configs:
        runs, missing = simulate_bench(config, config.routers, progress)
        title = f"## {name} {load:g}x: {config.resolved_in_flight} in flight, seed {config.seed}"
        note = f"\n\nNot modelled by the simulator: {', '.join(missing)}." if missing else ""
        table = simulated_table(runs)
        sections.append(f"{title}\n\n{table}{note}")
        click.echo(f"{title}\n{table}{note}")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "simulated.md"
    path.write_text("\n\n".join(sections) + "\n")
    click.echo(f"Wrote {path}")


@click.command("bench")
@click.option(
    "--scenario",
    "scenario_names",
    type=click.Choice(sorted(SCENARIOS)),
    multiple=True,
    help="Workload (repeatable: every scenario at every --load, one report). Default: agentic-grpo.",
)
@click.option(
    "--context-scale",
    type=click.FloatRange(min=0.01, max=1.0),
    default=0.25,
    show_default=True,
    help="Scale of prompt, action and observation lengths (fits small KV pools).",
)
@click.option(
    "--router",
    "routers",
    type=click.Choice(ROUTER_NAMES),
    multiple=True,
    help="Configuration to run (repeatable). Default: " + ", ".join(DEFAULT_ROUTERS) + ".",
)
@click.option("--replicas", type=click.IntRange(min=1, max=16), default=4, show_default=True)
@click.option("--kv-capacity-tokens", type=click.IntRange(min=1024), default=65536, show_default=True)
@click.option("--max-model-len", type=click.IntRange(min=256), default=8192, show_default=True)
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0.1),
    default=4.0,
    show_default=True,
    help="Simulated seconds per wall second of the engines. Too high for the machine and the engines fall behind "
    "(the report's engine lag %, a warning above 5 %): at 10 a 2-core machine's engines lost 11-15 % of the window "
    "at the default load, at 4 1-2 %.",
)
@click.option(
    "--duration",
    "duration_s",
    type=click.FloatRange(min=1),
    default=180.0,
    show_default=True,
    help="Wall seconds of each configuration's measured window (x --time-scale simulated seconds).",
)
@click.option("--in-flight", type=click.IntRange(min=0), default=0, help="Trajectories in flight (0: --load x floor).")
@click.option(
    "--prefill-cost-scale", type=click.FloatRange(min=0.01, max=100.0), default=1.0, show_default=True,
    help="The engine-sims' --prefill-cost-scale: multiply what prefill tokens cost (0.5 halves, 2.0 doubles).",
)  # fmt: skip
@click.option(
    "--kv-events/--no-kv-events", default=True, show_default=True,
    help="The engine-sims publish KV events and our router subscribes, as a RolloutPool deploys them by default "
    "(spec.router.kvEvents); --no-kv-events: our router presumes a prefix it let go is gone (with --simulate too).",
)  # fmt: skip
@click.option(
    "--renew-every", "renew_every_s", type=click.FloatRange(min=0.01), default=None, metavar="SECONDS",
    help="Our router renews the prefixes its turn scheduler keeps every this many engine seconds (router "
    "--renew-every, in wall seconds there); default off, as the router's. --simulate renews the same.",
)  # fmt: skip
@click.option(
    "--group-hint/--no-group-hint", default=False, show_default=True,
    help="The client sends each trajectory's GRPO group in X-Session-Group, our router's group hint (it counts a "
    "group's shared prompt once and co-locates the group); off, as vllm-router's clients send session ids only. "
    "--simulate tells the simulated router the same.",
)  # fmt: skip
@click.option(
    "--load",
    "loads",
    type=click.FloatRange(min=0.01),
    multiple=True,
    help="In-flight trajectories as a multiple of the fleet's conservative capacity (repeatable). Default: 2.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Workload seed (same for every router).")
@click.option("--engine-seed", type=int, default=0, show_default=True)
@click.option(
    "--scrape-interval",
    type=click.FloatRange(min=0.05),
    default=0.5,
    show_default=True,
    help="Wall seconds between metric scrapes (our router; vllm-router's metrics_interval_seconds).",
)
@click.option("--queue-timeout", type=click.FloatRange(min=1), default=600.0, show_default=True)
@click.option("--vllm-router-bin", default="vllm-router", show_default=True)
@click.option("--overhead/--no-overhead", default=True, show_default=True)
@click.option("--overhead-concurrency", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--overhead-rounds", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--overhead-slice", type=click.FloatRange(min=0.2), default=2.0, show_default=True)
@click.option(
    "--overhead-only",
    is_flag=True,
    help="Only the wrk overhead comparison: direct / vllm-router / ours, small and 200 KB bodies, interleaved "
    "rounds (--overhead-rounds), then the added p50 at half vllm-router's saturation rate.",
)
@click.option(
    "--wrk-duration", type=click.FloatRange(min=1), default=8.0, show_default=True, help="Seconds per wrk run."
)
@click.option(
    "--combine",
    "combine",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True,
    help="Run nothing: the medians of earlier multi-point runs' bench.json files (repeatable), written to --out.",
)
@click.option(
    "--simulate",
    is_flag=True,
    help="Run no process: the simulator on the same fleet, workload, window (--duration x --time-scale) and seed, "
    "for each --router it models (sticky least-loaded always, as the baseline), written to --out/simulated.md.",
)
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("out/bench"), show_default=True
)
def bench_command(  # noqa: PLR0917 - click passes every option as a positional parameter
    scenario_names: tuple[str, ...],
    context_scale: float,
    routers: tuple[str, ...],
    replicas: int,
    kv_capacity_tokens: int,
    max_model_len: int,
    time_scale: float,
    duration_s: float,
    in_flight: int,
    prefill_cost_scale: float,
    kv_events: bool,
    renew_every_s: float | None,
    group_hint: bool,
    loads: tuple[float, ...],
    seed: int,
    engine_seed: int,
    scrape_interval: float,
    queue_timeout: float,
    vllm_router_bin: str,
    overhead: bool,
    overhead_concurrency: int,
    overhead_rounds: int,
    overhead_slice: float,
    overhead_only: bool,
    wrk_duration: float,
    combine: tuple[Path, ...],
    simulate: bool,
    out_dir: Path,
) -> None:
    """Real processes on 127.0.0.1: our router against vllm-router, fed the same agentic workload."""
    # imported here, not at module level: every `rolloutpool` command imports this module
    from rolloutpool.dev.bench.config import BenchConfig, scaled_scenario  # noqa: PLC0415
    from rolloutpool.dev.bench.overhead import OverheadConfig  # noqa: PLC0415
    from rolloutpool.dev.bench.report import overhead_table, runs_table, write_outputs  # noqa: PLC0415
    from rolloutpool.dev.bench.runner import run_bench  # noqa: PLC0415
    from rolloutpool.dev.bench.sweep import run_sweep  # noqa: PLC0415

    if combine:
        _combine(combine, out_dir)
        return
    chosen = routers or DEFAULT_ROUTERS
    if overhead_only:
        _overhead_only(chosen, vllm_router_bin, rounds=overhead_rounds, duration_s=wrk_duration, out_dir=out_dir)
        return
    if (kv_capacity_tokens // 16 - 1) * 16 < max_model_len:
        raise click.UsageError("--kv-capacity-tokens must hold at least one --max-model-len context")
    if any(uses_vllm_router(r) for r in chosen) and not simulate:
        vllm_router_bin = _find_vllm_router(vllm_router_bin)
    scenarios = scenario_names or ("agentic-grpo",)
    points = [(name, load) for name in dict.fromkeys(scenarios) for load in dict.fromkeys(loads or (2.0,))]
    if in_flight and len(points) > 1:
        raise click.UsageError("--in-flight fixes one size; with several --scenario/--load give --load instead")
    configs = [
        (
            name,
            load,
            BenchConfig(
                scenario=scaled_scenario(scenario(name), context_scale=context_scale, max_model_len=max_model_len),
                routers=tuple(chosen),
                replicas=replicas,
                kv_capacity_tokens=kv_capacity_tokens,
                time_scale=time_scale,
                duration_s=duration_s,
                in_flight=in_flight,
                load=load,
                seed=seed,
                engine_seed=engine_seed,
                scrape_interval_s=scrape_interval,
                queue_timeout_s=queue_timeout,
                vllm_router_bin=vllm_router_bin,
                out_dir=out_dir,
                context_scale=context_scale,
                prefill_cost_scale=prefill_cost_scale,
                kv_events=kv_events,
                renew_every_s=renew_every_s,
                group_hint=group_hint,
                overhead=OverheadConfig(
                    concurrency=overhead_concurrency, rounds=overhead_rounds, slice_s=overhead_slice
                )
                if overhead
                else None,
            ),
        )
        for name, load in points
    ]
    started = time.monotonic()

    def progress(message: str) -> None:
        click.echo(f"[{time.monotonic() - started:6.1f}s] {message}")

    command = shlex.join(["rolloutpool", *sys.argv[1:]])
    if simulate:
        _simulate(configs, command, out_dir, progress)
        return
    with _processes_stopped_on_exit():
        if len(configs) == 1:
            result = run_bench(configs[0][2], progress)
        else:
            sweep = run_sweep(configs, progress, overhead_from=configs[0][2])
    if len(configs) > 1:
        _write_sweep(sweep, command, out_dir)
        return
    result.config["command"] = command
    _console.print(runs_table(result))
    if result.overhead:
        _console.print(overhead_table(result))
    json_path, md_path = write_outputs(result, out_dir)
    leftovers = [pid for run in result.runs for pid in run.leftover_pids]
    click.echo(f"Wrote {json_path} and {md_path}" + (f"; processes left behind: {leftovers}" if leftovers else ""))
