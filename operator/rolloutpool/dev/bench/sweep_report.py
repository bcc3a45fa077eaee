"""The markdown, JSON and PNG of a multi-point ``rolloutpool bench`` run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rolloutpool.dev.bench.report import markdown as point_markdown
from rolloutpool.dev.bench.sweep import BASELINE, SweepResult, point_label, ratio_rows, sweep_json

__all__ = [
    "median_markdown",
    "ratio_markdown",
    "sweep_markdown",
    "write_combined_outputs",
    "write_plot",
    "write_sweep_outputs",
]

_COLUMNS = (
    "scenario", "load", "in-flight", "router", "gen tok/s", f"/ {BASELINE}", "evicted re-prefill %", "preempt",
    "first turn p50 s", "first turn p90 s", "queued (mean)", "engine lag %", "law cuts/raises", "law final cap",
)  # fmt: skip


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _cells(row: dict[str, Any]) -> list[str]:
    law = "-" if row["law_cuts"] is None else f"{row['law_cuts']:g}/{row['law_raises']:g}"
    return [
        row["scenario"],
        f"{row['load']:g}x",
        _num(row["in_flight"]),
        row["router"],
        _num(row["tokens_per_s"]),
        _num(row["ratio"], 3),
        _num(row["evicted_pct"], 1),
        _num(row["preemptions"]),
        _num(row["first_turn_p50_s"], 1),
        _num(row["first_turn_p90_s"], 1),
        _num(row["queued_mean"], 1),
        _num(row.get("engine_lag_pct"), 1),  # absent from bench.json files written before it was measured
        law,
        _num(row["law_mean_final_cap"], 1),
    ]


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...] = _COLUMNS) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * 4 + "--:|" * (len(columns) - 4)]
    for row in rows:
        cells = _cells(row)
        if "ratios" in row:  # repeated runs: every run's own ratio after the median
            cells.insert(6, " / ".join(_num(r, 3) for r in row["ratios"]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def ratio_markdown(sweep: SweepResult) -> list[str]:
    """The side-by-side table: one row per point and router (markdown lines)."""
    return _table(ratio_rows(sweep.points))


def median_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The table of :func:`~rolloutpool.dev.bench.sweep.median_rows`: medians, and each run's ratio (markdown lines)."""
    columns = (*_COLUMNS[:6], "per run", *_COLUMNS[6:])
    return _table(rows, columns)


def sweep_markdown(sweep: SweepResult) -> str:
    """Ratios first, then each point's full table as a single ``bench`` prints it."""
    lines = ["# rolloutpool bench: several points", ""]
    if sweep.command:
        lines += ["```", sweep.command, "```", ""]
    lines += ratio_markdown(sweep)
    lines += [
        "",
        f"gen tok/s per simulated second; the ratio is over {BASELINE} at the same point, same run. Evicted",
        "re-prefill % is re-prefilled tokens over prefilled tokens (prompt - cached). First turn: a trajectory's",
        "start to its first response (admission queueing + the first turn), simulated seconds; queued (mean):",
        "trajectories waiting for their first response, averaged over the window. Law: the operator's law in",
        "rolloutpool-adaptive (cap cuts/raises over all replicas, mean cap at the end).",
    ]
    for point in sweep.points:
        body = point_markdown(point.result).splitlines()
        lines += ["", f"## {point_label(point.scenario, point.load)}", "", *body[1:]]
    return "\n".join(lines) + "\n"


def write_plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Generated tokens/s per router against load, one panel per scenario (from ratio or median rows)."""
    import matplotlib  # noqa: PLC0415 - the plot is optional; matplotlib loads only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    scenarios = list(dict.fromkeys(row["scenario"] for row in rows))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(5.5 * len(scenarios), 4), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        series: dict[str, list[tuple[float, float]]] = {}
        for row in rows:
            if row["scenario"] == scenario and row["tokens_per_s"] is not None:
                series.setdefault(row["router"], []).append((row["load"], row["tokens_per_s"]))
        for router, values in series.items():
            xs, ys = zip(*sorted(values), strict=True)
            ax.plot(xs, ys, marker="o", label=router)
        ax.set_title(scenario)
        ax.set_xlabel("load (x the fleet's conservative capacity)")
        ax.set_ylabel("generated tokens / simulated s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_sweep_outputs(sweep: SweepResult, out_dir: Path, *, plot: bool = True) -> list[Path]:
    """Write ``bench.json``, ``bench.md`` and (with ``plot``) ``bench.png``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "bench.json", out_dir / "bench.md"
    json_path.write_text(json.dumps(sweep_json(sweep), indent=2) + "\n")
    md_path.write_text(sweep_markdown(sweep))
    paths = [json_path, md_path]
    if plot:
        paths.append(write_plot(ratio_rows(sweep.points), out_dir / "bench.png"))
    return paths


def write_combined_outputs(
    rows: list[dict[str, Any]],
    sources: list[str],
    out_dir: Path,
    *,
    points: list[dict[str, Any]] | None = None,
    commands: list[str] | None = None,
) -> list[Path]:
    """Write ``combined.json``, ``combined.md`` and ``combined.png`` of median rows; return their paths.

    ``points`` (each point's scenario, load and config) and ``commands`` (each source run's) say what ran, for the
    results table of docs/benchmarks.md (:mod:`rolloutpool.dev.bench.results_table`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "combined.json", out_dir / "combined.md"
    document = {"sources": sources, "baseline": BASELINE, "rows": rows, "points": points or []}
    document["commands"] = commands or []
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    lines = ["# rolloutpool bench: medians over repeated runs", "", *(f"- `{s}`" for s in sources), ""]
    lines += median_markdown(rows)
    lines += ["", f"Medians over the runs; each ratio is over {BASELINE} within its own run, then the median."]
    md_path.write_text("\n".join(lines) + "\n")
    return [json_path, md_path, write_plot(rows, out_dir / "combined.png")]
