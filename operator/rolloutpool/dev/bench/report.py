"""Tables, JSON and markdown of a benchmark run."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from rolloutpool.dev.bench.config import BenchResult, RouterRun
from rolloutpool.dev.bench.overhead import OverheadRow

__all__ = ["markdown", "overhead_table", "result_json", "runs_table", "write_outputs"]

_RUN_COLUMNS = (
    "router", "in-flight", "gen tok/s", "completed", "traj/h", "re-prefill tok", "evicted %", "preempt",
    "hit %", "p50 s", "p90 s", "first turn p50 s", "engine lag %", "retries", "errors",
)  # fmt: skip
_OVERHEAD_COLUMNS = ("target", "requests", "req/s", "median ms", "p99 ms", "+median ms", "+p99 ms", "errors")


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _run_cells(run: RouterRun) -> list[str]:
    return [
        run.router,
        str(run.in_flight),
        _fmt(run.tokens_per_s),
        str(run.completed),
        _fmt(run.completed_per_hour),
        _fmt(run.reprefilled_tokens),
        _fmt(run.evicted_pct, 1),
        str(run.preemptions),
        _fmt(run.prefix_hit_ratio * 100, 1),
        _fmt(run.p50_trajectory_s, 1),
        _fmt(run.p90_trajectory_s, 1),
        _fmt(run.first_turn_p50_s, 1),
        _fmt(run.engine_lag_pct, 1),
        str(run.retries),
        str(run.errors),
    ]


def _overhead_cells(row: OverheadRow) -> list[str]:
    return [
        row.target,
        str(row.requests),
        _fmt(row.requests_per_s),
        _fmt(row.median_ms, 2),
        _fmt(row.p99_ms, 2),
        _fmt(row.added_median_ms, 2),
        _fmt(row.added_p99_ms, 2),
        str(row.errors),
    ]


def runs_table(result: BenchResult) -> Table:
    """One row per router configuration (rates and times in simulated seconds)."""
    table = Table(title=_title(result))
    for name in _RUN_COLUMNS:
        table.add_column(name, justify="left" if name == "router" else "right")
    for run in result.runs:
        table.add_row(*_run_cells(run))
    return table


def overhead_table(result: BenchResult) -> Table:
    """Router overhead at saturation (wall milliseconds)."""
    table = Table(title="Router overhead at saturation (closed loop, interleaved, wall ms)")
    for name in _OVERHEAD_COLUMNS:
        table.add_column(name, justify="left" if name == "target" else "right")
    for row in result.overhead:
        table.add_row(*_overhead_cells(row))
    return table


def _title(result: BenchResult) -> str:
    c = result.config
    return (
        f"bench: {c['scenario']} (contexts x{c.get('context_scale', 1)}), {c['replicas']} engine-sim replicas x "
        f"{c['kv_capacity_tokens']:,} KV tokens, maxModelLen {c['max_model_len']}, {c['in_flight']} in flight "
        f"(floor {c['fleet_floor']}), time scale {c['time_scale']:g}, {c['duration_s']:g} s wall each, KV events "
        f"{'on' if c.get('kv_events') else 'off'}"
    )


def result_json(result: BenchResult) -> dict[str, Any]:
    """Everything as plain JSON data."""
    return {
        "config": result.config,
        "runs": [asdict(r) for r in result.runs],
        "overhead": [asdict(r) for r in result.overhead],
    }


def markdown(result: BenchResult) -> str:
    """A markdown report: both tables and how to read them."""
    lines = [f"# {_title(result)}", ""]
    if "command" in result.config:
        lines += ["```", str(result.config["command"]), "```", ""]
    lines += ["| " + " | ".join(_RUN_COLUMNS) + " |", "|" + "---|" * len(_RUN_COLUMNS)]
    lines += ["| " + " | ".join(_run_cells(r)) + " |" for r in result.runs]
    lines += [
        "",
        "gen tok/s, traj/h, p50/p90 are per simulated second (wall x time scale); tokens and preemptions are",
        "the engines' counter deltas over the window; re-prefill is the shortfall of cached_tokens against the",
        "session's previous prompt + completion - 1 (whole blocks); evicted % is it over the prefilled tokens;",
        "first turn: a trajectory's start to its first response (admission queueing included); engine lag:",
        "simulated time the engine-sims lost behind their time scale (CPU short), in percent of the window.",
    ]
    if result.overhead:
        lines += ["", "## Router overhead at saturation", ""]
        lines += ["| " + " | ".join(_OVERHEAD_COLUMNS) + " |", "|" + "---|" * len(_OVERHEAD_COLUMNS)]
        lines += ["| " + " | ".join(_overhead_cells(r)) + " |" for r in result.overhead]
    return "\n".join(lines) + "\n"


def write_outputs(result: BenchResult, out_dir: Path) -> tuple[Path, Path]:
    """Write ``bench.json`` and ``bench.md``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "bench.json", out_dir / "bench.md"
    json_path.write_text(json.dumps(result_json(result), indent=2) + "\n")
    md_path.write_text(markdown(result))
    return json_path, md_path
