"""``rolloutpool bench --overhead-only``: per-request cost of our router next to vllm-router, measured with wrk.

Two instant engine stand-ins (:mod:`rolloutpool.dev.bench.instant`) sit behind our
router (``--cap 100000``) and vllm-router (``--policy sticky_least_loaded``); the
third target is a stand-in itself ("direct"). wrk (1 thread) drives each target in
turn, the order rotating every round, so that the machine's drifting load hits every
target alike; figures are medians over rounds. Two bodies: small (a 50-byte
completion request, 32 connections) and large (a 24k-token prompt, about 200 KB,
16 connections, what an RL turn's context looks like).

Then, at half of vllm-router's measured saturation rate (per body size), the
fixed-rate pass (:mod:`rolloutpool.dev.bench.wrk` describes the pacing) gives each
router's added p50 over direct, taken round by round. The CPU time (user + system,
from ``/proc``) each router process spent per request is reported too: unlike
req/s it hardly depends on what else runs on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rolloutpool.dev.bench.peers import RouterLaunch, vllm_router_argv
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.bench.wrk import WrkResult, acceptance, lua_script, median_of, parse_wrk
from rolloutpool.dev.net import LOOPBACK, free_port
from rolloutpool.dev.processes import pid_alive

__all__ = ["DIRECT", "OURS", "PEER", "OverheadOnlyConfig", "run_overhead_only"]

DIRECT, OURS, PEER = "direct", "rolloutpool", "vllm-router-sll"
_SIZES = ("small", "large")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class OverheadOnlyConfig:
    """Knobs of the wrk overhead benchmark."""

    out_dir: Path
    vllm_router_bin: str | None
    """None: measure our router against direct only."""
    rounds: int = 3
    duration_s: float = 8.0
    small_connections: int = 32
    large_connections: int = 16
    large_prompt_tokens: int = 24000
    fixed_rate: bool = True
    wrk_bin: str = "wrk"
    ready_timeout_s: float = 60.0


def _bodies(out: Path, prompt_tokens: int) -> dict[str, Path]:
    small = {"model": "m", "prompt": "hello world", "max_tokens": 8}
    large = {"model": "m", "prompt": " ".join(f"tok{i}" for i in range(prompt_tokens)), "max_tokens": 8}
    paths = {}
    for name, body in (("small", small), ("large", large)):
        path = out / f"body-{name}.json"
        path.write_text(json.dumps(body))
        paths[name] = path
    return paths


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(") ", 1)[1].split()
    except OSError:  # no procfs: no CPU figure
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Runner:
    def __init__(self, config: OverheadOnlyConfig, targets: dict[str, str], pids: dict[str, int]) -> None:
        self.config = config
        self.targets = targets
        self.pids = pids
        self.log = config.out_dir / "wrk"
        self.log.mkdir(parents=True, exist_ok=True)

    def wrk(self, target: str, script: Path, connections: int, tag: str) -> tuple[WrkResult, float]:
        """One wrk run; returns its figures and the target process's CPU microseconds per request."""
        cfg = self.config
        argv = [cfg.wrk_bin, "-t1", f"-c{connections}", f"-d{cfg.duration_s:g}s", "--latency", "-s", str(script)]
        pid = self.pids.get(target)
        before = _cpu_s(pid) if pid else float("nan")
        done = subprocess.run(  # noqa: PLW1510 - the output is parsed; a failed run raises there
            [*argv, self.targets[target]], capture_output=True, text=True, timeout=cfg.duration_s + 60
        )
        after = _cpu_s(pid) if pid else float("nan")
        (self.log / f"{tag}-{target}.txt").write_text(done.stdout + done.stderr)
        result = parse_wrk(done.stdout)
        cpu_us = (after - before) * 1e6 / result.requests if result.requests else float("nan")
        return result, cpu_us


def _start(config: OverheadOnlyConfig, procs: ProcessSet) -> tuple[dict[str, str], dict[str, int]]:
    workers = []
    for i in range(2):
        port = free_port()
        url = f"http://{LOOPBACK}:{port}"
        argv = [rolloutpool_argv()[0], "-m", "rolloutpool.dev.bench.instant", str(port)]
        procs.start(f"instant-{i}", argv, ready_url=f"{url}/health", timeout_s=config.ready_timeout_s)
        workers.append(url)
    targets, pids = {DIRECT: workers[0]}, {}
    port = free_port()
    argv = rolloutpool_argv(
        "router", "--host", LOOPBACK, "--port", str(port), "--cap", "100000", "--queue-max", "100000",
        "--no-state", "--replica", f"a={workers[0]}", "--replica", f"b={workers[1]}",
    )  # fmt: skip
    ours = procs.start(OURS, argv, ready_url=f"http://{LOOPBACK}:{port}/readyz", timeout_s=config.ready_timeout_s)
    targets[OURS], pids[OURS] = f"http://{LOOPBACK}:{port}", ours.pid
    if config.vllm_router_bin is not None:
        launch = RouterLaunch(
            replica_urls=tuple(workers),
            port=free_port(),
            kv_capacity_tokens=1 << 20,
            max_model_len=None,
            time_scale=1.0,
            scrape_interval_s=1.0,
            queue_timeout_s=60.0,
            prometheus_port=free_port(),
        )
        argv = vllm_router_argv("vllm-sticky-least-loaded", launch, binary=config.vllm_router_bin)
        url = f"http://{LOOPBACK}:{launch.port}"
        peer = procs.start(PEER, argv, ready_url=f"{url}/health", timeout_s=config.ready_timeout_s)
        targets[PEER], pids[PEER] = url, peer.pid
    return targets, pids


def run_overhead_only(config: OverheadOnlyConfig, progress: Progress) -> dict[str, Any]:
    """Run both passes; writes ``summary.json`` and ``summary.md`` into ``out_dir`` and returns the summary."""
    if shutil.which(config.wrk_bin) is None:
        raise RuntimeError(f"{config.wrk_bin!r} not found (Debian: apt-get install -y wrk)")
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    bodies = _bodies(out, config.large_prompt_tokens)
    conns = {"small": config.small_connections, "large": config.large_connections}
    scripts = {}
    for size in _SIZES:
        scripts[size] = out / f"saturate-{size}.lua"
        scripts[size].write_text(lua_script(body_path=str(bodies[size].resolve())))
    with ProcessSet(out / "logs") as procs:
        targets, pids = _start(config, procs)
        runner = _Runner(config, targets, pids)
        names = list(targets)
        sat: dict[str, dict[str, list[WrkResult]]] = {s: {n: [] for n in names} for s in _SIZES}
        cpu: dict[str, dict[str, list[float]]] = {s: {n: [] for n in names} for s in _SIZES}
        for r in range(config.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for size in _SIZES:
                for name in order:
                    result, cpu_us = runner.wrk(name, scripts[size], conns[size], f"saturate-{size}-r{r + 1}")
                    sat[size][name].append(result)
                    cpu[size][name].append(cpu_us)
                    progress(f"saturation {size} round {r + 1}: {name} {result.requests_per_s:,.0f} req/s")
        medians = {s: {n: median_of(v) for n, v in rows.items()} for s, rows in sat.items()}
        added, fixed = (
            _fixed_rate(
                config, runner=runner, names=names, medians=medians, bodies=bodies, conns=conns, progress=progress
            )
            if config.fixed_rate
            else ({}, {})
        )
    summary = _summary(config, targets=targets, medians=medians, cpu=cpu, added=added, fixed=fixed)
    summary["leftover_pids"] = [pid for pid in procs.pids if pid_alive(pid)]
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(markdown(summary))
    return summary


def _fixed_rate(
    config: OverheadOnlyConfig,
    *,
    runner: _Runner,
    names: list[str],
    medians: dict[str, dict[str, WrkResult]],
    bodies: dict[str, Path],
    conns: dict[str, int],
    progress: Progress,
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, Any]]]:
    added: dict[str, dict[str, float]] = {}
    fixed: dict[str, dict[str, Any]] = {}
    for size in _SIZES:
        reference = PEER if PEER in medians[size] else OURS
        rate = 0.5 * medians[size][reference].requests_per_s
        script = config.out_dir / f"fixed-{size}.lua"
        script.write_text(lua_script(body_path=str(bodies[size].resolve()), delay_ms=1000.0 * conns[size] / rate))
        runs: dict[str, list[WrkResult]] = {n: [] for n in names}
        deltas: dict[str, list[float]] = {n: [] for n in names if n != DIRECT}
        for r in range(config.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            got = {n: runner.wrk(n, script, conns[size], f"fixed-{size}-r{r + 1}")[0] for n in order}
            for n, result in got.items():
                runs[n].append(result)
                if n != DIRECT:
                    deltas[n].append(result.p50_ms - got[DIRECT].p50_ms)
            progress(f"fixed rate {size} ({rate:,.0f} req/s offered) round {r + 1} done")
        added[size] = {n: statistics.median(d) for n, d in deltas.items()}
        fixed[size] = {"offered_per_s": rate, "of": reference, **{n: asdict(median_of(v)) for n, v in runs.items()}}
    return added, fixed


def _summary(
    config: OverheadOnlyConfig,
    *,
    targets: dict[str, str],
    medians: dict[str, dict[str, WrkResult]],
    cpu: dict[str, dict[str, list[float]]],
    added: dict[str, dict[str, float]],
    fixed: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    checks = acceptance(medians, {s: a[OURS] for s, a in added.items() if OURS in a}, ours=OURS, peer=PEER)
    return {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "targets": list(targets),
        "saturation": {s: {n: asdict(r) for n, r in rows.items()} for s, rows in medians.items()},
        "cpu_us_per_request": {
            s: {n: statistics.median(v) for n, v in rows.items() if n != DIRECT} for s, rows in cpu.items()
        },
        "fixed_rate": fixed,
        "added_p50_ms": added,
        "acceptance": [asdict(c) for c in checks],
    }


def markdown(summary: dict[str, Any]) -> str:
    """The summary as Markdown tables."""
    lines = ["# Router overhead (wrk, medians over rounds)", ""]
    lines += [
        "| body | target | req/s | p50 ms | p99 ms | CPU us/req | non-2xx |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for size, rows in summary["saturation"].items():
        for name, r in rows.items():
            cpu = summary["cpu_us_per_request"][size].get(name)
            cpu_text = "" if cpu is None else f"{cpu:.0f}"
            lines.append(
                f"| {size} | {name} | {r['requests_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                f"{cpu_text} | {r['non_2xx'] + r['socket_errors']} |"
            )
    if summary["added_p50_ms"]:
        lines += ["", "| body | offered req/s | target | added p50 over direct (ms) |", "|---|---:|---|---:|"]
        for size, rows in summary["added_p50_ms"].items():
            for name, value in rows.items():
                lines.append(f"| {size} | {summary['fixed_rate'][size]['offered_per_s']:,.0f} | {name} | {value:.2f} |")
    lines += ["", "| acceptance | value | target | met |", "|---|---:|---|---|"]
    for c in summary["acceptance"]:
        lines.append(f"| {c['name']} | {c['value']:.2f} | {c['target']} | {'yes' if c['passed'] else 'NO'} |")
    return "\n".join(lines) + "\n"
