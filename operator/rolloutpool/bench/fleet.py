"""Aggregate throughput of 1, 2 and 3 routers acting as one fleet, on loopback.

``python -m rolloutpool.bench.fleet`` starts engine simulators (so fast that their own time
is small), then static fleets of 1, 2 and 3 router processes in front of the SAME engines
(``rolloutpool router --self-url ... --peer-urls ...``: each router takes its share of the
engines and forwards sessions it does not own). Closed-loop workers, each with its own
session id, send short chat turns and spread their turns over every router of the fleet
(turn ``t`` of worker ``w`` goes to router ``(w + t) mod N``), so about ``(N-1)/N`` of the
requests take the extra hop. Fleets are measured in short slices, interleaved round after
round, and the median of the slices is reported: a drift of the machine's load hits every
fleet alike. All processes share this machine's cores with the client, so the figures say
what a fleet costs here, not how it scales on a machine with a core per router.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from rolloutpool.bench.processes import LOOPBACK, ProcessSet, free_port, rolloutpool_argv

__all__ = ["FleetSlice", "FleetUrls", "main", "measure_slice", "start_engines", "start_fleet"]

MODEL = "sim"


@dataclass(frozen=True)
class FleetUrls:
    """The base URLs of one fleet's routers."""

    routers: list[str]


@dataclass
class FleetSlice:
    """One measured slice of one fleet."""

    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

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
    """A static fleet of ``routers`` router processes in front of ``engines`` (``extra``: more router flags)."""
    ports = [free_port() for _ in range(routers)]
    urls = [f"http://{LOOPBACK}:{p}" for p in ports]
    for i, (port, url) in enumerate(zip(ports, urls, strict=True)):
        argv = rolloutpool_argv(
            "router", f"--host={LOOPBACK}", f"--port={port}", f"--self-url={url}", f"--peer-urls={','.join(urls)}",
            "--scrape-interval=1", *(f"--replica={n}={u}" for n, u in engines.items()),
            *extra,
        )  # fmt: skip
        procs.start(f"{name}-router-{i}", argv, ready_url=f"{url}/readyz")
    return FleetUrls(urls)


async def measure_slice(
    http: aiohttp.ClientSession, fleet: FleetUrls, *, workers: int, seconds: float, prefix: str
) -> FleetSlice:
    """Closed-loop chat turns for ``seconds``, each worker a session spreading its turns over the routers."""
    result = FleetSlice()
    deadline = time.monotonic() + seconds
    n = len(fleet.routers)

    async def worker(w: int) -> None:
        turn = 0
        sid = f"{prefix}-{w}"
        while time.monotonic() < deadline:
            url = fleet.routers[(w + turn) % n]
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"turn {turn} of {sid}"}], "max_tokens": 2}
            started = time.perf_counter()
            try:
                async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": sid}) as resp:
                    await resp.read()
                    ok = resp.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                result.requests += 1
                result.latencies_ms.append((time.perf_counter() - started) * 1000)
            else:
                result.errors += 1
            turn += 1

    started = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    result.seconds = time.monotonic() - started
    for w in range(workers):  # release, so the next slice starts from empty tables
        async with http.post(f"{fleet.routers[w % n]}/finish_session", params={"session_id": f"{prefix}-{w}"}) as r:
            await r.read()
    return result


async def _run(
    fleets: dict[int, FleetUrls], *, workers: int, rounds: int, slice_s: float
) -> dict[int, list[FleetSlice]]:
    slices: dict[int, list[FleetSlice]] = {k: [] for k in fleets}
    order = list(fleets)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await measure_slice(http, fleets[order[0]], workers=workers, seconds=1.0, prefix="warmup")
        for r in range(rounds):
            for k in order[r % len(order) :] + order[: r % len(order)]:  # rotate who goes first
                slices[k].append(await measure_slice(http, fleets[k], workers=workers, seconds=slice_s, prefix=f"r{r}"))
    return slices


def main(argv: Sequence[str] | None = None) -> None:
    """Measure and print the table (``--help`` for the knobs)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routers", default="1,2,3", help="fleet sizes to compare")
    parser.add_argument("--engines", type=int, default=6)
    parser.add_argument("--workers", type=int, default=32, help="closed-loop sessions")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--slice", type=float, default=4.0, help="seconds per fleet per round")
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.routers.split(",")]
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="rolloutpool-fleet-bench-"))
    with ProcessSet(log_dir) as procs:
        engines = start_engines(procs, args.engines)
        fleets = {n: start_fleet(procs, engines, n, name=f"fleet{n}") for n in sizes}
        slices = asyncio.run(_run(fleets, workers=args.workers, rounds=args.rounds, slice_s=args.slice))
    print(f"engines={args.engines} workers={args.workers} rounds={args.rounds} slice_s={args.slice:g} logs={log_dir}")
    print("routers  req/s(median)  req/s(slices)                    p50_ms  p99_ms  errors")
    for n, got in slices.items():
        lat = sorted(x for s in got for x in s.latencies_ms)
        p50 = lat[len(lat) // 2] if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
        per_s = " ".join(f"{s.per_s:.0f}" for s in got)
        median = statistics.median(s.per_s for s in got)
        print(f"{n:>7}  {median:>13.0f}  {per_s:<32} {p50:>6.1f}  {p99:>6.1f}  {sum(s.errors for s in got)}")


if __name__ == "__main__":
    main()
