"""JSON, Markdown and PNG outputs of the hindsight cap sweep."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from rolloutpool.sim.sweep import Point, SweepRun

__all__ = ["load_meta", "load_runs", "points_markdown", "runs_json", "write_cap_plots"]

"""Stationary scenarios whose best fixed caps a drifting scenario should move between."""


def runs_json(runs: dict[str, SweepRun], points: list[Point], meta: dict[str, Any]) -> str:
    """Every run (the cache) and the comparison points."""
    return json.dumps(
        {
            "meta": meta,
            "points": [{**asdict(p), "ratio": p.ratio} for p in points],
            "runs": {key: asdict(run) for key, run in sorted(runs.items())},
        },
        indent=1,
    )


def load_meta(path: Path) -> dict[str, Any]:
    """The ``meta`` of an earlier ``sweep.json`` (a missing file gives none)."""
    return dict(json.loads(path.read_text()).get("meta", {})) if path.exists() else {}


def load_runs(path: Path) -> dict[str, SweepRun]:
    """The runs of an earlier ``sweep.json`` (a missing file gives none)."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {key: SweepRun(**{**r, "control": [tuple(c) for c in r["control"]]}) for key, r in data["runs"].items()}


def points_markdown(points: list[Point]) -> str:
    """One row per (scenario, load): best fixed cap, adaptive, their ratio."""
    lines = [
        "| scenario | load | in-flight | best fixed cap | best fixed tok/s | adaptive tok/s | adaptive / best "
        "| adaptive mean target | law cuts | fixed caps tried (tok/s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in points:
        tried = ", ".join(f"{c}: {v:,.0f}" for c, v in p.fixed.items())
        lines.append(
            f"| {p.scenario} | {p.load:g}x | {p.in_flight} | {p.best_cap} | {p.best_tokens_per_s:,.0f} "
            f"| {p.adaptive_tokens_per_s:,.0f} | **{p.ratio:.3f}** | {p.adaptive_mean_target:.2f} | {p.adaptive_cuts} "
            f"| {tried} |"
        )
    return "\n".join(lines) + "\n"


def write_cap_plots(runs: dict[str, SweepRun], points: list[Point], out_dir: Path) -> list[Path]:
    """Throughput vs fixed cap (adaptive as a line) per scenario, and cap over time of each adaptive run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    by_scenario: dict[str, list[Point]] = defaultdict(list)
    for p in points:
        by_scenario[p.scenario].append(p)
    fig, axes = plt.subplots(1, len(by_scenario), figsize=(4.2 * len(by_scenario), 3.8), squeeze=False)
    for ax, (name, pts) in zip(axes[0], sorted(by_scenario.items()), strict=True):
        for p in pts:
            (line,) = ax.plot(list(p.fixed), list(p.fixed.values()), marker=".", label=f"{p.load:g}x fixed")
            ax.axhline(p.adaptive_tokens_per_s, color=line.get_color(), ls="--", lw=0.9)
        ax.set_title(f"{name} (dashed: adaptive)", fontsize=9)
        ax.set_xlabel("fixed cap per replica")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("generated tokens/s (fleet)")
    fig.tight_layout()
    path = out_dir / "caps_throughput_vs_cap.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    for run in sorted(runs.values(), key=lambda r: (r.scenario, r.load)):
        if run.cap is not None or not run.control:
            continue
        fig, ax = plt.subplots(figsize=(9, 4.6))
        series: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for t, replica, target, _live, _q in run.control:
            series[replica].append((t / 60, target))
        for replica, targets in sorted(series.items()):
            ax.plot([c[0] for c in targets], [c[1] for c in targets], lw=0.7, alpha=0.7, label=replica)
        ax.set_xlabel("minutes")
        ax.set_ylabel("working-set target (share of KV capacity)")
        ax.set_title(f"Adaptive working-set target over time: {run.scenario} at {run.load:g}x", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16))
        fig.tight_layout()
        path = out_dir / f"target_over_time_{run.scenario}_{run.load:g}x.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
