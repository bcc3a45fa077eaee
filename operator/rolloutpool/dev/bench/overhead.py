"""Router overhead at saturation: the same closed-loop requests, direct and through each router.

One engine-sim (run so fast that its own time is negligible) sits behind every
router. ``concurrency`` closed-loop workers send short chat completions, each
worker with its own session key. Targets are measured in short slices, interleaved
round after round (the order rotates), so a drift of the machine's load hits every
target alike. Added latency is a target's median (p99) minus the direct median (p99).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import aiohttp

__all__ = ["DIRECT", "OverheadConfig", "OverheadRow", "measure_overhead", "percentile"]

DIRECT = "direct"
"""Name of the no-router target."""


@dataclass(frozen=True)
class OverheadConfig:
    """Knobs of the overhead measurement."""

    concurrency: int = 8
    rounds: int = 4
    slice_s: float = 2.0
    """Wall seconds of one target's slice in one round."""
    prompt_words: int = 64
    max_tokens: int = 4
    model: str = "Qwen/Qwen3-8B"


@dataclass(frozen=True)
class OverheadRow:
    """One target's figures."""

    target: str
    requests: int
    errors: int
    median_ms: float
    p99_ms: float
    requests_per_s: float
    added_median_ms: float
    added_p99_ms: float


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest-rank method; NaN when empty (pure)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


async def _slice(
    http: aiohttp.ClientSession, url: str, target: str, config: OverheadConfig, latencies: list[float]
) -> tuple[int, float]:
    deadline = time.monotonic() + config.slice_s
    errors = 0

    async def worker(w: int) -> None:
        nonlocal errors
        sid = f"overhead-{target}-{w}"
        body = {
            "model": config.model,
            "messages": [{"role": "user", "content": " ".join(f"w{w}_{i}" for i in range(config.prompt_words))}],
            "max_tokens": config.max_tokens,
            "session_id": sid,
        }
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": sid}) as r:
                    await r.read()
                    ok = r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if ok:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1

    started = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(config.concurrency)))
    return errors, time.monotonic() - started


async def measure_overhead(
    targets: dict[str, str], config: OverheadConfig, *, on_round: Callable[[int, int], None] | None = None
) -> list[OverheadRow]:
    """Measure every target (name -> base URL; include :data:`DIRECT`), interleaved."""
    names = list(targets)
    latencies: dict[str, list[float]] = {n: [] for n in names}
    errors = dict.fromkeys(names, 0)
    elapsed = dict.fromkeys(names, 0.0)
    connector = aiohttp.TCPConnector(limit=config.concurrency * 2)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        warmup = replace(config, slice_s=min(config.slice_s, 0.5))
        for n in names:  # warm every path with the same sessions (connections, session and program state)
            await _slice(http, targets[n], n, warmup, [])
        for r in range(config.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                e, seconds = await _slice(http, targets[n], n, config, latencies[n])
                errors[n] += e
                elapsed[n] += seconds
            if on_round is not None:
                on_round(r + 1, config.rounds)
    base = latencies.get(DIRECT) or []
    base_median = statistics.median(base) if base else 0.0
    base_p99 = percentile(base, 0.99) if base else 0.0
    rows = []
    for n in names:
        lat = latencies[n]
        median = statistics.median(lat) if lat else float("nan")
        p99 = percentile(lat, 0.99)
        rows.append(
            OverheadRow(
                target=n,
                requests=len(lat),
                errors=errors[n],
                median_ms=median * 1000,
                p99_ms=p99 * 1000,
                requests_per_s=len(lat) / elapsed[n] if elapsed[n] else 0.0,
                added_median_ms=(median - base_median) * 1000,
                added_p99_ms=(p99 - base_p99) * 1000,
            )
        )
    return rows
