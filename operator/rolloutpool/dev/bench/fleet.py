"""Aggregate throughput of 1, 2 and 3 routers acting as one fleet, on loopback.

``python -m rolloutpool.dev.bench.fleet`` starts engine simulators (so fast that their own time
is small), then static fleets of 1, 2 and 3 router processes in front of the SAME engines
(``rolloutpool router --self-url ... --peer-urls ...``: each router takes its share of the
engines and forwards sessions it does not own). Load: one ``wrk`` per router of a fleet, all at
once, the connections split over them, cycling through a pool of session ids with short chat
turns. Two ways to send: "turns spread" (every wrk sends every id, so about ``(N-1)/N`` of the
requests take the extra hop to the owner) and "turns to the owner" (each wrk sends only the ids
its router owns: no hop; the client computes the owner as the routers do). Targets are measured
in short slices, interleaved round after round (the order rotates), and the median slice is
reported: a drift of the machine's load hits every target alike. Every process shares this
machine's cores, so the figures say what a fleet costs here, not how it scales with a core per
router.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import secrets
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.net import LOOPBACK, free_port
from rolloutpool.routing.fleetsplit import assign_engines
from rolloutpool.routing.fleetview import static_view

__all__ = ["FleetSlice", "FleetUrls", "Target", "main", "measure_slice", "start_engines", "start_fleet"]

MODEL = "sim"


@dataclass(frozen=True)
class FleetUrls:
    """The base URLs of one fleet's routers."""

    routers: list[str]
    admin_token: str = field(default="", repr=False)
    """The fleet's shared admin token (the admin API, and the peers' forwarding)."""


@dataclass(frozen=True)
class Target:
    """One measured configuration: a fleet, and the session ids each router's load generator sends."""

    label: str
    fleet: FleetUrls
    ids: list[list[str]]
    """Per router: the session ids its wrk sends (all ids: turns spread over the routers; owned: no hop)."""


@dataclass
class FleetSlice:
    """One measured slice of one target (summed over its routers' load generators)."""

    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    p50_ms: list[float] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        """Successful requests per wall second."""
        return self.requests / self.seconds if self.seconds else 0.0


def start_engines(procs: ProcessSet, count: int, *, time_scale: float = 1000.0) -> dict[str, str]:
    """``count`` engine simulators on loopback; name -> URL."""
    urls = {}
    for i in range(count):
        port = free_port()
        url = f"http://{LOOPBACK}:{port}"
        argv = rolloutpool_argv(
            "engine-sim", f"--host={LOOPBACK}", f"--port={port}", f"--model={MODEL}", "--max-model-len=4096",
            "--num-gpu-blocks=4096", f"--time-scale={time_scale:g}", f"--seed={i}",
        )  # fmt: skip
        procs.start(f"engine-{i}", argv, ready_url=f"{url}/health")
        urls[f"engine-{i}"] = url
    return urls


def start_fleet(
    procs: ProcessSet, engines: dict[str, str], routers: int, *, name: str, extra: Sequence[str] = ()
) -> FleetUrls:
    """A static fleet of ``routers`` router processes in front of ``engines`` (``extra``: more router flags).

    The routers share one admin token (``FleetUrls.admin_token``), which also authenticates their forwarding.
    """
    ports = [free_port() for _ in range(routers)]
    urls = [f"http://{LOOPBACK}:{p}" for p in ports]
    token = secrets.token_urlsafe(24)
    token_file = procs.log_dir / f"{name}-admin-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    for i, (port, url) in enumerate(zip(ports, urls, strict=True)):
        argv = rolloutpool_argv(
            "router", f"--host={LOOPBACK}", f"--port={port}", f"--self-url={url}", f"--peer-urls={','.join(urls)}",
            "--scrape-interval=1", *(f"--replica={n}={u}" for n, u in engines.items()),
            f"--admin-token-file={token_file}", "--no-state", *extra,
        )  # fmt: skip
        procs.start(f"{name}-router-{i}", argv, ready_url=f"{url}/readyz")
    for url in urls:  # a router that probed its peers before they started puts them back on its ring
        _wait_members(url, routers)
    return FleetUrls(urls, admin_token=token)


def _wait_members(url: str, members: int, *, timeout_s: float = 30.0) -> None:
    """Wait until the router at ``url`` has ``members`` routers on its session ring."""
    deadline = time.monotonic() + timeout_s
    pattern = re.compile(r"^rolloutpool_router_fleet_members ([0-9.e+]+)$", re.MULTILINE)
    while True:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/metrics", timeout=2.0) as resp:  # noqa: S310
            found = pattern.search(resp.read().decode())
            if found and float(found[1]) == members:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"router {url} did not see its {members} fleet members within {timeout_s:g} s")
        time.sleep(0.1)


_LUA = """
local ids = {%s}
local i = 0
local body = '{"model":"%s","messages":[{"role":"user","content":"one turn"}],"max_tokens":2}'
request = function()
  i = i + 1
  local h = {["Content-Type"] = "application/json", ["X-Session-ID"] = ids[(i %% #ids) + 1]}
  return wrk.format("POST", "/v1/chat/completions", h, body)
end
"""


def _wrk_figures(out: str) -> tuple[int, int, float]:
    """Requests, non-2xx responses and p50 (ms) from wrk's ``--latency`` output (pure)."""
    done = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p50 = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s)", out, re.MULTILINE)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    latency = float(p50[1]) * scale[p50[2]] if p50 else float("nan")
    errors = int(bad[1]) if bad else 0
    return (int(done[1]) if done else 0) - errors, errors, latency


def measure_slice(target: Target, *, connections: int, seconds: float, scripts: Path) -> FleetSlice:
    """One wrk per router of the target, all at once for ``seconds``; their figures summed."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed (apt-get install wrk)")
    per = max(1, connections // len(target.fleet.routers))
    procs = []
    for i, (url, ids) in enumerate(zip(target.fleet.routers, target.ids, strict=True)):
        script = scripts / f"{re.sub(r'[^a-z0-9]+', '-', target.label)}-{i}.lua"
        script.write_text(_LUA % (",".join(f'"{x}"' for x in ids), MODEL))
        argv = [wrk, "-t1", f"-c{per}", f"-d{seconds:g}s", "--latency", "-s", str(script), url]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    result = FleetSlice(seconds=seconds)
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 60)
        requests, errors, p50 = _wrk_figures(out)
        result.requests += requests
        result.errors += errors
        result.p50_ms.append(p50)
    return result


def _targets(procs: ProcessSet, engines: dict[str, str], sizes: Sequence[int], sessions: int) -> list[Target]:
    ids = [f"s{i}" for i in range(sessions)]
    targets = []
    for n in sizes:
        fleet = start_fleet(procs, engines, n, name=f"fleet{n}")
        targets.append(Target(f"{n} router{'s' if n > 1 else ''}, turns spread", fleet, [ids] * n))
        if n > 1:
            split = assign_engines(engines=engines, routers=fleet.routers, previous={})
            view = static_view(peers={u: u for u in fleet.routers}, split=split, engine_urls=engines, self_name="")
            owned = [[x for x in ids if view.owner(x) == url] for url in fleet.routers]
            targets.append(Target(f"{n} routers, turns to the owner", fleet, owned))
    return targets


def main(argv: Sequence[str] | None = None) -> None:
    """Measure and print the table (``--help`` for the knobs)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routers", default="1,2,3", help="fleet sizes to compare")
    parser.add_argument("--engines", type=int, default=6)
    parser.add_argument("--connections", type=int, default=32, help="wrk connections in all, split over the routers")
    parser.add_argument("--sessions", type=int, default=256, help="session ids the load cycles through")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slice", type=float, default=4.0, help="seconds per target per round")
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.routers.split(",")]
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="rolloutpool-fleet-bench-"))
    with ProcessSet(log_dir) as procs:
        engines = start_engines(procs, args.engines)
        targets = _targets(procs, engines, sizes, args.sessions)
        slices: dict[str, list[FleetSlice]] = {t.label: [] for t in targets}
        measure_slice(targets[0], connections=args.connections, seconds=1.0, scripts=log_dir)  # warm-up
        for r in range(args.rounds):
            for t in targets[r % len(targets) :] + targets[: r % len(targets)]:  # rotate who goes first
                slices[t.label].append(
                    measure_slice(t, connections=args.connections, seconds=args.slice, scripts=log_dir)
                )
    print(f"engines={args.engines} connections={args.connections} sessions={args.sessions} rounds={args.rounds} "
          f"slice_s={args.slice:g} logs={log_dir}")  # fmt: skip
    print(f"{'target':<32} {'req/s median':>12}  {'slices':<28} {'p50 ms':>7}  errors")
    for label, got in slices.items():
        median = statistics.median(s.per_s for s in got)
        per_s = " ".join(f"{s.per_s:.0f}" for s in got)
        p50 = statistics.median(x for s in got for x in s.p50_ms)
        print(f"{label:<32} {median:>12.0f}  {per_s:<28} {p50:>7.1f}  {sum(s.errors for s in got)}")


if __name__ == "__main__":
    main()
