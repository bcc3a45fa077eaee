"""``plan --simulate``'s outputs: ``plan.json`` and the curves in ``plan.png``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from rolloutpool.sim.plan_choice import FleetPoint, PlanChoice

__all__ = ["plan_json", "write_plan_plot"]


def plan_json(*, meta: dict[str, Any], points: list[FleetPoint], choice: PlanChoice, spec: dict[str, Any]) -> str:
    """Every fleet size's runs, the recommendation and the pool spec fields it sets."""
    fleets = [
        {**asdict(p), "fixed": {str(c): v for c, v in p.fixed.items()}, "tokens_per_s_per_replica":
         p.tokens_per_s_per_replica}
        for p in points
    ]  # fmt: skip
    return json.dumps({"meta": meta, "fleets": fleets, "choice": asdict(choice), "spec": spec}, indent=2)


def write_plan_plot(points: list[FleetPoint], choice: PlanChoice, path: Path, *, title: str) -> Path:
    """Left: fleet tokens/s vs replicas (best fixed cap, adaptive, no cap) and the target; right: tokens/s vs cap."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    replicas = [p.replicas for p in points]
    left.plot(replicas, [p.tokens_per_s for p in points], marker="o", label="best fixed cap")
    adaptive = [(p.replicas, p.adaptive_tokens_per_s) for p in points if p.adaptive_tokens_per_s is not None]
    if adaptive:
        left.plot([a[0] for a in adaptive], [a[1] for a in adaptive], marker="*", ls="--", label="adaptive law")
    uncapped = [(p.replicas, p.uncapped_tokens_per_s) for p in points if p.uncapped_tokens_per_s is not None]
    if uncapped:
        left.plot([u[0] for u in uncapped], [u[1] for u in uncapped], marker="x", ls=":", label="no cap (sticky LL)")
    left.axhline(choice.target_tokens_per_s, color="k", lw=0.8, ls="--", label="target")
    left.plot([choice.replicas], [choice.tokens_per_s], marker="o", ms=12, mfc="none", color="r", label="chosen")
    left.set_xscale("log", base=2)
    left.set_xticks(replicas, [str(n) for n in replicas])
    left.set_xlabel("replicas")
    left.set_ylabel("generated tokens/s (fleet)")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    for p in points:
        (line,) = right.plot(list(p.fixed), list(p.fixed.values()), marker=".", label=f"{p.replicas} replicas")
        right.plot([p.best_cap], [p.tokens_per_s], marker="*", ms=10, color=line.get_color())
    right.set_xlabel("fixed cap per replica (star: best)")
    right.set_ylabel("generated tokens/s (fleet)")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
