"""The markdown, JSON and PNG of a multi-point ``rolloutpool bench`` run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rolloutpool.bench.report import markdown as point_markdown
from rolloutpool.bench.sweep import BASELINE, SweepResult, point_label, ratio_rows, sweep_json

__all__ = ["ratio_markdown", "sweep_markdown", "write_plot", "write_sweep_outputs"]

_COLUMNS = (
    "scenario", "load", "in-flight", "router", "gen tok/s", f"/ {BASELINE}", "evicted re-prefill %", "preempt",
    "first turn p50 s", "first turn p90 s", "queued (mean)", "law cuts/raises", "law final cap",
)  # fmt: skip


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _cells(row: dict[str, Any]) -> list[str]:
    law = "-" if row["law_cuts"] is None else f"{row['law_cuts']}/{row['law_raises']}"
    return [
        row["scenario"],
        f"{row['load']:g}x",
        str(row["in_flight"]),
        row["router"],
        _num(row["tokens_per_s"]),
        _num(row["ratio"], 3),
        _num(row["evicted_pct"], 1),
        str(row["preemptions"]),
        _num(row["first_turn_p50_s"], 1),
        _num(row["first_turn_p90_s"], 1),
        _num(row["queued_mean"], 1),
        law,
        _num(row["law_mean_final_cap"], 1),
    ]


def ratio_markdown(sweep: SweepResult) -> list[str]:
    """The side-by-side table: one row per point and router (markdown lines)."""
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * 4 + "--:|" * (len(_COLUMNS) - 4)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in ratio_rows(sweep.points)]
    return lines


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


def write_plot(sweep: SweepResult, path: Path) -> Path:
    """Generated tokens/s per router against load, one panel per scenario."""
    import matplotlib  # noqa: PLC0415 - the plot is optional; matplotlib loads only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    scenarios = list(dict.fromkeys(p.scenario for p in sweep.points))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(5.5 * len(scenarios), 4), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        series: dict[str, list[tuple[float, float]]] = {}
        for point in (p for p in sweep.points if p.scenario == scenario):
            for run in point.result.runs:
                series.setdefault(run.router, []).append((point.load, run.tokens_per_s))
        for router, values in series.items():
            xs, ys = zip(*sorted(values), strict=True)
            ax.plot(xs, ys, marker="o", label=router)
        ax.set_title(scenario)
        ax.set_xlabel("load (x the fleet's conservative capacity)")
        ax.set_ylabel("generated tokens / simulated s")
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
        paths.append(write_plot(sweep, out_dir / "bench.png"))
    return paths
