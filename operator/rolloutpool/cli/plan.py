"""``rolloutpool plan``: KV capacity and per-replica session caps before writing a manifest."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from rolloutpool.capacity import GPU_PRESETS, MODEL_PRESETS
from rolloutpool.cli.plan_simulate_options import plan_simulate_options, wants_simulation
from rolloutpool.planner import PlanInputs, plan_rows

__all__ = ["plan"]

_console = Console()


@click.command()
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
