"""Run the benchmark: each router configuration on fresh engine-sim processes, same workload.

For every configuration: start ``replicas`` engine-sim processes (same seed), start
the router in front of them, drive the RL-style client for the measured window,
read the engines' counters at the window's start and end, stop everything and check
by pid that nothing is left. Then, optionally, the router overhead measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import Callable

import aiohttp

from rolloutpool.api import vllm_metrics as vm
from rolloutpool.dev.bench.adaptive import bench_pool_spec, samples
from rolloutpool.dev.bench.adaptive_loop import LawLoop, admin_token
from rolloutpool.dev.bench.client import ClientConfig, ClientResult, queued_mean, run_client, write_turns
from rolloutpool.dev.bench.config import (
    ENGINE_HARDWARE,
    LAG_WARNING_PCT,
    BenchConfig,
    BenchResult,
    RouterRun,
    describe,
)
from rolloutpool.dev.bench.kv_residency import kv_events_config
from rolloutpool.dev.bench.overhead import DIRECT, OverheadConfig, OverheadRow, measure_overhead, percentile
from rolloutpool.dev.bench.peers import (
    ADAPTIVE,
    CONTINUUM,
    OUR_ROUTERS,
    TURN_SCHEDULERS,
    RouterLaunch,
    our_router_argv,
    vllm_router_argv,
)
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.net import LOOPBACK, free_port
from rolloutpool.dev.processes import pid_alive
from rolloutpool.engine.server.instruments import LAG_SECONDS

__all__ = ["metric_totals", "run_bench", "run_overhead", "run_router"]

Progress = Callable[[str], None]
GROUP_HEADER = "X-Session-Group"
"""Our router's group hint (its default ``group_header``); vllm-router ignores it."""

_COUNTERS = (
    vm.total(vm.GENERATION_TOKENS),
    vm.total(vm.NUM_PREEMPTIONS),
    vm.total(vm.PREFIX_CACHE_HITS),
    vm.total(vm.PREFIX_CACHE_QUERIES),
    vm.total(LAG_SECONDS),
)


def metric_totals(text: str, names: tuple[str, ...] = _COUNTERS) -> dict[str, float]:
    """Each metric in ``names`` summed over its label sets, from Prometheus text (pure)."""
    totals = dict.fromkeys(names, 0.0)
    for name, _, value in samples(text):
        if name in totals:
            totals[name] += value
    return totals


async def _scrape(http: aiohttp.ClientSession, urls: list[str]) -> dict[str, float]:
    totals = dict.fromkeys(_COUNTERS, 0.0)
    for url in urls:
        async with http.get(f"{url}/metrics") as response:
            for name, value in metric_totals(await response.text()).items():
                totals[name] += value
    return totals


async def _drive(
    engine_urls: list[str], client: ClientConfig, law: LawLoop | None = None
) -> tuple[ClientResult, dict[str, float]]:
    """Run the client (and the law, if any); return its result and the engines' counter deltas over the window."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        law_task = None
        if law is not None:
            await law.start(http)
            law_task = asyncio.create_task(law.run(http))
        try:
            before = await _scrape(http, engine_urls)

            async def at_deadline() -> dict[str, float]:
                await asyncio.sleep(client.duration_s)
                return await _scrape(http, engine_urls)

            after_task = asyncio.create_task(at_deadline())
            result = await run_client(client)
            after = await after_task
        finally:
            if law_task is not None:
                law_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await law_task
    return result, {k: after[k] - before[k] for k in _COUNTERS}


def _summarize(name: str, config: BenchConfig, result: ClientResult, deltas: dict[str, float]) -> RouterRun:
    ts = config.time_scale
    window = result.window_end - result.window_start
    sim_window = window * ts
    times = [t for t in (r.sim_seconds(ts) for r in result.completed) if t is not None]
    queries = deltas[vm.total(vm.PREFIX_CACHE_QUERIES)]
    prefill = sum(t.prompt_tokens - t.cached_tokens for t in result.turns)
    waits = [
        (r.first_turn_at - r.started) * ts
        for r in result.trajectories
        if r.first_turn_at is not None and r.first_turn_at <= result.window_end
    ]
    return RouterRun(
        router=name,
        in_flight=config.resolved_in_flight,
        window_wall_s=window,
        generated_tokens=round(deltas[vm.total(vm.GENERATION_TOKENS)]),
        tokens_per_s=deltas[vm.total(vm.GENERATION_TOKENS)] / sim_window if sim_window else 0.0,
        started=len(result.trajectories),
        completed=len(result.completed),
        completed_per_hour=len(result.completed) / sim_window * 3600 if sim_window else 0.0,
        turns=len(result.turns),
        reprefilled_tokens=result.reprefilled_tokens,
        prompt_tokens=sum(t.prompt_tokens for t in result.turns),
        cached_tokens=sum(t.cached_tokens for t in result.turns),
        preemptions=round(deltas[vm.total(vm.NUM_PREEMPTIONS)]),
        prefix_hit_ratio=deltas[vm.total(vm.PREFIX_CACHE_HITS)] / queries if queries else 0.0,
        p50_trajectory_s=statistics.median(times) if times else None,
        p90_trajectory_s=percentile(times, 0.9) if times else None,
        retries=result.retries,
        errors=result.errors,
        finish_failures=result.finish_failures,
        pids=[],
        leftover_pids=[],
        prefill_tokens=prefill,
        evicted_pct=100.0 * result.reprefilled_tokens / prefill if prefill else 0.0,
        first_turn_p50_s=statistics.median(waits) if waits else None,
        first_turn_p90_s=percentile(waits, 0.9) if waits else None,
        queued_mean=queued_mean(result.trajectories, window_start=result.window_start, window_end=result.window_end),
        engine_lag_pct=100.0 * deltas[vm.total(LAG_SECONDS)] / (sim_window * config.replicas) if sim_window else 0.0,
    )


def _engine_argv(
    config: BenchConfig,
    port: int,
    *,
    time_scale: float,
    kv_tokens: int,
    continuum: str | None = None,
    kv_events: tuple[int, int] | None = None,
) -> list[str]:
    pins = [] if continuum is None else ["--continuum", continuum]  # Continuum's engines (a peer)
    events = [] if kv_events is None else ["--kv-events-config", kv_events_config(*kv_events)]
    return [*_plain_engine_argv(config, port, time_scale=time_scale, kv_tokens=kv_tokens), *pins, *events]


def _plain_engine_argv(config: BenchConfig, port: int, *, time_scale: float, kv_tokens: int) -> list[str]:
    return rolloutpool_argv(
        "engine-sim",
        "--host", LOOPBACK,
        "--port", str(port),
        "--time-scale", str(time_scale),
        "--kv-capacity-tokens", str(kv_tokens),
        "--max-model-len", str(config.max_model_len),
        "--seed", str(config.engine_seed),
        "--hardware", ENGINE_HARDWARE,
        "--prefill-cost-scale", f"{config.prefill_cost_scale:g}",
    )  # fmt: skip


def _start_router(procs: ProcessSet, name: str, launch: RouterLaunch, config: BenchConfig) -> str:
    url = f"http://{LOOPBACK}:{launch.port}"
    if name in OUR_ROUTERS or name in TURN_SCHEDULERS:
        scheduler = name if name in TURN_SCHEDULERS else None
        argv = our_router_argv(launch, prefix=rolloutpool_argv(), turn_scheduler=scheduler)
        procs.start(name, argv, ready_url=f"{url}/readyz", timeout_s=config.ready_timeout_s)
    else:
        argv = vllm_router_argv(name, launch, binary=config.vllm_router_bin)
        procs.start(name, argv, ready_url=f"{url}/health", timeout_s=config.ready_timeout_s)
    return url


def _launch(
    config: BenchConfig,
    engine_urls: list[str],
    *,
    kv_tokens: int,
    max_model_len: int | None,
    admin_token_file: str | None = None,
    kv_events: tuple[str, ...] = (),
) -> RouterLaunch:
    cost = config.engine_cost  # vllm-router's program scheduling is calibrated to it
    return RouterLaunch(
        replica_urls=tuple(engine_urls),
        port=free_port(),
        kv_capacity_tokens=kv_tokens,
        max_model_len=max_model_len,
        time_scale=config.time_scale,
        scrape_interval_s=config.scrape_interval_s,
        queue_timeout_s=config.queue_timeout_s,
        typical_prefill_tokens=config.typical_prefill_tokens,
        cost=cost,
        prometheus_port=free_port(),
        admin_token_file=admin_token_file,
        kv_events=kv_events,
        renew_every_s=None if config.renew_every_s is None else config.renew_every_s / config.time_scale,
    )


def run_router(name: str, config: BenchConfig, progress: Progress) -> RouterRun:
    """One configuration on fresh engines; every process is gone when it returns."""
    procs = ProcessSet(config.out_dir / "logs" / name)
    with procs:
        engine_urls, subscriptions = [], []
        for i in range(config.replicas):
            port = free_port()
            events = (free_port(), free_port()) if config.kv_events else None
            argv = _engine_argv(
                config, port, time_scale=config.time_scale, kv_tokens=config.kv_capacity_tokens,
                continuum=CONTINUUM.get(name), kv_events=events,
            )  # fmt: skip
            url = f"http://{LOOPBACK}:{port}"
            procs.start(f"engine-{i}", argv, ready_url=f"{url}/health", timeout_s=config.ready_timeout_s)
            engine_urls.append(url)
            if events is not None:
                subscriptions.append(f"r{i}=tcp://{LOOPBACK}:{events[0]},tcp://{LOOPBACK}:{events[1]}")
        token, token_file = admin_token(procs.log_dir) if name == ADAPTIVE else (None, None)
        launch = _launch(
            config,
            engine_urls,
            kv_tokens=config.kv_capacity_tokens,
            max_model_len=config.max_model_len,
            admin_token_file=None if token_file is None else str(token_file),
            kv_events=tuple(subscriptions),
        )
        router_url = _start_router(procs, name, launch, config)
        law = None
        if token is not None:
            spec = bench_pool_spec(
                replicas=config.replicas,
                max_model_len=config.max_model_len,
                kv_capacity_tokens=config.kv_capacity_tokens,
                time_scale=config.time_scale,
            )
            law = LawLoop.for_router(spec, engine_urls, router_url=router_url, admin_token=token)
        progress(
            f"{name}: {config.replicas} engines and the router are ready; "
            f"driving {config.resolved_in_flight} trajectories for {config.duration_s:.0f} s"
        )
        client = ClientConfig(
            base_url=router_url,
            scenario=config.scenario,
            seed=config.seed,
            in_flight=config.resolved_in_flight,
            duration_s=config.duration_s,
            time_scale=config.time_scale,
            group_header=GROUP_HEADER if config.group_hint else None,
        )
        result, deltas = asyncio.run(_drive(engine_urls, client, law))
        write_turns(config.out_dir / f"turns-{name}.jsonl", result)
        pids = procs.pids
    run = _summarize(name, config, result, deltas)
    if law is not None:
        run.law = law.report()
    run.pids = pids
    run.leftover_pids = [pid for pid in pids if pid_alive(pid)]
    progress(
        f"{name}: {run.generated_tokens:,} tokens generated, {run.completed} trajectories completed, "
        f"{run.reprefilled_tokens:,} tokens re-prefilled, {run.preemptions} preemptions"
        + ("" if run.law is None else f"; law: {run.law['cuts']} cuts, {run.law['raises']} raises, "
           f"mean final cap {run.law['mean_final_cap']:.1f}")
    )  # fmt: skip
    if run.engine_lag_pct > LAG_WARNING_PCT:
        progress(
            f"{name}: warning: the engines lost {run.engine_lag_pct:.1f} % of the window behind time scale "
            f"{config.time_scale:g} (CPU short): tokens/s are low and ratios skewed; try a lower --time-scale"
        )
    return run


def run_overhead(
    config: BenchConfig, overhead: OverheadConfig, progress: Progress
) -> tuple[list[OverheadRow], list[int]]:
    """Every router in front of one fast engine-sim, against the engine directly; returns leftover pids too."""
    procs = ProcessSet(config.out_dir / "logs" / "overhead")
    kv_tokens = 262144
    with procs:
        port = free_port()
        engine_url = f"http://{LOOPBACK}:{port}"
        argv = _engine_argv(config, port, time_scale=10000.0, kv_tokens=kv_tokens)
        procs.start("engine", argv, ready_url=f"{engine_url}/health", timeout_s=config.ready_timeout_s)
        targets = {DIRECT: engine_url}
        for name in config.routers:
            launch = _launch(config, [engine_url], kv_tokens=kv_tokens, max_model_len=None)
            targets[name] = _start_router(procs, name, launch, config)
        progress(
            f"overhead: {len(targets)} targets ready; {overhead.rounds} interleaved rounds of "
            f"{overhead.slice_s:g} s each at concurrency {overhead.concurrency}"
        )
        rows = asyncio.run(
            measure_overhead(targets, overhead, on_round=lambda r, n: progress(f"overhead: round {r}/{n} done"))
        )
        pids = procs.pids
    return rows, [pid for pid in pids if pid_alive(pid)]


def run_bench(config: BenchConfig, progress: Progress) -> BenchResult:
    """Every configuration in turn, then the overhead measurement."""
    runs = [run_router(name, config, progress) for name in config.routers]
    rows: list[OverheadRow] = []
    if config.overhead is not None:
        rows, leftovers = run_overhead(config, config.overhead, progress)
        if leftovers:
            progress(f"overhead: processes left behind: {leftovers}")
    return BenchResult(config=describe(config), runs=runs, overhead=rows)
