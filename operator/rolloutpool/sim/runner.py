"""Run many (load, policy) simulations, in parallel processes, with progress callbacks."""

from __future__ import annotations

import gc
import multiprocessing
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace

from rolloutpool.capacity import DEFAULT_BLOCK_SIZE, conservative_cap
from rolloutpool.engine.model.cost import hardware_preset
from rolloutpool.sim.fleet import FleetConfig, simulate_policy
from rolloutpool.sim.results import RunResult

__all__ = ["Job", "fleet_floor", "plan_jobs", "run_jobs"]


@dataclass(frozen=True)
class Job:
    """One simulation to run."""

    load: float
    policy: str
    config: FleetConfig


def fleet_floor(config: FleetConfig) -> int:
    """The fleet's conservative capacity: replicas x (KV tokens // maxModelLen)."""
    blocks = config.num_gpu_blocks or hardware_preset(config.hardware).num_gpu_blocks
    per_replica = conservative_cap(
        capacity_tokens=blocks * DEFAULT_BLOCK_SIZE, max_model_len=config.scenario.max_model_len
    )
    return per_replica * config.replicas


def plan_jobs(base: FleetConfig, loads: Iterable[float], policies: Iterable[str]) -> list[Job]:
    """One job per (load, policy); load is a multiple of the fleet's conservative capacity."""
    floor = fleet_floor(base)
    return [
        Job(load, policy, replace(base, in_flight=max(1, round(load * floor)))) for load in loads for policy in policies
    ]


def _quiet_gc() -> None:
    """Collect cycles less often in a worker process: what exists when it starts (modules, the workload) is
    never garbage, and a run makes few cycles, so the default thresholds spent ~5 % of a compiled run's CPU on
    collections that found little (the router does the same, router/app.py). Inline runs leave the caller's
    collector alone."""
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def _run(job: Job) -> tuple[Job, RunResult, float]:
    started = time.perf_counter()
    result = simulate_policy(job.config, job.policy)
    return job, result, time.perf_counter() - started


def run_jobs(
    jobs: list[Job], *, workers: int, on_done: Callable[[Job, RunResult, float], None] | None = None
) -> list[tuple[Job, RunResult, float]]:
    """Run every job (``workers`` processes, the largest first; 1 runs inline); results keep the job order."""
    results: dict[int, tuple[Job, RunResult, float]] = {}
    if workers <= 1:
        for i, job in enumerate(jobs):
            results[i] = _run(job)
            if on_done:
                on_done(*results[i])
    else:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_quiet_gc) as pool:
            # the largest runs first (most sessions in flight), so that no long one starts last on an idle pool
            order = sorted(range(len(jobs)), key=lambda i: -jobs[i].config.in_flight)
            pending: dict[Future[tuple[Job, RunResult, float]], int] = {pool.submit(_run, jobs[i]): i for i in order}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    i = pending.pop(future)
                    results[i] = future.result()
                    if on_done:
                        on_done(*results[i])
    return [results[i] for i in range(len(jobs))]
