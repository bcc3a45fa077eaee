"""Turn scheduling in front of a real vLLM: re-prefilled tokens against sticky least-loaded, same client.

Issue 26's real-vLLM check. One tiny vLLM 0.32 (CPU, block size 32, a KV pool the sessions
outgrow several times over, publishing its KV events) serves the same client twice, fresh each
time: ``sessions`` token-id sessions of ``turns`` turns at once, each turn's output followed by a
tool gap and an observation. Once behind vllm-router ``--policy sticky_least_loaded``, once behind
our router, which reads the engine's KV events (``--kv-events``) and schedules turns by working
set: it keeps, lets go and holds (pauses) turns so the contexts it serves fit the cache.

Per run: the client's re-prefilled tokens (each returning turn's previous context, in whole
blocks, that the turn did not find cached: ``cached_tokens`` against
:func:`~rolloutpool.routing.quarantine.expected_cached_tokens`), generated tokens, wall time and,
for ours, the turns it held and the prefixes it let go. One replica, so placement plays no part:
what differs is only whose KV stays cached while a rollout waits on its tool.

``python -m rolloutpool.dev.bench.vllm_turns`` runs it (about five minutes on two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.localcluster.vllm_model import SERVED_MODEL, VllmServer, VllmServerConfig
from rolloutpool.dev.net import LOOPBACK, free_port
from rolloutpool.routing.quarantine import expected_cached_tokens

__all__ = ["ClientShape", "RunReport", "main", "run_client", "run_pair"]

BLOCK = 32


@dataclass(frozen=True)
class ClientShape:
    """The client's sessions: token-id prompts, outputs and observations, tool gaps."""

    sessions: int = 8
    turns: int = 6
    prompt_tokens: int = 256
    output_tokens: int = 16
    observation_tokens: int = 96
    tool_gap_s: tuple[float, float] = (0.5, 3.0)
    """Uniform seconds between a turn's answer and the next turn."""
    seed: int = 0


@dataclass(frozen=True)
class RunReport:
    """What one router's run did to the same client."""

    router: str
    turns: int
    returning_turns: int
    reprefilled_tokens: int
    """Previous-context tokens returning turns did not find cached (whole blocks, vLLM's rule)."""
    prompt_tokens: int
    generated_tokens: int
    wall_s: float
    held_turns: float | None = None
    """Our router's turns held for room (``turn_decisions_total{decision="held"}``); None: not ours."""
    let_go: float | None = None
    moved: float | None = None
    failed_turns: int = 0


async def _turn(
    http: aiohttp.ClientSession, url: str, sid: str, prompt: list[int], out_tokens: int
) -> tuple[int, list[int], int]:
    """One completion: its prompt tokens, the output's token ids and the cached tokens it reported."""
    body = {
        "model": SERVED_MODEL, "prompt": prompt, "max_tokens": out_tokens, "ignore_eos": True, "temperature": 0,
        "logprobs": 0, "return_tokens_as_token_ids": True,
    }  # fmt: skip
    async with http.post(f"{url}/v1/completions", json=body, headers={"X-Session-ID": sid}) as resp:
        answer = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"turn of {sid}: HTTP {resp.status}: {answer}")
    usage = answer["usage"]
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    output = [int(t.removeprefix("token_id:")) for t in answer["choices"][0]["logprobs"]["tokens"]]
    return int(usage["prompt_tokens"]), output, cached


async def _session(
    http: aiohttp.ClientSession, url: str, index: int, shape: ClientShape, totals: dict[str, int]
) -> None:
    rng = random.Random(shape.seed * 1000 + index)  # noqa: S311 -- a workload, not secrets
    sid = f"s{shape.seed}-{index}"
    context = [rng.randrange(3, 2040) for _ in range(shape.prompt_tokens)]
    previous: int | None = None
    for turn in range(shape.turns):
        try:
            prompt_tokens, output, cached = await _turn(http, url, sid, context, shape.output_tokens)
        except (aiohttp.ClientError, RuntimeError, TimeoutError, KeyError, ValueError):
            totals["failed"] += 1
            return
        totals["turns"] += 1
        totals["prompt"] += prompt_tokens
        totals["generated"] += len(output)
        if previous is not None:
            totals["returning"] += 1
            expected = expected_cached_tokens(previous_context=previous, prompt_tokens=prompt_tokens, block_size=BLOCK)
            totals["reprefilled"] += max(0, expected - cached)
        previous = prompt_tokens + len(output) - 1
        context += output  # the next prompt extends this turn's prompt and answer, as an agent's does
        if turn + 1 < shape.turns:
            await asyncio.sleep(rng.uniform(*shape.tool_gap_s))
            context += [rng.randrange(3, 2040) for _ in range(shape.observation_tokens)]


async def run_client(url: str, shape: ClientShape) -> dict[str, int]:
    """Every session at once, each turn after the last; the client's counts."""
    totals = dict.fromkeys(("turns", "returning", "reprefilled", "prompt", "generated", "failed"), 0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
        await asyncio.gather(*(_session(http, url, i, shape, totals) for i in range(shape.sessions)))
    return totals


def _decisions(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "rolloutpool_router_turn_decisions_total":
                decision = sample.labels.get("decision", "?")
                out[decision] = out.get(decision, 0.0) + sample.value
    return out


@contextlib.contextmanager
def _vllm(log_dir: Path, *, blocks: int, name: str) -> Iterator[tuple[str, int, int]]:
    port, replay = free_port(), free_port()
    config = json.dumps(
        {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{replay}"}
    )
    server = VllmServer(
        VllmServerConfig(
            port=free_port(), num_gpu_blocks=blocks, max_model_len=1024, extra_args=("--kv-events-config", config)
        ),
        log_path=log_dir / f"vllm-{name}.log",
    )
    server.start(timeout_s=1200.0)  # a loaded 2-core machine compiles the tiny model slowly
    try:
        yield server.url, port, replay
    finally:
        server.stop()


async def _run(name: str, url: str, shape: ClientShape, *, metrics_url: str | None) -> RunReport:
    started = time.perf_counter()
    totals = await run_client(url, shape)
    wall = time.perf_counter() - started
    decisions: dict[str, float] | None = None
    if metrics_url is not None:
        async with aiohttp.ClientSession() as http, http.get(metrics_url) as resp:
            decisions = _decisions(await resp.text())
    return RunReport(
        router=name,
        turns=totals["turns"],
        returning_turns=totals["returning"],
        reprefilled_tokens=totals["reprefilled"],
        prompt_tokens=totals["prompt"],
        generated_tokens=totals["generated"],
        wall_s=round(wall, 1),
        held_turns=None if decisions is None else decisions.get("held", 0.0),
        let_go=None if decisions is None else decisions.get("let_go", 0.0),
        moved=None if decisions is None else decisions.get("moved", 0.0),
        failed_turns=totals["failed"],
    )


def run_pair(
    log_dir: Path, shape: ClientShape, *, blocks: int, vllm_router: str, prefill_rates: Sequence[float | None] = (None,)
) -> list[RunReport]:
    """Sticky least-loaded, then ours once per ``prefill_rates`` entry (its ``--prefill-rate``; None: the router's
    default), each on a fresh vLLM; their reports."""
    reports = []
    with _vllm(log_dir, blocks=blocks, name="sticky") as (url, _, _), ProcessSet(log_dir / "sticky") as procs:
        port = free_port()
        argv = [
            vllm_router, "--host", LOOPBACK, "--port", str(port), "--worker-urls", url,
            "--policy", "sticky_least_loaded", "--prometheus-host", LOOPBACK, "--prometheus-port", str(free_port()),
            "--worker-startup-check-interval", "1", "--request-timeout-secs", "900", "--log-level", "warning",
        ]  # fmt: skip
        procs.start("vllm-router", argv, ready_url=f"http://{LOOPBACK}:{port}/health", timeout_s=120)
        reports.append(asyncio.run(_run("vllm-router sticky_least_loaded", f"http://{LOOPBACK}:{port}", shape,
                                        metrics_url=None)))  # fmt: skip
    for i, rate in enumerate(prefill_rates):
        name = "rolloutpool" if rate is None else f"rolloutpool --prefill-rate {rate:g}"
        with _vllm(log_dir, blocks=blocks, name=f"ours-{i}") as (url, pub, replay), \
                ProcessSet(log_dir / f"ours-{i}") as procs:  # fmt: skip
            port = free_port()
            argv = rolloutpool_argv(
                "router", "--host", LOOPBACK, "--port", str(port), "--replica", f"e0={url}",
                "--kv-events", f"e0=tcp://{LOOPBACK}:{pub},tcp://{LOOPBACK}:{replay}",
                "--scrape-interval", "0.5", "--queue-timeout", "600",
                *(() if rate is None else ("--prefill-rate", f"{rate:g}")),
            )  # fmt: skip
            procs.start("router", argv, ready_url=f"http://{LOOPBACK}:{port}/readyz", timeout_s=120)
            reports.append(asyncio.run(_run(name, f"http://{LOOPBACK}:{port}", shape,
                                            metrics_url=f"http://{LOOPBACK}:{port}/metrics")))  # fmt: skip
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: both runs, a table and (``--json``) the reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=ClientShape.sessions)
    parser.add_argument("--turns", type=int, default=ClientShape.turns)
    parser.add_argument("--blocks", type=int, default=48, help="vLLM's KV pool in blocks of 32 tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prefill-rate",
        type=float,
        action="append",
        default=None,
        help="run ours with this --prefill-rate (repeatable; 0: the lease alone); default: the router's default",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    binary = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
    shape = ClientShape(sessions=args.sessions, turns=args.turns, seed=args.seed)
    with TemporaryDirectory(prefix="vllm-turns-") as tmp:
        log_dir = args.log_dir or Path(tmp)
        rates: list[float | None] = list(args.prefill_rate) if args.prefill_rate else [None]
        reports = run_pair(log_dir, shape, blocks=args.blocks, vllm_router=binary, prefill_rates=rates)
    print(f"{shape.sessions} sessions x {shape.turns} turns, vLLM KV pool {args.blocks} blocks of {BLOCK}")
    print("| router | turns | returning | re-prefilled tokens | generated | wall s | held | let go | moved | failed |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in reports:
        extra = [("-" if v is None else f"{v:g}") for v in (r.held_turns, r.let_go, r.moved)]
        print(f"| {r.router} | {r.turns} | {r.returning_turns} | {r.reprefilled_tokens:,} | {r.generated_tokens:,} "
              f"| {r.wall_s:g} | {' | '.join(extra)} | {r.failed_turns} |")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in reports], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
