"""``rolloutpool simulate --trace FILE`` and ``--write-trace FILE``: the I/O around :mod:`rolloutpool.sim.trace_replay`.

``--trace`` replays a recorded trace (the router's ``--trace-file``, or a synthetic one) under
each asked policy on the trace's own fleet (``--replicas`` overrides it) and writes
``OUT/trace-replay.json``: per policy, the replay's cached tokens per turn index against the
recorded ones. ``--write-trace`` runs the first (load, policy) job of the scenario or workload
file with the simulator's recorder on and writes its turns as a trace.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from rolloutpool.engine.model.cost import hardware_preset
from rolloutpool.routing.trace import TraceError, encode_line
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.runner import Job
from rolloutpool.sim.trace_feed import TraceSource
from rolloutpool.sim.trace_replay import compare, replay, replay_config, synthesize

__all__ = ["comparison_table", "replay_trace_file", "trace_mode", "write_trace_file"]


def replay_trace_file(
    path: Path,
    *,
    base: FleetConfig,
    policies: Sequence[str],
    time_scale: float = 1.0,
    replicas: int | None = None,
) -> list[dict[str, Any]]:
    """Replay the trace at ``path`` under each policy; the comparisons (raises ``click.UsageError`` on a bad trace)."""
    try:
        with path.open() as lines:
            trace, _ = TraceSource.read(lines, time_scale=time_scale)
        config = replay_config(trace, base=base, time_scale=time_scale, replicas=replicas)
    except OSError as err:
        raise click.UsageError(f"--trace {path}: {err.strerror}") from err
    except (TraceError, ValueError) as err:
        raise click.UsageError(f"--trace {path}: {err}") from err
    return [compare(replay(trace, config, policy, time_scale=time_scale)) for policy in policies]


def write_trace_file(path: Path, config: FleetConfig, policy: str) -> tuple[int, int]:
    """Simulate ``config`` under ``policy`` and write its trace; returns (turns, bytes)."""
    if config.num_gpu_blocks is None:  # the replica lines say the KV capacity the trace ran on
        blocks = hardware_preset(config.hardware).num_gpu_blocks
        config = replace(config, num_gpu_blocks=blocks)
    _, lines = synthesize(config, policy)
    data = b"".join(encode_line(line) for line in lines)
    path.write_bytes(data)
    return sum(line["kind"] == "turn" for line in lines), len(data)


def comparison_table(comparisons: list[dict[str, Any]], title: str) -> Table:
    """Cached tokens per turn index, recorded vs replayed, one block of rows per policy."""
    table = Table(title=title)
    for column in ("policy", "turn", "turns", "recorded cached", "replayed cached", "total err", "median |err|/prompt"):
        table.add_column(column, justify="left" if column in {"policy", "turn"} else "right")
    for c in comparisons:
        for bucket, row in [*c["by_turn"].items(), ("all", c["total"])]:
            err, med = row["total_error"], row["median_abs_error_of_prompt"]
            table.add_row(
                c["policy"],
                bucket,
                str(row["turns"]),
                f"{row['recorded_cached']:,}",
                f"{row['replayed_cached']:,}",
                "-" if err is None else f"{err:+.1%}",
                "-" if med is None else f"{med:.3f}",
            )
    return table


def trace_mode(
    *,
    base: FleetConfig,
    jobs: list[Job],
    trace_file: Path | None,
    write_trace: Path | None,
    time_scale: float,
    out_dir: Path,
    console: Console,
    cap: int | None = None,
) -> None:
    """What ``simulate`` does with ``--trace`` or ``--write-trace`` (instead of its load sweep).

    A replay runs on the trace's replicas unless ``--replicas`` was given on the command line; ``cap``
    (``--trace-cap``) fixes our policies' per-replica cap, as an operator-published cap does.
    """
    if cap is not None:
        base = replace(base, fixed_cap=cap)
    given = click.get_current_context().get_parameter_source("replicas") != click.core.ParameterSource.DEFAULT
    replicas = base.replicas if given else None
    if trace_file is not None and write_trace is not None:
        raise click.UsageError("give --trace FILE (replay) or --write-trace FILE (record), not both")
    if write_trace is not None:
        job = jobs[0]
        turns, size = write_trace_file(write_trace, job.config, job.policy)
        console.print(
            f"Wrote {write_trace}: {turns} turns of {job.config.scenario.name} under {job.policy} "
            f"at load {job.load:g}x ({job.config.in_flight} in flight, {size:,} bytes)"
        )
        return
    assert trace_file is not None  # noqa: S101 -- one of the two is given
    policies = list(dict.fromkeys(job.policy for job in jobs))
    comparisons = replay_trace_file(trace_file, base=base, policies=policies, time_scale=time_scale, replicas=replicas)
    first = comparisons[0]
    console.print(
        comparison_table(
            comparisons,
            f"{trace_file.name}: {first['sessions']} sessions, {first['in_flight']} in flight, "
            f"{first['replicas']} replicas, time scale {time_scale:g}",
        )
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "trace-replay.json"
    target.write_text(json.dumps({"trace": str(trace_file), "time_scale": time_scale, "runs": comparisons}, indent=2))
    console.print(f"Wrote {target}")
