"""Tables, JSON and PNG plots of simulation results."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.table import Table

from rolloutpool.sim.results import RunResult
from rolloutpool.sim.runner import Job

__all__ = ["markdown_from_json", "ratios", "results_json", "results_table", "write_plots"]

_OURS = "rolloutpool"
_RATIO_PEERS = ("consistent-hash", "sticky-least-loaded", "clairvoyant")


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def results_table(runs: list[tuple[Job, RunResult, float]], title: str) -> Table:
    """One row per (load, policy)."""
    table = Table(title=title)
    columns = (
        "load", "in-flight", "policy", "cap", "gen tok/s", "traj/h", "re-prefill Mtok",
        "preempt", "hit %", "p50 s", "p90 s", "live max/mean", "quar.", "wall s",
    )  # fmt: skip
    for name in columns:
        table.add_column(name, justify="left" if name == "policy" else "right")
    for job, r, wall in runs:
        table.add_row(
            f"{job.load:g}x",
            str(r.in_flight),
            r.policy,
            "-" if r.cap is None else str(r.cap),
            _fmt(r.tokens_per_s),
            _fmt(r.completed_per_hour),
            _fmt(r.reprefilled_tokens / 1e6, 2),
            str(r.preemptions),
            _fmt(100 * r.prefix_hit_ratio, 1),
            _fmt(r.p50_trajectory_s),
            _fmt(r.p90_trajectory_s),
            f"{r.max_live_per_replica}/{r.mean_live_per_replica:.1f}",
            str(r.quarantines),
            _fmt(wall, 1),
        )
    return table


def ratios(
    runs: list[tuple[Job, RunResult, float]], *, ours: str = _OURS, peers: tuple[str, ...] = _RATIO_PEERS
) -> dict[float, dict[str, float]]:
    """Throughput of policy ``ours`` over each of ``peers`` that ran, per load (pure)."""
    by_load: dict[float, dict[str, RunResult]] = defaultdict(dict)
    for job, result, _ in runs:
        by_load[job.load][result.policy] = result
    out: dict[float, dict[str, float]] = {}
    for load, results in sorted(by_load.items()):
        mine = results.get(ours)
        if mine is None:
            continue
        out[load] = {
            peer: mine.tokens_per_s / results[peer].tokens_per_s
            for peer in peers
            if peer in results and results[peer].tokens_per_s > 0
        }
    return out


def results_json(runs: list[tuple[Job, RunResult, float]], meta: dict[str, Any]) -> str:
    """Everything measured, for scripts."""
    return json.dumps(
        {
            "meta": meta,
            "runs": [{"load": job.load, "wall_s": wall, **r.row()} for job, r, wall in runs],
            "ratios": {str(k): v for k, v in ratios(runs).items()},
        },
        indent=2,
    )


def markdown_from_json(data: dict[str, Any]) -> str:
    """A Markdown table of a ``results.json`` (for docs/benchmarks.md)."""
    lines = [
        "| load | in-flight | policy | cap | gen tok/s | traj/h | re-prefill Mtok | evicted Mtok | preempt "
        "| hit % | p50 s | p90 s | live max/mean | quarantines |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["runs"]:
        lines.append(
            f"| {r['load']:g}x | {r['in_flight']} | {r['policy']} | {r['cap'] if r['cap'] is not None else '-'} "
            f"| {r['tokens_per_s']:,.0f} | {r['completed_per_hour']:,.0f} | {r['reprefilled_tokens'] / 1e6:.2f} "
            f"| {r['evicted_reprefill_tokens'] / 1e6:.2f} | {r['preemptions']} | {100 * r['prefix_hit_ratio']:.1f} "
            f"| {_fmt(r['p50_trajectory_s'])} | {_fmt(r['p90_trajectory_s'])} "
            f"| {r['max_live_per_replica']}/{r['mean_live_per_replica']:.1f} | {r['quarantines']} |"
        )
    peers = sorted({p for v in data["ratios"].values() for p in v})
    if peers:
        lines += ["", "| load | " + " | ".join(f"ours / {p}" for p in peers) + " |", "|---:|" + "---:|" * len(peers)]
        for load, values in data["ratios"].items():
            cells = " | ".join(f"{values[p]:.3f}" if p in values else "-" for p in peers)
            lines.append(f"| {float(load):g}x | {cells} |")
    return "\n".join(lines) + "\n"


def write_plots(runs: list[tuple[Job, RunResult, float]], out_dir: Path) -> list[Path]:
    """Throughput vs offered load, and per-replica live sessions / hit ratio over time."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    by_policy: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for job, r, _ in runs:
        by_policy[r.policy].append((job.load, r.tokens_per_s))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, points in by_policy.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=policy)
    ax.set_xlabel("offered load (in-flight rollouts / fleet conservative capacity)")
    ax.set_ylabel("generated tokens/s (fleet)")
    ax.set_title("Throughput vs offered load")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "throughput_vs_load.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)

    top_load = max(job.load for job, _, _ in runs)
    chosen = [(job, r) for job, r, _ in runs if job.load == top_load]
    fig, axes = plt.subplots(2, len(chosen), figsize=(3.2 * len(chosen), 5.5), sharex=True, squeeze=False)
    for col, (_, r) in enumerate(chosen):
        series: dict[str, list[tuple[float, int, float | None]]] = defaultdict(list)
        for s in r.samples:
            series[s.replica].append((s.t / 60, s.live, s.hit_ratio))
        for replica, pts in sorted(series.items()):
            axes[0][col].plot([p[0] for p in pts], [p[1] for p in pts], lw=0.8, label=replica)
            hits = [(p[0], p[2]) for p in pts if p[2] is not None]
            axes[1][col].plot([h[0] for h in hits], [h[1] for h in hits], lw=0.8)
        axes[0][col].set_title(r.policy, fontsize=9)
        axes[1][col].set_xlabel("minutes")
        axes[1][col].set_ylim(0, 1.02)
    axes[0][0].set_ylabel("live sessions per replica")
    axes[1][0].set_ylabel("prefix hit ratio (window)")
    fig.suptitle(f"Per-replica live sessions and hit ratio at {top_load:g}x load")
    fig.tight_layout()
    path = out_dir / "replicas_over_time.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
