"""``rolloutpool demo``: the whole stack on one machine, and the same load under sticky least-loaded beside it.

Starts (or reuses the cached build of) the local control plane, the process kubelet and
Prometheus, ``helm install``s the chart (the operator runs as a pod under its own RBAC) and
applies a simulated RolloutPool with adaptive concurrency. Beside it, vllm-router's sticky
least-loaded policy runs over engine-sims started with the pool's engine flags. The same
agentic rollouts (scenario, seed, in-flight count) drive both sides at once while a live
table shows the pool and both sides' figures; the engines and our router are sampled every
two seconds. After the load (and the release of any quarantine) it prints both sides'
totals, writes the timeline (JSON) and its picture (PNG) beside the logs, and stops every
process on exit or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from rolloutpool.dev.bench.client import ClientConfig, ClientResult, run_client
from rolloutpool.dev.demo.figures import Point, Side, SideSummary, headline, ratio_text, summarize, throughput
from rolloutpool.dev.demo.peer import PEER, StickyPeer
from rolloutpool.dev.demo.picture import draw
from rolloutpool.dev.demo.scrape import engine_totals, router_gauges
from rolloutpool.dev.stack import TRANSIENT_ERRORS, LocalStack
from rolloutpool.dev.wait import wait_until
from rolloutpool.sim.workload import scenario

__all__ = ["DemoPhases", "demo_pool", "examples_dir", "pool_table", "run_demo", "summary_table"]

POOL = "demo"
"""Name of the demo's RolloutPool (namespace ``default``)."""


def examples_dir() -> Path:
    """The checkout's ``examples/`` folder (the demo runs from a checkout)."""
    path = Path(__file__).resolve().parents[4] / "examples"
    if not path.is_dir():
        raise FileNotFoundError(f"examples folder not found at {path}; run the demo from a RolloutPool checkout")
    return path


def demo_pool(
    *,
    prometheus_url: str,
    replicas: int = 3,
    time_scale: float = 5.0,
    kv_capacity_tokens: int = 262144,
    max_model_len: int = 32768,
) -> dict[str, Any]:
    """The embedded default pool: simulated H100s whose caches the demo's rollouts overfill (pure).

    A 32k window and 262,144 KV tokens hold 8 rollouts at the window per replica; the demo's 96 agentic GRPO
    rollouts on 3 replicas are 4x that, as an RL step starts them all at once. The end-to-end tests that drive
    short rollouts of their own ask for a smaller cache and window.
    """
    return {
        "apiVersion": "rolloutpool.io/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": POOL},
        "spec": {
            "replicas": replicas,
            "engine": {
                "kind": "simulated",
                "model": "Qwen/Qwen3-8B",
                "maxModelLen": max_model_len,
                "gpusPerReplica": 0,
                "kvCapacityTokens": kv_capacity_tokens,
                "simulator": {"hardware": "h100-80gb", "timeScale": time_scale},
            },
            # the routers schedule turns so each replica's working set fits 90 % of its cache (the law tunes it);
            # 32 sessions per replica at most, the demo's 96 rollouts over 3 replicas
            "concurrency": {"workingSetTarget": 0.9, "maxSessionsPerReplica": 32},
            "router": {"replicas": 1, "idleTimeoutSeconds": 30, "queueTimeoutSeconds": 30},
            "autoscaling": {
                "enabled": True,
                "prometheusUrl": prometheus_url,
                "intervalSeconds": 5,
                "cooldownSeconds": 10,
            },
            "updateStrategy": {"drainTimeoutSeconds": 60},
        },
    }


def pool_table(pool: dict[str, Any]) -> Group:
    """A rich rendering of a pool's status: one row per replica, then the conditions (pure)."""
    status = pool.get("status") or {}
    head = (
        f"[bold]{pool['metadata']['name']}[/]  replicas {status.get('readyReplicas', 0)}/{status.get('replicas', 0)}"
        f"  live {status.get('liveSessions', 0)}  queued {status.get('queuedSessions', 0)}"
        f"  quarantined {status.get('quarantinedReplicas', 0)}"
    )
    replicas = Table(
        "replica", "ready", "live", "target", "held", "kept", "KV usage", "quarantined", "reason", box=None
    )
    for r in status.get("replicaStatus") or []:
        usage = r.get("kvUsage")
        replicas.add_row(
            r.get("name", "?"),
            "yes" if r.get("ready") else "no",
            str(r.get("liveSessions", 0)),
            "-" if r.get("target") is None else f"{r['target']:.0%}",
            str(r.get("heldTurns", 0)),
            str(r.get("keptSessions", 0)),
            "-" if usage is None else f"{usage:.0%}",
            _quarantine_cell(r),
            r.get("reason") or r.get("routerReason") or "",
        )
    conditions = Table("condition", "status", "reason", "message", box=None)
    for c in status.get("conditions") or []:
        colour = (
            "green" if (c.get("status") == "True") != (c.get("type") in {"Degraded", "ReplicasQuarantined"}) else "red"
        )
        conditions.add_row(
            c.get("type", "?"), f"[{colour}]{c.get('status')}[/]", c.get("reason", ""), c.get("message", "")
        )
    return Group(head, replicas, conditions)


def _quarantine_cell(replica: dict[str, Any]) -> str:
    """Who quarantines a replica: the operator's law, a router's fast loop, both, or nobody (pure)."""
    by = [who for who, key in (("operator", "quarantined"), ("router", "routerQuarantined")) if replica.get(key)]
    return f"[red]yes[/] ({' and '.join(by)})" if by else "no"


@dataclass
class DemoPhases:
    """What the demo saw: samples of the pool status over time, and the phase boundaries."""

    started: float = field(default_factory=time.time)
    samples: list[dict[str, Any]] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)
    peer_pids: list[int] = field(default_factory=list)
    """The sticky least-loaded side's processes (all stopped before the timeline is written)."""

    def mark(self, name: str) -> None:
        """Record when a phase began."""
        self.marks[name] = time.time() - self.started

    def write(
        self, directory: Path, sides: tuple[Side, Side], *, time_scale: float, replicas: int
    ) -> tuple[Path, Path]:
        """Write ``timeline.json`` (pool status and both sides) and ``timeline.png`` (the picture); their paths."""
        summaries = _summaries(sides, time_scale=time_scale, replicas=replicas)
        data = directory / "timeline.json"
        data.write_text(
            json.dumps(
                {
                    "marks": self.marks,
                    "samples": self.samples,
                    "peer_pids": self.peer_pids,
                    "sides": {s.name: asdict(s) for s in sides},
                    "summary": {s.name: asdict(x) for s, x in zip(sides, summaries, strict=True)},
                },
                indent=1,
            )
        )
        picture = draw(*sides, summaries, time_scale=time_scale, replicas=replicas, out=directory / "timeline.png")
        return data, picture


def _summaries(sides: tuple[Side, Side], *, time_scale: float, replicas: int) -> tuple[SideSummary, SideSummary]:
    ours, peer = (summarize(s, time_scale=time_scale, replicas=replicas) for s in sides)
    return ours, peer


def _sample(stack: LocalStack, phases: DemoPhases) -> dict[str, Any] | None:
    try:
        pool = stack.pool(POOL)
    except RuntimeError:
        return None
    status = pool.get("status") or {}
    phases.samples.append(
        {
            "t": round(time.time() - phases.started, 2),
            "replicas": status.get("replicaStatus") or [],
            "conditions": {c["type"]: [c["status"], c.get("reason")] for c in status.get("conditions") or []},
        }
    )
    return pool


def _load(url: str, *, in_flight: int, seconds: float, time_scale: float) -> ClientResult:
    """The demo's rollouts against ``url``: the same scenario, seed and in-flight count on both sides."""
    config = ClientConfig(
        base_url=url,
        scenario=scenario("agentic-grpo"),
        seed=0,
        in_flight=in_flight,
        duration_s=seconds,
        time_scale=time_scale,
    )
    return asyncio.run(run_client(config))


def _quarantined(pool: dict[str, Any] | None) -> bool:
    for c in ((pool or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "ReplicasQuarantined":
            return bool(c.get("status") == "True")
    return False


def _engine_urls(stack: LocalStack, replicas: int) -> list[str] | None:
    """The pool's engines' base URLs from its status, once every replica has one."""
    status = stack.pool(POOL).get("status") or {}
    urls = [r["endpoint"] for r in status.get("replicaStatus") or [] if r.get("endpoint")]
    return urls if len(urls) == replicas else None


@dataclass(frozen=True)
class _Target:
    side: Side
    router_url: str
    engine_urls: list[str]
    ours: bool


def _read(target: _Target, t: float) -> None:
    """Append one sample of a side; a side that does not answer this time is skipped."""
    try:
        engines = engine_totals(target.engine_urls)
        router = router_gauges(target.router_url) if target.ours else None
    except (OSError, ValueError):
        return
    target.side.points.append(Point(round(t, 2), engines, router))


def _sampler(targets: list[_Target], t0: float, done: threading.Event, interval: float = 2.0) -> None:
    while True:
        for target in targets:
            _read(target, time.monotonic() - t0)
        if done.wait(interval):
            for target in targets:  # the end of the load window
                _read(target, time.monotonic() - t0)
            return


def _live_lines(sides: tuple[Side, ...], time_scale: float) -> str:
    """Both sides so far, one line each (from the samples)."""
    lines = []
    for side in sides:
        if len(side.points) < 2:
            continue
        first, last = side.points[0], side.points[-1]
        _, rates = throughput(side.points[-4:], time_scale=time_scale)
        rate = sum(rates) / len(rates) if rates else 0.0
        line = (
            f"[bold]{side.label:<22}[/] {last.engines.generated - first.engines.generated:>10,.0f} tokens generated"
            f" ({rate:,.0f}/s now), {last.engines.preemptions - first.engines.preemptions:>6,.0f} preemptions"
        )
        if last.router is not None:
            held = last.router.held_total - (first.router or last.router).held_total
            line += f", {last.router.held} turns held now, {held:,} in all"
        lines.append(line)
    return "\n".join(lines)


def run_demo(
    *,
    directory: Path,
    once: bool,
    console: Console,
    in_flight: int = 96,
    load_seconds: float = 90.0,
    time_scale: float = 5.0,
) -> None:
    """The whole demo (see the module docstring); ``once`` ends after the load (and a quarantine's release)."""
    stop = threading.Event()
    # explicit handlers: a demo started in the background of a script inherits an
    # ignored SIGINT, and Ctrl-C or `kill` must still stop it cleanly
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    phases = DemoPhases()
    sides = (Side("rolloutpool", "RolloutPool"), Side(PEER, "sticky least-loaded"))
    with LocalStack(directory, log=console.log) as stack:
        manifest = demo_pool(prometheus_url=stack.prometheus_url, time_scale=time_scale)
        replicas = int(manifest["spec"]["replicas"])
        console.log(stack.apply(yaml.safe_dump(manifest)))
        wait_until(lambda: _ready(stack), what="pool Ready", timeout=300, interval=0.5, ignore=TRANSIENT_ERRORS)
        url = wait_until(
            lambda: stack.router_url(POOL), what="router endpoint", timeout=120, interval=0.5, ignore=TRANSIENT_ERRORS
        )
        engines = wait_until(
            lambda: _engine_urls(stack, replicas),
            what="engine endpoints",
            timeout=120,
            interval=0.5,
            ignore=TRANSIENT_ERRORS,
        )
        load = _Load(in_flight=in_flight, seconds=load_seconds, time_scale=time_scale)
        with StickyPeer(manifest, stack.directory / PEER) as peer:
            phases.peer_pids = peer.procs.pids
            console.log(
                f"Pool ready; router at {url}. Beside it: vllm-router --policy sticky_least_loaded at "
                f"{peer.router_url} over {replicas} engine-sims started with the pool's engine flags"
            )
            console.log(f"starting {in_flight} rollouts on each side for {load_seconds:.0f}s (same scenario and seed)")
            targets = [
                _Target(sides[0], url, engines, ours=True),
                _Target(sides[1], peer.router_url, peer.engine_urls, ours=False),
            ]
            seen_quarantine = _side_by_side(stack, phases, targets, load, console=console, stop=stop)
        # the peer is stopped: the pool has the machine to itself while a quarantine clears
        _release(stack, phases, seen_quarantine, once=once, console=console, stop=stop)
        _report(console, stack, phases, sides, seen_quarantine, time_scale=time_scale, replicas=replicas)
    console.log("Stopped the stack; no processes left behind.")


@dataclass(frozen=True)
class _Load:
    in_flight: int
    seconds: float
    time_scale: float


def _side_by_side(
    stack: LocalStack,
    phases: DemoPhases,
    targets: list[_Target],
    load: _Load,
    *,
    console: Console,
    stop: threading.Event,
) -> bool:
    """Drive both sides at once, sampling them; fill each side's turns; whether the pool showed a quarantine."""
    results: dict[str, ClientResult] = {}

    def drive(target: _Target) -> None:
        results[target.side.name] = _load(
            target.router_url, in_flight=load.in_flight, seconds=load.seconds, time_scale=load.time_scale
        )

    phases.mark("load")
    t0 = time.monotonic()
    for target in targets:
        _read(target, 0.0)
    loaders = [threading.Thread(target=drive, args=(t,), daemon=True) for t in targets]
    sampled = threading.Event()
    sampler = threading.Thread(target=_sampler, args=(targets, t0, sampled), daemon=True)
    for thread in (*loaders, sampler):
        thread.start()
    seen_quarantine = False
    sides = tuple(t.side for t in targets)
    with Live(console=console, refresh_per_second=1) as live:
        while any(t.is_alive() for t in loaders) and not stop.is_set():
            pool = _sample(stack, phases)
            if pool is not None:
                live.update(Group(pool_table(pool), "", _live_lines(sides, load.time_scale)))
            seen_quarantine |= _quarantined(pool)
            stop.wait(2.0)
    sampled.set()
    sampler.join(timeout=30)
    phases.mark("released")
    for target in targets:
        result = results.get(target.side.name)
        if result is not None:
            target.side.turns = [(round(t.at - t0, 2), t.reprefilled_tokens) for t in result.turns]
            target.side.completed = len(result.completed)
            target.side.errors = result.errors
    return seen_quarantine


def _release(
    stack: LocalStack, phases: DemoPhases, seen_quarantine: bool, *, once: bool, console: Console, stop: threading.Event
) -> None:
    """Wait (up to 3 minutes) for a quarantine to clear; without ``once``, keep showing the pool until stopped."""
    with Live(console=console, refresh_per_second=1) as live:
        deadline = time.monotonic() + 180
        while seen_quarantine and not stop.is_set() and time.monotonic() < deadline:
            pool = _sample(stack, phases)
            if pool is not None:
                live.update(pool_table(pool))
            if not _quarantined(pool):
                phases.mark("cleared")
                break
            stop.wait(1.0)
        while not once and not stop.is_set():
            pool = _sample(stack, phases)
            if pool is not None:
                live.update(pool_table(pool))
            stop.wait(1.0)


def _ready(stack: LocalStack) -> bool:
    condition = stack.condition(POOL, "Ready")
    return bool(condition and condition.get("status") == "True")


def summary_table(ours: SideSummary, peer: SideSummary) -> Table:
    """Both sides' totals, one row per figure, with our figure against the peer's (pure)."""
    table = Table("", peer.label, ours.label, f"{ours.label} / {peer.label}", box=None)

    def row(name: str, a: float | None, b: float | None, fmt: str = "{:,.0f}", ratio: bool = True) -> None:
        def cell(v: float | None) -> str:
            return "-" if v is None else fmt.format(v)

        table.add_row(name, cell(a), cell(b), ratio_text(b, a) if ratio and a is not None and b is not None else "")

    row("tokens generated", peer.generated, ours.generated)
    row("generated tokens/s (simulated time)", peer.tokens_per_s, ours.tokens_per_s)
    row("tokens re-prefilled (evicted prefixes)", peer.reprefilled, ours.reprefilled)
    row("prompt tokens not from cache", peer.prefilled, ours.prefilled)
    row("engine preemptions", peer.preemptions, ours.preemptions)
    row("turns answered", peer.turns, ours.turns)
    row("rollouts completed", peer.completed, ours.completed)
    row("turns held for room (paused)", None, ours.held_total, ratio=False)
    row("most turns held at once", None, ours.held_peak, ratio=False)
    row("turns moved to a replica with room", None, ours.moved, ratio=False)
    row("seconds with a replica quarantined", None, ours.quarantine_s, ratio=False)
    row("errors", peer.errors, ours.errors, ratio=False)
    row("engine lag behind the time scale (%)", peer.lag_pct, ours.lag_pct, fmt="{:.1f}", ratio=False)
    return table


def _report(
    console: Console,
    stack: LocalStack,
    phases: DemoPhases,
    sides: tuple[Side, Side],
    seen_quarantine: bool,
    *,
    time_scale: float,
    replicas: int,
) -> None:
    data, plot = phases.write(stack.directory, sides, time_scale=time_scale, replicas=replicas)
    ours, peer = _summaries(sides, time_scale=time_scale, replicas=replicas)
    console.print(summary_table(ours, peer))
    console.print(headline(ours, peer))
    console.print(
        "A replica was quarantined and released."
        if "cleared" in phases.marks
        else "Quarantine seen but not yet cleared."
        if seen_quarantine
        else "No replica of the pool was quarantined."
    )
    console.print(f"timeline: {data}\npicture: {plot}\nlogs: {stack.directory} (cluster/logs, prometheus, kubelet)")
