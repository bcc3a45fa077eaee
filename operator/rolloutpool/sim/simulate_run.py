"""``rolloutpool simulate`` for any workload: the replica options, the defaults, the adaptive policy's ratios.

``rolloutpool.cli`` keeps the command; this module holds what it shares with ``plan --simulate``:
the ``--model/--gpu/--kv-capacity-tokens`` options (the planner's presets, :mod:`rolloutpool.sim.hardware`)
and their checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from rolloutpool.capacity import DTYPE_BYTES, GPU_PRESETS, MODEL_PRESETS
from rolloutpool.engine.model.cost import HARDWARE_PRESETS
from rolloutpool.routing.policies import POLICIES
from rolloutpool.sim.config import ADAPTIVE
from rolloutpool.sim.hardware import DEFAULT_GPU, DEFAULT_MODEL, ReplicaHardware, replica_hardware
from rolloutpool.sim.results import RunResult
from rolloutpool.sim.runner import Job

__all__ = [
    "DEFAULT_DURATION_S",
    "DEFAULT_LOADS",
    "DEFAULT_POLICIES",
    "adaptive_ratios",
    "ratio_lines",
    "replica_from_options",
    "replica_options",
    "run_meta",
]

DEFAULT_LOADS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
"""Offered loads (multiples of the fleet's conservative capacity) a run covers unless told."""
DEFAULT_POLICIES = (*POLICIES, ADAPTIVE)
"""Every peer policy, ours with its default caps, and ours under the operator's adaptive law."""
DEFAULT_DURATION_S = 3600.0
"""Simulated seconds of a default run: 42 runs (6 loads x 7 policies) of 8 replicas take ~140 s of CPU in pure Python,
~60 s compiled (:mod:`rolloutpool.sim.compiled`, which the README's set-up builds)."""

_F = TypeVar("_F", bound=Callable[..., Any])
_ADAPTIVE_PEERS = ("sticky-least-loaded", "rolloutpool", "consistent-hash")

_OPTIONS = (
    click.option(
        "--model", type=click.Choice(sorted(MODEL_PRESETS)), default=None,
        help=f"Model preset, as `plan` (default {DEFAULT_MODEL}): KV bytes per token and weights.",
    ),
    click.option(
        "--gpu", type=click.Choice(sorted(GPU_PRESETS)), default=None,
        help=f"GPU preset, as `plan` (default {DEFAULT_GPU}): memory, and the engine preset's HBM bandwidth and "
        "prefill rate (scaled to the model's weights and the GPUs per replica).",
    ),
    click.option(
        "--hardware", type=click.Choice(sorted(HARDWARE_PRESETS)), default=None,
        help="Alias of --gpu (the engine-sim preset of that name is qwen3-8b on one such GPU).",
    ),
    click.option("--gpus-per-replica", type=click.IntRange(min=1, max=16), default=1, show_default=True,
                 help="Tensor parallelism: memory, bandwidth and prefill scale with it (no communication cost)."),
    click.option("--gpu-memory-utilization", type=click.FloatRange(min=0.05, max=0.99), default=None,
                 help="As vLLM's flag (default 0.9)."),
    click.option("--kv-dtype", type=click.Choice(sorted(DTYPE_BYTES)), default="bfloat16", show_default=True),
    click.option("--kv-capacity-tokens", type=click.IntRange(min=16), default=None,
                 help="KV tokens per replica, instead of the estimate from the presets."),
    click.option("--prefill-cost-scale", type=click.FloatRange(min=0.01, max=100.0), default=1.0, show_default=True,
                 help="Multiply what prefill tokens cost in the step-time model (0.5 halves, 2.0 doubles): "
                 "report every headline figure at 0.5, 1 and 2 (docs/cost-model.md)."),
)  # fmt: skip


def replica_options(command: _F) -> _F:
    """Add the replica options (``--model --gpu --hardware --gpus-per-replica --gpu-memory-utilization
    --kv-dtype --kv-capacity-tokens --prefill-cost-scale``) to a click command; read them back with
    :func:`replica_from_options`."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def replica_from_options(options: Mapping[str, Any], *, max_model_len: int) -> ReplicaHardware:
    """The replica the options describe; ``click.UsageError`` on a conflict or an impossible replica."""
    gpu, alias = options.get("gpu"), options.get("hardware")
    if gpu is not None and alias is not None and gpu != alias:
        raise click.UsageError(f"--hardware is an alias of --gpu: give one (got --gpu {gpu}, --hardware {alias})")
    utilization = options.get("gpu_memory_utilization")
    if options.get("kv_capacity_tokens") is not None and utilization is not None:
        raise click.UsageError("--gpu-memory-utilization only sizes the estimate: give it or --kv-capacity-tokens")
    try:
        return replica_hardware(
            model=options.get("model") or DEFAULT_MODEL,
            gpu=gpu or alias or DEFAULT_GPU,
            max_model_len=max_model_len,
            gpus_per_replica=int(options.get("gpus_per_replica") or 1),
            gpu_memory_utilization=0.9 if utilization is None else float(utilization),
            kv_dtype=str(options.get("kv_dtype") or "bfloat16"),
            kv_capacity_tokens=options.get("kv_capacity_tokens"),
            prefill_cost_scale=float(options.get("prefill_cost_scale") or 1.0),
        )
    except ValueError as err:
        raise click.UsageError(str(err)) from err


def adaptive_ratios(runs: list[tuple[Job, RunResult, float]]) -> dict[float, dict[str, float]]:
    """Throughput of the adaptive policy over each peer that ran, per load."""
    from rolloutpool.sim.report import ratios  # noqa: PLC0415 - matplotlib only when a run has finished

    return ratios(runs, ours=ADAPTIVE, peers=_ADAPTIVE_PEERS)


def ratio_lines(runs: list[tuple[Job, RunResult, float]]) -> list[str]:
    """Ours over the peers, then the adaptive policy over the peers, one line per load."""
    from rolloutpool.sim.report import ratios  # noqa: PLC0415 - matplotlib only when a run has finished

    lines = [
        f"load {load:g}x: ours / " + ", ".join(f"{p} {v:.3f}" for p, v in r.items()) for load, r in ratios(runs).items()
    ]
    lines += [
        f"load {load:g}x: {ADAPTIVE} / " + ", ".join(f"{p} {v:.3f}" for p, v in r.items())
        for load, r in adaptive_ratios(runs).items()
    ]
    return lines


def run_meta(replica: ReplicaHardware, runs: list[tuple[Job, RunResult, float]]) -> dict[str, Any]:
    """What ``results.json`` records of the replica and of the adaptive policy's ratios."""
    return {"replica": replica.describe(), "adaptive_ratios": {str(k): v for k, v in adaptive_ratios(runs).items()}}
