"""wrk's side of the overhead benchmark: Lua scripts, output parsing, medians and the acceptance check (pure).

Saturation: ``wrk -t1 -cN --latency`` posts one body over and over, each request with
``X-Session-ID: s<counter mod 512>`` (512 sessions, as RL rollouts keep many live).

Fixed rate: wrk has no rate option (wrk2 does, but is not packaged). The script's
``delay()`` hook makes each connection wait before its next request, uniformly in
``[0, 2 * N / rate]`` seconds, so N connections offer about ``rate`` requests/s as
independent arrivals while each request's latency stays small next to the gap (the
achieved rate is reported per target; it falls short of ``rate`` by about
latency / gap). wrk times each request from its send, so the delay is not in the
latency. The added p50 is a router's p50 minus the direct p50 in the same round.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "Acceptance",
    "WrkResult",
    "acceptance",
    "lua_script",
    "median_of",
    "parse_wrk",
]

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


@dataclass(frozen=True)
class WrkResult:
    """One wrk run."""

    requests_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int
    non_2xx: int
    socket_errors: int


def lua_script(*, body_path: str, path: str = "/v1/completions", sessions: int = 512, delay_ms: float = 0.0) -> str:
    """The wrk script: POST the file's JSON with a rotating session header; optional paced delay."""
    pacing = ""
    if delay_ms > 0:
        pacing = f"\nfunction delay()\n  return math.random() * {2 * delay_ms:.3f}\nend\n"
    return (
        'wrk.method = "POST"\n'
        f'local f = assert(io.open("{body_path}", "rb"))\n'
        "wrk.body = f:read('*a')\n"
        "f:close()\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        "local counter = 0\n"
        "function request()\n"
        "  counter = counter + 1\n"
        f'  wrk.headers["X-Session-ID"] = "s" .. (counter % {sessions})\n'
        f'  return wrk.format(nil, "{path}")\n'
        "end\n" + pacing
    )


def _ms(value: str, unit: str) -> float:
    return float(value) * _UNITS[unit]


def parse_wrk(text: str) -> WrkResult:
    """The figures of ``wrk --latency`` output; raises ValueError when it holds none."""
    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    p50 = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s|m)\b", text, re.MULTILINE)
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s|m)\b", text, re.MULTILINE)
    total = re.search(r"(\d+) requests in", text)
    if rps is None or p50 is None or p99 is None or total is None:
        raise ValueError(f"not wrk --latency output: {text[-400:]!r}")
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return WrkResult(
        requests_per_s=float(rps.group(1)),
        p50_ms=_ms(*p50.groups()),
        p99_ms=_ms(*p99.groups()),
        requests=int(total.group(1)),
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        socket_errors=sum(int(g) for g in errors.groups()) if errors else 0,
    )


def median_of(runs: Sequence[WrkResult]) -> WrkResult:
    """Per-figure medians over rounds (errors summed)."""
    return WrkResult(
        requests_per_s=statistics.median(r.requests_per_s for r in runs),
        p50_ms=statistics.median(r.p50_ms for r in runs),
        p99_ms=statistics.median(r.p99_ms for r in runs),
        requests=sum(r.requests for r in runs),
        non_2xx=sum(r.non_2xx for r in runs),
        socket_errors=sum(r.socket_errors for r in runs),
    )


@dataclass(frozen=True)
class Acceptance:
    """One acceptance figure of issue 13 with its target and verdict."""

    name: str
    value: float
    target: str
    passed: bool


def acceptance(
    saturation: Mapping[str, Mapping[str, WrkResult]],
    added_p50_ms: Mapping[str, float],
    *,
    ours: str,
    peer: str,
) -> list[Acceptance]:
    """Issue 13's targets: req/s >= 0.8x (large bodies) and >= 0.5x (small) the peer's, p99 <= 2x, added p50 <= 1 ms.

    ``saturation``: body size name ("small", "large") -> target -> medians;
    ``added_p50_ms``: body size name -> our added p50 at half the peer's saturation rate.
    """
    floors = {"small": 0.5, "large": 0.8}
    out = []
    for size, rows in saturation.items():
        if ours not in rows or peer not in rows:
            continue
        mine, theirs = rows[ours], rows[peer]
        ratio = mine.requests_per_s / theirs.requests_per_s if theirs.requests_per_s else float("nan")
        floor = floors.get(size, 0.8)
        out.append(Acceptance(f"{size}: req/s vs {peer}", ratio, f">= {floor}x", ratio >= floor))
        p99 = mine.p99_ms / theirs.p99_ms if theirs.p99_ms else float("nan")
        out.append(Acceptance(f"{size}: p99 vs {peer}", p99, "<= 2x", p99 <= 2.0))
    for size, added in added_p50_ms.items():
        out.append(
            Acceptance(f"{size}: added p50 over direct at half {peer}'s rate (ms)", added, "<= 1 ms", added <= 1.0)
        )
    return out
