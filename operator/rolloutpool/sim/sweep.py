"""Hindsight cap sweep: every fixed cap from the floor up vs the adaptive law, per scenario and load.

For each (scenario, load) a coarse grid of fixed caps runs first, from the conservative
floor to a little above the in-flight sessions per replica (where a cap stops binding);
a second pass fills every cap next to the best coarse one. The best fixed cap is the
reference the adaptive policy (:data:`rolloutpool.sim.config.ADAPTIVE`, told no residency)
is measured against. Fixed-cap results are cached by their key, so retuning the law reruns
only the adaptive runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from rolloutpool.sim.config import ADAPTIVE, FleetConfig
from rolloutpool.sim.results import RunResult
from rolloutpool.sim.runner import Job, fleet_floor, run_jobs
from rolloutpool.sim.workload import scenario

__all__ = ["Point", "SweepRun", "cap_grid", "run_key", "run_sweep", "sweep_points"]


@dataclass(frozen=True)
class SweepRun:
    """One measured run of the sweep (``cap`` None: the adaptive policy)."""

    scenario: str
    load: float
    cap: int | None
    duration_s: float
    seed: int
    row: dict[str, Any]
    control: list[tuple[float, str, float, int, bool]]
    """Adaptive only: (t, replica, cap, live, quarantined) at every control step."""


@dataclass(frozen=True)
class Point:
    """One (scenario, load): the best fixed cap and the adaptive policy."""

    scenario: str
    load: float
    in_flight: int
    best_cap: int
    best_tokens_per_s: float
    adaptive_tokens_per_s: float
    adaptive_mean_target: float
    adaptive_cuts: int
    fixed: dict[int, float]

    @property
    def ratio(self) -> float:
        """Adaptive throughput over the best fixed cap's."""
        return self.adaptive_tokens_per_s / self.best_tokens_per_s if self.best_tokens_per_s else 0.0


def run_key(scenario_name: str, load: float, cap: int | None, duration_s: float, seed: int) -> str:
    """Cache key of one run."""
    return f"{scenario_name}|{load:g}|{'adaptive' if cap is None else cap}|{duration_s:g}|{seed}"


def cap_grid(*, floor: int, per_replica: float, step: int) -> list[int]:
    """Coarse grid of fixed caps: the floor, then every ``step`` to just past the in-flight per replica (pure)."""
    top = max(floor + step, math.ceil(per_replica) + 2)
    caps = list(range(floor, top + 1, step))
    if caps[-1] < top:
        caps.append(top)
    return caps


def _refine(fixed: dict[int, float], floor: int, reach: int = 2) -> list[int]:
    """Caps within ``reach`` of the best coarse one, between its coarse neighbours, not yet run."""
    best = max(fixed, key=lambda c: fixed[c])
    ordered = sorted(fixed)
    i = ordered.index(best)
    lo = ordered[i - 1] if i > 0 else best
    hi = ordered[i + 1] if i + 1 < len(ordered) else best
    return [c for c in range(max(floor, lo + 1, best - reach), min(hi, best + reach + 1)) if c not in fixed]


def run_sweep(
    *,
    base: FleetConfig,
    scenarios: Iterable[str],
    loads: Iterable[float],
    step: int,
    workers: int,
    cache: dict[str, SweepRun],
    durations: dict[str, float],
    on_done: Callable[[Job, RunResult, float], None] | None = None,
    on_planned: Callable[[int], None] | None = None,
    on_saved: Callable[[dict[str, SweepRun]], object] | None = None,
    adaptive: bool = True,
) -> dict[str, SweepRun]:
    """Run the coarse pass and the adaptive runs, then the fine pass; returns every run by key."""
    configs = []
    for name in scenarios:
        cfg = replace(base, scenario=scenario(name), duration_s=durations.get(name, base.duration_s))
        floor = fleet_floor(cfg)
        for load in loads:
            configs.append((name, load, replace(cfg, in_flight=max(1, round(load * floor)))))
    runs = dict(cache)

    def execute(jobs: list[tuple[str, Job]]) -> None:
        todo = [(k, j) for k, j in jobs if k not in runs]
        if on_planned:
            on_planned(len(todo))
        keys = {j: k for k, j in todo}

        def done(job: Job, result: RunResult, wall: float) -> None:
            control = [(p.t, p.replica, p.target, p.live, p.quarantined) for p in result.control]
            cfg = job.config
            runs[keys[job]] = SweepRun(
                result.scenario, job.load, cfg.fixed_cap, cfg.duration_s, cfg.seed, result.row(), control
            )
            if on_saved:
                on_saved(runs)  # every finished run is kept, even if the sweep is stopped
            if on_done:
                on_done(job, result, wall)

        run_jobs([j for _, j in todo], workers=workers, on_done=done)

    def fixed_jobs(name: str, load: float, cfg: FleetConfig, caps: list[int]) -> list[tuple[str, Job]]:
        return [
            (run_key(name, load, c, cfg.duration_s, cfg.seed), Job(load, "rolloutpool", replace(cfg, fixed_cap=c)))
            for c in caps
        ]

    per = {(n, ld): fleet_floor(c) // c.replicas for n, ld, c in configs}
    grid = {
        (n, ld): cap_grid(floor=per[n, ld], per_replica=c.in_flight / c.replicas, step=step) for n, ld, c in configs
    }
    coarse = [j for n, ld, c in configs for j in fixed_jobs(n, ld, c, grid[n, ld])]
    laws = [(run_key(n, ld, None, c.duration_s, c.seed), Job(ld, ADAPTIVE, c)) for n, ld, c in configs]
    execute(coarse + (laws if adaptive else []))
    fine = []
    for n, ld, c in configs:
        # refined around the best of the COARSE grid only, so a rerun plans the same runs (and finds them cached)
        fixed = {cap: v for cap, v in _fixed(runs, n, ld, c.duration_s, c.seed).items() if cap in grid[n, ld]}
        fine += fixed_jobs(n, ld, c, _refine(fixed, per[n, ld]))
    execute(fine)
    return runs


def _fixed(runs: dict[str, SweepRun], name: str, load: float, duration_s: float, seed: int) -> dict[int, float]:
    return {
        r.cap: float(r.row["tokens_per_s"])
        for r in runs.values()
        if r.scenario == name and r.load == load and r.cap is not None and r.duration_s == duration_s and r.seed == seed
    }


def sweep_points(runs: dict[str, SweepRun]) -> list[Point]:
    """Best fixed cap vs adaptive per (scenario, load), for the runs that have both (pure)."""
    points = []
    for r in sorted(runs.values(), key=lambda r: (r.scenario, r.load)):
        if r.cap is not None:
            continue
        fixed = _fixed(runs, r.scenario, r.load, r.duration_s, r.seed)
        if not fixed:
            continue
        best = max(fixed, key=lambda c: (fixed[c], -c))
        points.append(
            Point(
                scenario=r.scenario,
                load=r.load,
                in_flight=int(r.row["in_flight"]),
                best_cap=best,
                best_tokens_per_s=fixed[best],
                adaptive_tokens_per_s=float(r.row["tokens_per_s"]),
                adaptive_mean_target=float(r.row.get("mean_target") or 0.0),
                adaptive_cuts=int(r.row.get("law_cuts") or 0),
                fixed=dict(sorted(fixed.items())),
            )
        )
    return points
