"""The ``rolloutpool`` command."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import click
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from rolloutpool.api import RolloutPool
from rolloutpool.api.crd import render_crd
from rolloutpool.capacity import GPU_PRESETS, MODEL_PRESETS
from rolloutpool.cli.bench import bench_command
from rolloutpool.cli.kubelet import kubelet_command
from rolloutpool.cli.operator import operator_command
from rolloutpool.cli.sim_sweeps import caps_command, compare_command
from rolloutpool.planner import PlanInputs, plan_rows
from rolloutpool.sim.plan_sim_options import plan_simulate_options, wants_simulation
from rolloutpool.sim.simulate_run import DEFAULT_DURATION_S, replica_options

__all__ = ["main"]

_console = Console()
_DEFAULT_CLUSTER_DIR = Path.home() / ".cache" / "rolloutpool" / "clusters" / "default"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rolloutpool")
def main() -> None:
    """RolloutPool: operator, session router and simulator for vLLM rollout fleets."""


@main.command()
@click.option("--model", type=click.Choice(sorted(MODEL_PRESETS)), default="qwen3-8b", show_default=True)
@click.option("--gpu", type=click.Choice(sorted(GPU_PRESETS)), default="h100-80gb", show_default=True)
@click.option("--max-model-len", type=click.IntRange(min=128), default=32768, show_default=True)
@click.option(
    "--residency",
    "residencies",
    type=click.FloatRange(min=0.01, max=1.0),
    multiple=True,
    help="Expected mean residency (repeatable). Default: 1.0, 0.75, 0.5, 0.25.",
)
@click.option("--headroom", type=click.FloatRange(min=0.0, max=0.9), default=0.1, show_default=True)
@click.option("--gpu-memory-utilization", type=click.FloatRange(min=0.05, max=0.99), default=0.9, show_default=True)
@click.option("--gpus-per-replica", type=click.IntRange(min=1, max=16), default=1, show_default=True)
@click.option("--kv-dtype", type=click.Choice(["bfloat16", "float16", "float32", "fp8"]), default="bfloat16")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--max-sessions-per-replica", type=click.IntRange(min=1), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@plan_simulate_options
def plan(
    model: str,
    gpu: str,
    max_model_len: int,
    residencies: tuple[float, ...],
    headroom: float,
    gpu_memory_utilization: float,
    gpus_per_replica: int,
    kv_dtype: str,
    replicas: int,
    max_sessions_per_replica: int | None,
    as_json: bool,
    **simulate: Any,
) -> None:
    """Plan KV capacity and per-replica session caps before writing a manifest (--simulate: measure them)."""
    if wants_simulation(click.get_current_context()):
        from rolloutpool.sim.plan_sim import plan_simulate  # noqa: PLC0415 - the simulator only when asked

        plan_simulate(click.get_current_context())
        return
    inputs = PlanInputs(
        model=model,
        gpu=gpu,
        max_model_len=max_model_len,
        residencies=residencies or (1.0, 0.75, 0.5, 0.25),
        headroom=headroom,
        gpu_memory_utilization=gpu_memory_utilization,
        num_gpus=gpus_per_replica,
        kv_dtype=kv_dtype,
        replicas=replicas,
        ceiling=max_sessions_per_replica,
    )
    try:
        rows = plan_rows(inputs)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    if as_json:
        click.echo(json.dumps({"inputs": asdict(inputs), "rows": [asdict(r) for r in rows]}, indent=2))
        return
    first = rows[0]
    title = (
        f"{model} on {gpus_per_replica}x {gpu}, maxModelLen {max_model_len}, "
        f"util {gpu_memory_utilization}, headroom {headroom}"
    )
    table = Table(title=title)
    for name in ("residency", "KV/token", "KV tokens", "KV GiB", "floor", "cap", f"fleet cap x{replicas}"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(
            f"{row.residency:.2f}",
            f"{row.kv_bytes_per_token // 1024} KiB",
            f"{row.kv_capacity_tokens:,}",
            f"{row.kv_capacity_gib:.1f}",
            str(row.floor),
            str(row.cap),
            str(row.fleet_sessions),
        )
    _console.print(table)
    _console.print(
        f"floor = capacity // maxModelLen: {first.floor} live sessions fit even at full context; "
        "cap = capacity / (maxModelLen x residency) x (1 - headroom) oversubscribes on purpose."
    )


@main.command()
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None)
def crd(output: Path | None) -> None:
    """Print (or write) the RolloutPool CRD generated from the API models."""
    text = render_crd()
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)
        click.echo(f"Wrote {output}")


@main.command()
@click.argument("manifest", type=click.File("r"))
def validate(manifest: TextIO) -> None:
    """Check RolloutPool manifests (YAML, several documents allowed) against the API models."""
    failed = False
    for doc in yaml.safe_load_all(manifest):
        if not doc:
            continue
        name = (doc.get("metadata") or {}).get("name", "<unnamed>") if isinstance(doc, dict) else "<not a map>"
        try:
            RolloutPool.model_validate(doc)
        except ValidationError as err:
            failed = True
            click.echo(f"{name}: invalid", err=True)
            for problem in err.errors():
                where = ".".join(str(p) for p in problem["loc"])
                click.echo(f"  {where}: {problem['msg']}", err=True)
        else:
            click.echo(f"{name}: valid")
    if failed:
        sys.exit(1)


@main.command("engine-sim")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8000, show_default=True)
@click.option("--model", default="Qwen/Qwen3-8B", show_default=True, help="Served model name.")
@click.option("--max-model-len", type=click.IntRange(min=16), default=32768, show_default=True)
@click.option("--hardware", type=click.Choice(["h100-80gb", "h200-141gb"]), default="h100-80gb", show_default=True)
@click.option("--num-gpu-blocks", type=click.IntRange(min=2), default=None, help="KV pool size (default: preset's).")
@click.option("--kv-capacity-tokens", type=click.IntRange(min=32), default=None, help="KV pool size in tokens.")
@click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True, help="Tokens per KV block.")
@click.option(
    "--enable-prefix-caching/--no-enable-prefix-caching", default=True, show_default=True, help="As vLLM's flag."
)
@click.option(
    "--enable-prompt-tokens-details/--no-enable-prompt-tokens-details",
    default=True,
    show_default=True,
    help="Report usage.prompt_tokens_details (vLLM's default is off; the simulator's on).",
)
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=8192, show_default=True)
@click.option("--time-scale", type=click.FloatRange(min=0.001), default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--fault-latency-ms", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--fault-error-rate", type=click.FloatRange(min=0, max=1), default=0.0, show_default=True)
@click.option("--fault-hang-rate", type=click.FloatRange(min=0, max=1), default=0.0, show_default=True)
def engine_sim(
    host: str,
    port: int,
    model: str,
    max_model_len: int,
    hardware: str,
    num_gpu_blocks: int | None,
    kv_capacity_tokens: int | None,
    block_size: int,
    enable_prefix_caching: bool,
    enable_prompt_tokens_details: bool,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    time_scale: float,
    seed: int,
    fault_latency_ms: float,
    fault_error_rate: float,
    fault_hang_rate: float,
) -> None:
    """Serve a vLLM-compatible engine simulator (KV cache, scheduler, /metrics) on the CPU."""
    from rolloutpool.engine.server.app import ServerConfig, run_server  # noqa: PLC0415

    if kv_capacity_tokens is not None:
        if num_gpu_blocks is not None:
            raise click.UsageError("give --num-gpu-blocks or --kv-capacity-tokens, not both")
        num_gpu_blocks = kv_capacity_tokens // block_size
    try:
        config = ServerConfig(
            host=host,
            port=port,
            model=model,
            max_model_len=max_model_len,
            hardware=hardware,
            num_gpu_blocks=num_gpu_blocks,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            prompt_tokens_details=enable_prompt_tokens_details,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            time_scale=time_scale,
            seed=seed,
            added_latency_ms=fault_latency_ms,
            error_rate=fault_error_rate,
            hang_rate=fault_hang_rate,
        )
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    run_server(config)


@main.command(
    "router",
    # vllm-router's flags (--worker-urls URL..., --policy, ...) arrive as extra arguments: router/compat.py
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    epilog="vllm-router's flags are accepted too (--worker-urls URL..., --policy, --request-id-headers, ...): "
    "see docs/migrating-from-vllm-router.md.",
)
@click.pass_context
@click.option("--replica", "replicas", multiple=True, help="name=url of an engine (repeatable).")
@click.option("--discover-namespace", default=None, help="Discover replicas from the pods of this namespace.")
@click.option(
    "--discover-selector", default=None, help="Label selector of the engine pods (with --discover-namespace)."
)
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, help="Default: in-cluster config.")
@click.option(
    "--pool", default=None, help="RolloutPool (in --discover-namespace) whose status caps and quarantine apply."
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("--cap", type=click.IntRange(min=0), default=None, help="Fixed live-session cap per replica.")
@click.option("--max-model-len", type=click.IntRange(min=1), default=None, help="Derive caps from KV capacity.")
@click.option("--residency", type=click.FloatRange(0.01, 1.0), default=0.5, show_default=True)
@click.option("--headroom", type=click.FloatRange(0.0, 0.9), default=0.1, show_default=True)
@click.option("--cap-ceiling", type=click.IntRange(min=0), default=None)
@click.option("--idle-timeout", type=click.FloatRange(min=0.1), default=1800.0, show_default=True)
@click.option("--queue-max", type=click.IntRange(min=0), default=1024, show_default=True)
@click.option("--queue-timeout", type=click.FloatRange(min=0.01), default=30.0, show_default=True)
@click.option("--scrape-interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True)
@click.option("--upstream-timeout", type=click.FloatRange(min=0.1), default=600.0, show_default=True)
@click.option(
    "--renew-every",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Prefix renewal: re-send the last context of a session idle this long with max_tokens=1 so the engine "
    "keeps its prefix cached. Off by default: each renewal re-sends a whole prompt, which costs the engine's "
    "API server tokenization CPU.",
)
@click.option("--admin-token-file", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--state-path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option(
    "--session-body-field",
    "session_body_fields",
    multiple=True,
    help="Body field (dotted) read for the session key when no header carries it, in order (repeatable). "
    "Default: session_params.session_id, session_id, user.",
)
# -- one of N routers (cli/router_fleet.py) --
@click.option("--self-name", default=None, help="Fleet: this router's pod name (with --peer-selector).")
@click.option("--peer-selector", default=None, help="Fleet: label selector of the router pods (Kubernetes).")
@click.option("--self-url", default=None, help="Static fleet: this router's base URL (with --peer-urls).")
@click.option("--peer-urls", multiple=True, help="Static fleet: every router's base URL (comma-separated or repeated).")
def router_command(
    ctx: click.Context,
    replicas: tuple[str, ...],
    discover_namespace: str | None,
    discover_selector: str | None,
    kubeconfig: str | None,
    pool: str | None,
    host: str,
    port: int,
    cap: int | None,
    max_model_len: int | None,
    residency: float,
    headroom: float,
    cap_ceiling: int | None,
    idle_timeout: float,
    queue_max: int,
    queue_timeout: float,
    scrape_interval: float,
    upstream_timeout: float,
    renew_every: float | None,
    admin_token_file: Path | None,
    state_path: Path | None,
    session_body_fields: tuple[str, ...],
    self_name: str | None,
    peer_selector: str | None,
    self_url: str | None,
    peer_urls: tuple[str, ...],
) -> None:
    """Serve the session router (placement, caps, quarantine, release, admission) in front of engines."""
    import logging  # noqa: PLC0415

    from rolloutpool.router import ReplicaSpec, RouterConfig, parse_replica, run_router  # noqa: PLC0415
    from rolloutpool.router.compat import CompatError, replica_name, translate  # noqa: PLC0415
    from rolloutpool.routing.sessionkey import DEFAULT_BODY_FIELDS  # noqa: PLC0415

    try:
        compat = translate(list(ctx.args))
    except CompatError as err:
        raise click.UsageError(str(err)) from err
    level = getattr(logging, (compat.log_level or "info").upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for flag, reason in compat.accepted:
        logging.getLogger("rolloutpool.router.compat").info("Ignored vllm-router flag flag=%s reason=%s", flag, reason)
    if bool(replicas or compat.worker_urls) == bool(discover_namespace):
        raise click.UsageError(
            "give --replica or --worker-urls (static) or --discover-namespace/--discover-selector, not both"
        )
    try:
        specs = tuple(parse_replica(r) for r in replicas)
        specs += tuple(ReplicaSpec(name=replica_name(url), url=url) for url in compat.worker_urls)
        settings: dict[str, Any] = {
            "replicas": specs,
            "discovery": discover_namespace is not None,
            "host": host,
            "port": port,
            "cap": cap,
            "max_model_len": max_model_len,
            "expected_residency": residency,
            "headroom": headroom,
            "cap_ceiling": cap_ceiling,
            "idle_timeout_s": idle_timeout,
            "queue_max": queue_max,
            "queue_timeout_s": queue_timeout,
            "scrape_interval_s": scrape_interval,
            "upstream_timeout_s": upstream_timeout,
            "renew_every_s": renew_every,
            "state_path": state_path,
            "admin_token": admin_token_file.read_text().strip() if admin_token_file else None,
            "session_body_fields": session_body_fields or DEFAULT_BODY_FIELDS,
        }
        settings.update(compat.overrides)  # a vllm-router flag wins over our default
        config = RouterConfig(**settings)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    if self_url or peer_urls or self_name or peer_selector:
        from rolloutpool.cli.router_fleet import run_fleet_member  # noqa: PLC0415

        run_fleet_member(
            config,
            self_name=self_name,
            peer_selector=peer_selector,
            self_url=self_url,
            peer_urls=peer_urls,
            kubeconfig=kubeconfig,
            namespace=discover_namespace,
            selector=discover_selector,
            pool=pool,
        )
        return
    if discover_namespace is None:
        if pool is not None:
            raise click.UsageError("--pool needs --discover-namespace")
        run_router(config)
        return
    from rolloutpool.kube.pods import PodWatch, api_client  # noqa: PLC0415
    from rolloutpool.kube.pools import PoolWatch  # noqa: PLC0415

    api = api_client(kubeconfig)
    pods = PodWatch(api, namespace=discover_namespace, selector=discover_selector or "")
    limits = PoolWatch(api, namespace=discover_namespace, name=pool).events if pool else None
    run_router(config, discovery=pods.events, limits=limits)


@main.command()
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
    help="Simulated seconds of each run (the default's 42 runs of 8 replicas: 410 s of CPU, ~3.5 min on 2 cores).",
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
    "--policy", "policies", multiple=True, help="Policy to run (repeatable). Default: all, rolloutpool-adaptive too."
)
@click.option("--residency", type=click.FloatRange(min=0.01, max=1.0), default=0.5, show_default=True)
@click.option("--headroom", type=click.FloatRange(min=0.0, max=0.9), default=0.1, show_default=True)
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
def simulate(
    scenario_name: str,
    workload_file: Path | None,
    replicas: int,
    duration_s: float,
    loads: tuple[float, ...],
    policies: tuple[str, ...],
    residency: float,
    headroom: float,
    renew_every_s: float | None,
    weight_update_every_s: float | None,
    weight_update_load_s: float,
    weight_update_unannounced: bool,
    seed: int,
    workers: int,
    out_dir: Path,
    no_plots: bool,
    **replica: Any,
) -> None:
    """Simulate a fleet in virtual time under every placement policy, side by side."""
    import time  # noqa: PLC0415

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from rolloutpool.routing.policies import POLICIES  # noqa: PLC0415
    from rolloutpool.sim.fleet import ADAPTIVE, FleetConfig  # noqa: PLC0415
    from rolloutpool.sim.hardware import with_hardware  # noqa: PLC0415
    from rolloutpool.sim.report import (  # noqa: PLC0415
        markdown_from_json,
        results_json,
        results_table,
        write_plots,
    )
    from rolloutpool.sim.runner import fleet_floor, plan_jobs, run_jobs  # noqa: PLC0415
    from rolloutpool.sim.simulate_run import (  # noqa: PLC0415
        DEFAULT_LOADS,
        DEFAULT_POLICIES,
        ratio_lines,
        replica_from_options,
        run_meta,
    )
    from rolloutpool.sim.weights import WeightUpdateConfig, weight_update_lines  # noqa: PLC0415
    from rolloutpool.sim.workload import scenario  # noqa: PLC0415

    known = (*POLICIES, ADAPTIVE)
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
        expected_residency=residency,
        headroom=headroom,
        renew_every_s=renew_every_s,
        weight_updates=None
        if weight_update_every_s is None
        else WeightUpdateConfig(
            every_s=weight_update_every_s, load_s=weight_update_load_s, excuse=not weight_update_unannounced
        ),
    )
    base = with_hardware(base, hardware)
    jobs = plan_jobs(base, loads or DEFAULT_LOADS, policies or DEFAULT_POLICIES)
    _console.print(
        f"{chosen.name}: {replicas} x {hardware.label} ({hardware.kv_capacity_tokens:,} KV tokens each), "
        f"fleet conservative capacity {fleet_floor(base)} sessions, "
        f"{duration_s / 3600:g} simulated hours, {len(jobs)} runs on {workers} worker(s)"
    )
    started = time.perf_counter()
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

        runs = run_jobs(jobs, workers=workers, on_done=done)
    wall = time.perf_counter() - started
    _console.print(results_table(runs, f"{chosen.name}, seed {seed}, {wall:.0f}s wall"))
    for line in [*ratio_lines(runs), *weight_update_lines([(job.load, result) for job, result, _ in runs])]:
        _console.print(line)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"scenario": chosen.name, "replicas": replicas, "hardware": hardware.gpu, "duration_s": duration_s,
            "seed": seed, "residency": residency, "headroom": headroom, "wall_s": wall,
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


main.add_command(bench_command)
main.add_command(caps_command)
main.add_command(compare_command)
main.add_command(operator_command)


@main.group()
def localcluster() -> None:
    """A real Kubernetes control plane (etcd, kube-apiserver, controller-manager) on loopback."""


_dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=_DEFAULT_CLUSTER_DIR,
    show_default=True,
    help="Where the cluster keeps its state, certificates and logs.",
)


@localcluster.command("up")
@_dir_option
@click.option("--kubelet", is_flag=True, help="Also run the process kubelet (pods of our image run as processes).")
def localcluster_up(directory: Path, kubelet: bool) -> None:
    """Build (once) and start the control plane in the background."""
    from rolloutpool.dev.localcluster.cluster import LocalCluster  # noqa: PLC0415 - keep `plan` fast

    cluster = LocalCluster(directory, detach=True, log=_console.log, kubelet=kubelet).start()
    click.echo(f"export KUBECONFIG={cluster.kubeconfig}")
    click.echo(f"export PATH={cluster.binaries.kubectl.parent}:$PATH")


localcluster.add_command(kubelet_command)


@localcluster.command("down")
@_dir_option
def localcluster_down(directory: Path) -> None:
    """Stop a control plane started with `up`."""
    from rolloutpool.dev.localcluster.cluster import stop_recorded  # noqa: PLC0415

    stopped = stop_recorded(directory)
    click.echo(f"Stopped {', '.join(stopped)}" if stopped else f"No running cluster recorded in {directory}")


@localcluster.command("env")
@_dir_option
def localcluster_env(directory: Path) -> None:
    """Print shell exports for kubectl and helm against the running control plane."""
    from rolloutpool.dev.localcluster.build import cache_root  # noqa: PLC0415

    if not (directory / "pids.json").exists():
        raise click.ClickException(f"no running cluster in {directory}; run `rolloutpool localcluster up`")
    click.echo(f"export KUBECONFIG={directory / 'kubeconfig'}")
    click.echo(f"export PATH={cache_root() / 'bin'}:$PATH")


@main.command()
@_dir_option
@click.option("--once", is_flag=True, help="Exit once the quarantine has cleared instead of waiting for Ctrl-C.")
@click.option("--in-flight", type=click.IntRange(min=1), default=48, show_default=True, help="Concurrent rollouts.")
@click.option("--load-seconds", type=click.FloatRange(min=5), default=90, show_default=True, help="Length of the load.")
def demo(directory: Path, once: bool, in_flight: int, load_seconds: float) -> None:
    """Run the whole stack locally (chart, operator, simulated pool, load) through a quarantine and its release."""
    from rolloutpool.dev.demo import run_demo  # noqa: PLC0415

    run_demo(directory=directory, once=once, console=_console, in_flight=in_flight, load_seconds=load_seconds)


if __name__ == "__main__":  # pragma: no cover
    main()
