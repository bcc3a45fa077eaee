"""``rolloutpool demo``: the whole stack on one machine, through full working sets and their release.

Starts (or reuses the cached build of) the local control plane, the process kubelet and
Prometheus, ``helm install``s the chart (the operator runs as a pod under its own RBAC),
applies a simulated RolloutPool with adaptive concurrency, drives agentic rollouts
through the router's Service endpoint until the replicas' working sets are full (turns held,
prefixes let go) or a replica is quarantined, stops the load and waits until all of it
clears — showing a live table of the pool meanwhile. It writes
a timeline (JSON and PNG) beside the logs and stops every process on exit or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from rolloutpool.dev.bench.client import ClientConfig, ClientResult, run_client
from rolloutpool.dev.stack import TRANSIENT_ERRORS, LocalStack
from rolloutpool.dev.wait import wait_until
from rolloutpool.sim.workload import Lognormal, scenario

__all__ = ["DemoPhases", "demo_pool", "examples_dir", "pool_table", "run_demo"]

POOL = "demo"
"""Name of the demo's RolloutPool (namespace ``default``)."""


def examples_dir() -> Path:
    """The checkout's ``examples/`` folder (the demo runs from a checkout)."""
    path = Path(__file__).resolve().parents[3] / "examples"
    if not path.is_dir():
        raise FileNotFoundError(f"examples folder not found at {path}; run the demo from a RolloutPool checkout")
    return path


def demo_pool(*, prometheus_url: str, replicas: int = 3, time_scale: float = 10.0) -> dict[str, Any]:
    """The embedded default pool: small simulated engines that a laptop's load can push into eviction (pure)."""
    return {
        "apiVersion": "rolloutpool.io/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": POOL},
        "spec": {
            "replicas": replicas,
            "engine": {
                "kind": "simulated",
                "model": "Qwen/Qwen3-8B",
                "maxModelLen": 8192,
                "gpusPerReplica": 0,
                "kvCapacityTokens": 32768,
                "simulator": {"hardware": "h100-80gb", "timeScale": time_scale},
            },
            # the routers schedule turns so each replica's working set fits 90 % of its cache (the law tunes it);
            # 16 sessions per replica at most, the demo's 48 rollouts over 3 replicas
            "concurrency": {"workingSetTarget": 0.9, "maxSessionsPerReplica": 16},
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

    def mark(self, name: str) -> None:
        """Record when a phase began."""
        self.marks[name] = time.time() - self.started

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write ``timeline.json`` and ``timeline.png``; return their paths."""
        data = directory / "timeline.json"
        data.write_text(json.dumps({"marks": self.marks, "samples": self.samples}, indent=1))
        return data, _plot(self, directory / "timeline.png")


def _plot(phases: DemoPhases, out: Path) -> Path:
    import matplotlib  # noqa: PLC0415 - plotting only when the demo ends

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    series: dict[str, dict[str, list[float]]] = {}
    for sample in phases.samples:
        for r in sample["replicas"]:
            s = series.setdefault(r["name"], {"t": [], "live": [], "held": [], "q": []})
            s["t"].append(sample["t"])
            s["live"].append(r.get("liveSessions", 0))
            s["held"].append(r.get("heldTurns") or 0)
            s["q"].append(1.0 if r.get("quarantined") or r.get("routerQuarantined") else 0.0)
    fig, axes = plt.subplots(len(series) or 1, 1, figsize=(9, 2.2 * max(1, len(series))), sharex=True, squeeze=False)
    for ax, (name, s) in zip(axes[:, 0], sorted(series.items()), strict=False):
        ax.plot(s["t"], s["live"], label="live sessions")
        ax.step(s["t"], s["held"], where="post", label="held turns")
        top = max([*s["live"], *s["held"], 1])
        ax.fill_between(s["t"], 0, [q * top for q in s["q"]], step="post", alpha=0.2, color="red", label="quarantined")
        ax.set_title(name, fontsize=9)
        for label, t in phases.marks.items():
            ax.axvline(t, color="grey", linestyle=":")
            ax.text(t, top, label, fontsize=7, va="top")
    axes[0, 0].legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel("seconds since the demo started")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


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
    chat = scenario("tool-chat").with_(max_model_len=8192, turns=Lognormal(8, 16))
    config = ClientConfig(
        base_url=url, scenario=chat, seed=0, in_flight=in_flight, duration_s=seconds, time_scale=time_scale
    )
    return asyncio.run(run_client(config))


def _full(pool: dict[str, Any] | None) -> bool:
    """Whether some replica's working set is full: turns held or idle prefixes let go (pure)."""
    entries = ((pool or {}).get("status") or {}).get("replicaStatus") or []
    return any((r.get("heldTurns") or 0) > 0 or (r.get("letGoSessions") or 0) > 0 for r in entries)


def _quarantined(pool: dict[str, Any] | None) -> bool:
    for c in ((pool or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "ReplicasQuarantined":
            return bool(c.get("status") == "True")
    return False


def run_demo(*, directory: Path, once: bool, console: Console, in_flight: int = 48, load_seconds: float = 90.0) -> None:
    """The whole demo (see the module docstring); ``once`` ends after the release instead of waiting for Ctrl-C."""
    stop = threading.Event()
    # explicit handlers: a demo started in the background of a script inherits an
    # ignored SIGINT, and Ctrl-C or `kill` must still stop it cleanly
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    phases = DemoPhases()
    with LocalStack(directory, log=console.log) as stack:
        manifest = demo_pool(prometheus_url=stack.prometheus_url)
        console.log(stack.apply(yaml.safe_dump(manifest)))
        wait_until(lambda: _ready(stack), what="pool Ready", timeout=300, interval=0.5, ignore=TRANSIENT_ERRORS)
        url = wait_until(
            lambda: stack.router_url(POOL), what="router endpoint", timeout=120, interval=0.5, ignore=TRANSIENT_ERRORS
        )
        console.log(f"Pool ready; router at {url}; starting {in_flight} rollouts for {load_seconds:.0f}s")
        phases.mark("load")
        result: list[ClientResult] = []
        time_scale = float(manifest["spec"]["engine"]["simulator"]["timeScale"])
        loader = threading.Thread(
            target=lambda: result.append(_load(url, in_flight=in_flight, seconds=load_seconds, time_scale=time_scale)),
            daemon=True,
        )
        loader.start()
        seen_quarantine = seen_full = False
        with Live(console=console, refresh_per_second=2) as live:

            def show() -> dict[str, Any] | None:
                pool = _sample(stack, phases)
                if pool is not None:
                    live.update(pool_table(pool))
                return pool

            while loader.is_alive() and not stop.is_set():
                pool = show()
                seen_quarantine |= _quarantined(pool)
                seen_full |= _full(pool)
                stop.wait(1.0)
            phases.mark("released")
            deadline = time.monotonic() + 180
            while not stop.is_set() and time.monotonic() < deadline:
                pool = show()
                seen_quarantine |= _quarantined(pool)
                seen_full |= _full(pool)
                if (seen_quarantine or seen_full) and pool is not None and not (_quarantined(pool) or _full(pool)):
                    phases.mark("cleared")
                    break
                stop.wait(1.0)
            while not once and not stop.is_set():
                show()
                stop.wait(1.0)
        _report(console, stack, phases, result, seen_quarantine=seen_quarantine, seen_full=seen_full)
    console.log("Stopped the stack; no processes left behind.")


def _ready(stack: LocalStack) -> bool:
    condition = stack.condition(POOL, "Ready")
    return bool(condition and condition.get("status") == "True")


def _report(
    console: Console,
    stack: LocalStack,
    phases: DemoPhases,
    result: list[ClientResult],
    *,
    seen_quarantine: bool,
    seen_full: bool,
) -> None:
    data, plot = phases.write(stack.directory)
    if result:
        r = result[0]
        console.print(
            f"Load: {len(r.completed)} rollouts completed, {len(r.turns)} turns, "
            f"{r.reprefilled_tokens} tokens re-prefilled, {r.errors} errors"
        )
    cleared = "cleared" in phases.marks
    if seen_full:
        console.print(
            "The working sets filled (turns held, prefixes let go) and cleared."
            if cleared
            else "The working sets filled but have not cleared yet."
        )
    else:
        console.print("No working set filled.")
    if seen_quarantine:
        console.print("A replica was quarantined and released." if cleared else "Quarantine seen but not yet cleared.")
    else:
        console.print("No quarantine happened.")
    console.print(f"timeline: {data}\nplot: {plot}\nlogs: {stack.directory} (cluster/logs, prometheus, kubelet)")
