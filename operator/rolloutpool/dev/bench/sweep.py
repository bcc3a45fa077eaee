"""Several scenarios and loads in one ``rolloutpool bench`` run, and the ratios between routers.

Each point (scenario x load) runs every router configuration on fresh engine-sim processes,
exactly as a single ``bench`` does (:func:`rolloutpool.dev.bench.runner.run_bench`, without the
overhead measurement); the overhead measurement, if asked for, runs once at the end. Ratios
are each router's generated tokens per second over the baseline's at the same point, measured
in the same run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from rolloutpool.dev.bench.config import BenchConfig, BenchResult, RouterRun
from rolloutpool.dev.bench.overhead import OverheadRow
from rolloutpool.dev.bench.runner import run_bench, run_overhead

__all__ = [
    "BASELINE",
    "SweepPoint",
    "SweepResult",
    "median_rows",
    "point_label",
    "ratio_rows",
    "run_sweep",
    "sweep_json",
]

BASELINE = "vllm-sticky-least-loaded"
"""The router every ratio is over (vllm-router's sticky least-loaded: no cap, the issue's reference)."""

Progress = Callable[[str], None]


def point_label(scenario: str, load: float) -> str:
    """``short-burst@3x``: a point's name in progress lines and log directories (pure)."""
    return f"{scenario}@{load:g}x"


@dataclass
class SweepPoint:
    """One scenario at one load: every router's run."""

    scenario: str
    load: float
    result: BenchResult


@dataclass
class SweepResult:
    """Every point, and the overhead measurement if it ran."""

    points: list[SweepPoint]
    overhead: list[OverheadRow]
    command: str | None = None


def ratio_rows(points: list[SweepPoint], *, baseline: str = BASELINE) -> list[dict[str, Any]]:
    """One row per point and router: its figures and its tokens/s over the baseline's (pure).

    ``ratio`` is None where the baseline did not run at that point or generated nothing.
    """
    rows: list[dict[str, Any]] = []
    for point in points:
        runs = {run.router: run for run in point.result.runs}
        base = runs.get(baseline)
        for run in point.result.runs:
            ratio = run.tokens_per_s / base.tokens_per_s if base is not None and base.tokens_per_s > 0 else None
            rows.append(_row(point, run, ratio))
    return rows


def _row(point: SweepPoint, run: RouterRun, ratio: float | None) -> dict[str, Any]:
    law = run.law or {}
    return {
        "scenario": point.scenario,
        "load": point.load,
        "router": run.router,
        "in_flight": run.in_flight,
        "tokens_per_s": run.tokens_per_s,
        "ratio": ratio,
        "evicted_pct": run.evicted_pct,
        "preemptions": run.preemptions,
        "completed": run.completed,
        "first_turn_p50_s": run.first_turn_p50_s,
        "first_turn_p90_s": run.first_turn_p90_s,
        "queued_mean": run.queued_mean,
        "engine_lag_pct": run.engine_lag_pct,
        "law_cuts": law.get("cuts"),
        "law_raises": law.get("raises"),
        "law_quarantines": law.get("quarantines"),
        "law_mean_final_cap": law.get("mean_final_cap"),
        "errors": run.errors,
    }


def _prefixed(progress: Progress, label: str) -> Progress:
    def prefixed(message: str) -> None:
        progress(f"{label} {message}")

    return prefixed


def run_sweep(
    configs: list[tuple[str, float, BenchConfig]], progress: Progress, *, overhead_from: BenchConfig | None = None
) -> SweepResult:
    """Every ``(scenario, load, config)`` point in turn, then the overhead measurement of ``overhead_from``."""
    points = []
    for index, (scenario, load, config) in enumerate(configs, start=1):
        label = point_label(scenario, load)
        progress(f"point {index}/{len(configs)}: {label}, {config.resolved_in_flight} trajectories in flight")
        point_config = replace(config, overhead=None, out_dir=config.out_dir / "points" / label)
        result = run_bench(point_config, _prefixed(progress, label))
        points.append(SweepPoint(scenario=scenario, load=load, result=result))
    rows: list[OverheadRow] = []
    if overhead_from is not None and overhead_from.overhead is not None:
        rows, leftovers = run_overhead(overhead_from, overhead_from.overhead, progress)
        if leftovers:
            progress(f"overhead: processes left behind: {leftovers}")
    return SweepResult(points=points, overhead=rows)


def sweep_json(sweep: SweepResult) -> dict[str, Any]:
    """Everything as plain JSON data: the ratio table, then each point's configuration and runs."""
    return {
        "command": sweep.command,
        "baseline": BASELINE,
        "ratios": ratio_rows(sweep.points),
        "points": [
            {
                "scenario": p.scenario,
                "load": p.load,
                "config": p.result.config,
                "runs": [asdict(r) for r in p.result.runs],
            }
            for p in sweep.points
        ],
        "overhead": [asdict(r) for r in sweep.overhead],
    }


_MEDIAN_FIELDS = (
    "in_flight", "tokens_per_s", "ratio", "evicted_pct", "preemptions", "completed", "first_turn_p50_s",
    "first_turn_p90_s", "queued_mean", "engine_lag_pct", "law_cuts", "law_raises", "law_quarantines",
    "law_mean_final_cap", "errors",
)  # fmt: skip


def median_rows(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Ratio rows of repeated runs (e.g. one per seed) as one row per point and router, each figure's median (pure).

    Each ratio is taken within its own run (side by side) before the median. ``ratios`` keeps every run's
    ratio in run order; ``runs`` says how many runs had that point and router. Rows keep the order in which
    points and routers first appear.
    """
    grouped: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for rows in runs:
        for row in rows:
            grouped.setdefault((row["scenario"], row["load"], row["router"]), []).append(row)
    out = []
    for (scenario, load, router), rows in grouped.items():
        merged: dict[str, Any] = {"scenario": scenario, "load": load, "router": router, "runs": len(rows)}
        for name in _MEDIAN_FIELDS:
            values = [row[name] for row in rows if row.get(name) is not None]
            merged[name] = statistics.median(values) if values else None
        merged["ratios"] = [row.get("ratio") for row in rows]
        out.append(merged)
    return out
