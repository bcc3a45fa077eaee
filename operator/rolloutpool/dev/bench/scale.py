"""Scale figures: one router's session state at 100k live sessions over 1,000 replicas, and one operator pass.

Router: a :class:`~rolloutpool.router.sessions.SessionManager` (the router's own state: the
ledger, metrics, the asyncio shell) with ``--replicas`` replicas and ``--sessions`` live
sessions in GRPO groups, kept at that count while it is measured: each sample releases a random
live session and places a new one. Reported: the placement latency of a new session through
the router (``SessionManager.acquire``) and through the pure ledger (``Ledger.arrive``), wall
clock and the thread's CPU time (which a loaded, shared machine does not inflate), a returning
turn's latency, and the process RSS once the table is full.

Scrape: the CPU time of one ``/metrics`` render of a router that admits by projected KV tokens
(its per-replica gauges, the working sets among them) with ``--sessions`` live
sessions one turn in over ``--replicas`` replicas that reported their KV capacity, after 256
rollouts finished.

Operator: the pure decisions one reconcile pass runs for a pool of ``--replicas`` engines on a
synthetic observed world (every pod ready, every replica with signals): ``parse_spec``,
``router_objects``, ``desired_engine_pods``, ``plan_engines``, ``plan_controls`` (the control
law for every replica), ``build_status``, ``events_between`` and the status comparison.
Kubernetes and Prometheus round trips are not included (they are I/O, measured elsewhere).
Times are CPU time of this process (``time.process_time``); one pass's wall time is reported too.

``python -m rolloutpool.dev.bench.scale --out out/scale.json``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["main", "operator_pass", "router_scale", "router_scrape"]


def _replica_specs(count: int) -> tuple[Any, ...]:
    """``count`` replicas with distinct made-up addresses (nothing is dialled)."""
    from rolloutpool.router.config import ReplicaSpec  # noqa: PLC0415

    return tuple(
        ReplicaSpec(f"engine-{i}", f"http://10.{i // 65536}.{i // 256 % 256}.{i % 256}:8000") for i in range(count)
    )


def _rss_mb() -> float:
    """Resident set size of this process now (Linux ``/proc``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _quantiles(ns: list[int]) -> dict[str, float]:
    ordered = sorted(ns)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000, 1)

    return {"p50_us": at(0.50), "p90_us": at(0.90), "p99_us": at(0.99), "max_us": round(ordered[-1] / 1000, 1)}


def router_scale(  # noqa: PLR0915 -- one measurement, read top to bottom
    *, replicas: int, sessions: int, samples: int, group_size: int = 16, seed: int = 0
) -> dict[str, Any]:
    """Fill one router's state to ``sessions`` live sessions and time placements at that size."""
    from rolloutpool.router.config import RouterConfig  # noqa: PLC0415
    from rolloutpool.router.instruments import RouterMetrics  # noqa: PLC0415
    from rolloutpool.router.sessions import SessionManager  # noqa: PLC0415
    from rolloutpool.routing.events import Bound  # noqa: PLC0415
    from rolloutpool.routing.policies import Placement  # noqa: PLC0415

    rss_start = _rss_mb()
    cap = -(-sessions * 5 // (4 * replicas))  # a quarter of headroom over the mean: placements never queue
    specs = _replica_specs(replicas)
    config = RouterConfig(replicas=specs, cap=cap, queue_max=sessions)
    manager = SessionManager(config, clock=time.monotonic, metrics=RouterMetrics())
    rng = random.Random(seed)  # noqa: S311 -- a workload, not secrets
    live: list[str] = []
    counter = 0

    def new_id() -> tuple[str, str]:
        nonlocal counter
        counter += 1
        return f"traj-{counter}", f"group-{counter // group_size}"

    async def fill() -> float:
        started = time.perf_counter()
        for _ in range(sessions):
            sid, group = new_id()
            await manager.acquire(sid, group=group)
            live.append(sid)
        return time.perf_counter() - started

    async def measure() -> dict[str, list[int]]:
        out: dict[str, list[int]] = {k: [] for k in ("router", "ledger", "returning", "router_cpu", "ledger_cpu")}
        wall, cpu = time.perf_counter_ns, time.thread_time_ns
        for i in range(samples):
            victim = live.pop(rng.randrange(len(live)))
            manager.release(victim, how="finish_session")
            sid, group = new_id()
            kind = "router" if i % 2 else "ledger"
            t0, c0 = wall(), cpu()
            if i % 2:
                await manager.acquire(sid, group=group)
            else:
                decision = manager.ledger.arrive(Placement(sid, group=group), now=time.monotonic())
            c1, t1 = cpu(), wall()
            out[kind].append(t1 - t0)
            out[f"{kind}_cpu"].append(c1 - c0)
            if not i % 2:
                assert isinstance(decision, Bound)  # noqa: S101 -- caps leave room by construction
                manager.ledger.take_events()
            live.append(sid)
            back = live[rng.randrange(len(live))]
            t0 = wall()
            await manager.acquire(back, group=None)
            out["returning"].append(wall() - t0)
        return out

    gc.collect()
    fill_s = asyncio.run(fill())
    gc.collect()
    rss_full = _rss_mb()
    gc.disable()  # the latency of the decisions, not of a collection that lands on one sample (reported apart)
    try:
        timings = asyncio.run(measure())
    finally:
        gc.enable()
    held = sum(r.live for r in manager.table.replicas.values())
    assert held == len(manager.table.sessions) == sessions  # noqa: S101 -- the state measured is the state asked for
    return {
        "replicas": replicas,
        "sessions": held,
        "cap": cap,
        "fill_s": round(fill_s, 2),
        "fill_per_placement_us": round(fill_s / sessions * 1e6, 1),
        "rss_start_mb": round(rss_start, 1),
        "rss_full_mb": round(rss_full, 1),
        "rss_after_mb": round(_rss_mb(), 1),
        "placement_router": _quantiles(timings["router"]),
        "placement_ledger": _quantiles(timings["ledger"]),
        "placement_router_cpu": _quantiles(timings["router_cpu"]),
        "placement_ledger_cpu": _quantiles(timings["ledger_cpu"]),
        "returning_turn_router": _quantiles(timings["returning"]),
    }


def router_scrape(*, replicas: int, sessions: int, finished: int = 256, seed: int = 0) -> dict[str, Any]:
    """Time rendering ``/metrics`` of a turn-scheduling router at ``sessions`` live sessions with contexts."""
    from prometheus_client import generate_latest  # noqa: PLC0415

    from rolloutpool.router.config import RouterConfig  # noqa: PLC0415
    from rolloutpool.router.instruments import RouterMetrics  # noqa: PLC0415
    from rolloutpool.router.sessions import SessionManager, Usage  # noqa: PLC0415
    from rolloutpool.routing.events import Bound  # noqa: PLC0415
    from rolloutpool.routing.policies import Placement  # noqa: PLC0415

    max_len = 32768
    specs = _replica_specs(replicas)
    metrics = RouterMetrics()
    manager = SessionManager(RouterConfig(replicas=specs, queue_max=sessions), clock=time.monotonic, metrics=metrics)
    ledger = manager.ledger
    room = 4 * max_len * -(-(sessions + finished) // replicas)  # every session fits its replica's working set
    for spec in specs:
        ledger.set_capacity(spec.name, capacity_tokens=room, block_size=16, now=time.monotonic())
    rng = random.Random(seed)  # noqa: S311 -- a workload, not secrets
    for i in range(finished + sessions):
        arrival = ledger.arrive(Placement(f"traj-{i}"), now=time.monotonic())
        assert isinstance(arrival, Bound)  # noqa: S101 -- the capacity leaves room by construction
        context = rng.randint(2_000, 20_000) if i < finished else rng.randint(500, 5_000)  # live: early on
        ledger.finish_turn(arrival.session, now=time.monotonic(), usage=Usage(context - 100, 100, None))
        if i < finished:
            ledger.release(f"traj-{i}", how="finished", now=time.monotonic())
        ledger.take_events()
    cpu_ms = []
    for _ in range(3):
        started = time.process_time()
        generate_latest(metrics.registry)
        cpu_ms.append((time.process_time() - started) * 1e3)
    return {
        "replicas": replicas,
        "sessions": len(ledger.table.sessions),
        "metrics_render_cpu_ms": {"p50": round(statistics.median(cpu_ms), 1), "max": round(max(cpu_ms), 1)},
    }


def _synthetic_pool(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "rolloutpool.io/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": "scale", "namespace": "bench", "uid": "0000-scale", "generation": 1},
        "spec": {
            "replicas": replicas,
            "engine": {"kind": "simulated", "model": "Qwen/Qwen3-8B", "maxModelLen": 32768, "gpusPerReplica": 0,
                       "kvCapacityTokens": 400000},
            "router": {"replicas": 1},
            "autoscaling": {"enabled": True, "prometheusUrl": "http://prometheus:9090", "intervalSeconds": 15},
        },
    }  # fmt: skip


def _observed(desired: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    pods = []
    for i, (name, manifest) in enumerate(sorted(desired.items())):
        pod = json.loads(json.dumps(manifest))
        pod["metadata"].update({"uid": f"uid-{name}", "creationTimestamp": "2026-12-01T00:00:00Z"})
        pod["status"] = {
            "phase": "Running",
            "podIP": f"10.1.{i // 256}.{i % 256}",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "engine", "ready": True, "restartCount": 0}],
        }
        pods.append(pod)
    return pods


def _signals(names: list[str], live: dict[str, int], rng: random.Random, now: float) -> dict[str, Any]:
    from rolloutpool.autoscale import ReplicaSignals  # noqa: PLC0415

    return {
        n: ReplicaSignals(kv_usage=rng.uniform(0.3, 0.95), preemptions_per_s=0.0, waiting=0.0,
                          prefix_hit_ratio=rng.uniform(0.8, 0.97), reprefill_tokens_per_s=rng.uniform(0, 3000),
                          kv_capacity_tokens=400000, live_sessions=live[n], queued_sessions=0, sampled_at=now)
        for n in names
    }  # fmt: skip


def _one_pass(
    pool: dict[str, Any], pods: list[dict[str, Any]], previous: Any, *, now: float, rng: random.Random,
    steps: dict[str, list[float]],
) -> Any:  # fmt: skip
    """The pure decisions of one pass, each timed into ``steps``; returns the new status."""
    from rolloutpool.autoscale import classify_health  # noqa: PLC0415
    from rolloutpool.reconcile.caps import controls_from_status, parse_spec, plan_controls  # noqa: PLC0415
    from rolloutpool.reconcile.children import desired_engine_pods, router_objects  # noqa: PLC0415
    from rolloutpool.reconcile.engines import plan_engines  # noqa: PLC0415
    from rolloutpool.reconcile.labels import draining_from_pods  # noqa: PLC0415
    from rolloutpool.reconcile.status import build_status, events_between  # noqa: PLC0415

    def timed(step: str, started: float) -> float:
        end = time.process_time()  # CPU time: the figure a shared, loaded machine does not inflate
        steps.setdefault(step, []).append(end - started)
        return end

    names = sorted(p["metadata"]["name"] for p in pods)
    live = {n: rng.randrange(60, 120) for n in names}
    signals = _signals(names, live, rng, now)
    image = "rolloutpool:bench"
    t = time.process_time()
    spec, _ = parse_spec(pool=pool)
    assert spec is not None  # noqa: S101 -- a fixed, valid manifest
    t = timed("parse_spec", t)
    router_objects(pool=pool, spec=spec, default_image=image)
    t = timed("router_objects", t)
    desired = desired_engine_pods(pool=pool, spec=spec, default_image=image)
    t = timed("desired_engine_pods", t)
    draining = draining_from_pods(pods)
    plan = plan_engines(
        spec=spec, desired=desired, observed=pods, live_sessions=live, draining=draining, now=now,
        drain_timeout_seconds=float(spec.update_strategy.drain_timeout_seconds),
    )  # fmt: skip
    t = timed("plan_engines", t)
    health = classify_health(enabled=True, reachable=True, signals=signals, now=now, stale_after_seconds=60.0)
    controls = plan_controls(
        spec=spec, replicas=names, signals=signals, previous=controls_from_status(previous),
        health=health, now=now,
    )  # fmt: skip
    t = timed("plan_controls", t)
    status = build_status(
        pool=pool, spec=spec, spec_error=None, pods=pods, live_sessions=live, queued_sessions=0, controls=controls,
        health=health, draining=draining, previous=previous, now=datetime.fromtimestamp(now, tz=UTC),
        signals=signals, plan=plan, router_deployment=None,
    )  # fmt: skip
    t = timed("build_status", t)
    events_between(previous, status)
    t = timed("events_between", t)
    wire = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    _ = wire != (previous.model_dump(mode="json", by_alias=True, exclude_none=True) if previous else None)
    timed("status_compare", t)
    return status


def _median_ms(values: list[float]) -> float:
    return round(1000 * statistics.median(values), 1)


def operator_pass(*, replicas: int, passes: int, seed: int = 0) -> dict[str, Any]:
    """Time the pure decisions of ``passes`` reconcile passes over a pool of ``replicas`` engines."""
    from rolloutpool.reconcile.caps import parse_spec  # noqa: PLC0415
    from rolloutpool.reconcile.children import desired_engine_pods  # noqa: PLC0415

    rng = random.Random(seed)  # noqa: S311 -- synthetic signals, not secrets
    pool = _synthetic_pool(replicas)
    spec, error = parse_spec(pool=pool)
    assert spec is not None, error  # noqa: S101
    pods = _observed(desired_engine_pods(pool=pool, spec=spec, default_image="rolloutpool:bench"))
    previous = None
    steps: dict[str, list[float]] = {}
    walls, cpus = [], []
    for k in range(passes):
        wall, cpu = time.perf_counter(), time.process_time()
        previous = _one_pass(pool, pods, previous, now=1_780_000_000.0 + 15 * k, rng=rng, steps=steps)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {  # the first pass has no previous status: reported apart
        "replicas": replicas,
        "passes": passes,
        "pass_cpu_ms_median": _median_ms(cpus[1:] or cpus),
        "pass_cpu_ms_max": round(1000 * max(cpus), 1),
        "pass_wall_ms_median": _median_ms(walls[1:] or walls),
        "pass_cpu_ms_first": round(1000 * cpus[0], 1),
        "steps_cpu_ms_median": {k: _median_ms(v[1:] or v) for k, v in steps.items()},
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m rolloutpool.dev.bench.scale``: print (and optionally write) both figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m rolloutpool.dev.bench.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=20_000, help="Placements measured at full size.")
    parser.add_argument("--passes", type=int, default=20, help="Operator passes timed.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-router", action="store_true")
    parser.add_argument("--skip-operator", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"measured_at": datetime.now(tz=UTC).isoformat(timespec="seconds")}
    if not args.skip_operator:  # first: its figures do not depend on the router's 100k sessions in memory
        result["operator"] = operator_pass(replicas=args.replicas, passes=args.passes, seed=args.seed)
    if not args.skip_router:
        result["router"] = router_scale(
            replicas=args.replicas, sessions=args.sessions, samples=args.samples, seed=args.seed
        )
        result["scrape"] = router_scrape(replicas=args.replicas, sessions=args.sessions, seed=args.seed)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
