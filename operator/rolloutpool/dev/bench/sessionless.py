"""Sessionless clients: do their later turns return to their replica? (docs/sessionless-clients.md)

``python -m rolloutpool.dev.bench.sessionless`` runs N concurrent multi-turn rollouts that send no
session id, as ART, the Agent Lightning gateway and AReaL do (DESIGN section 12), over two
engine-sims, through three routers, each on fresh engines:

- ``ours``: ``rolloutpool router``, no id: implicit sessions match each turn to the conversation
  it extends;
- ``ours-ids``: the same router and client, each rollout sending ``X-Session-ID`` (the reference);
- ``cache-aware``: vllm-router ``--policy cache_aware`` (a prefix tree per worker), no id;
- ``ours-off`` (only when asked for): our router with ``--no-implicit-sessions``, no id: each request a
  one-turn session, the behaviour before implicit sessions.

Workloads (each rollout its own task, tool results appended between turns):

- ``art``: chat completions (``messages``, no ``user``), ART's ``openai_client()``;
- ``areal``: ``/v1/completions`` with token-id prompts and no ``model``, the output ids read back
  from ``return_tokens_as_token_ids`` logprobs, AReaL's ``RemotevLLMEngine``;
- ``grpo``: chat, groups of rollouts sharing one prompt (GRPO samples), no id.

Reported per router and workload: lost turns (a later turn whose ``cached_tokens`` fell more than a
block short of its previous prompt: it was served where that prefix was not; the engines' KV holds
every rollout, so the prefix was still resident where it was), the fleet prefix-hit ratio from the
engines' ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, and the requests per engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from rolloutpool.dev.bench.peers import RouterLaunch, vllm_router_argv
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.net import free_port

__all__ = ["DEFAULT_ROUTERS", "ROUTERS", "WORKLOADS", "Row", "SessionlessConfig", "main", "measure", "run_rollouts"]

ROUTERS = ("ours", "ours-ids", "cache-aware", "ours-off")
DEFAULT_ROUTERS = ROUTERS[:3]
WORKLOADS = ("art", "areal", "grpo")
BLOCK = 16
"""The engine-sims' KV block size (a turn may miss up to one block and still count as returned)."""


@dataclass(frozen=True)
class SessionlessConfig:
    """One measurement's shape."""

    rollouts: int = 8
    turns: int = 4
    group_size: int = 4
    """``grpo``: rollouts per shared prompt."""
    prompt_tokens: int = 600
    observation_tokens: int = 150
    max_tokens: int = 48
    time_scale: float = 50.0
    kv_capacity_tokens: int = 131072
    """Per engine: every rollout's whole context fits, so a prefix is never evicted."""
    seed: int = 0
    vllm_router_bin: str = "vllm-router"


@dataclass
class Row:
    """One router on one workload."""

    router: str
    workload: str
    turns: int = 0
    later_turns: int = 0
    lost_turns: int = 0
    moved_turns: int | None = None
    """Later turns served by another replica than the rollout's previous turn (ours only: the replica header)."""
    errors: int = 0
    hit_ratio: float = 0.0
    requests_per_engine: list[int] = field(default_factory=list)


def _words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


@dataclass
class _Tally:
    turns: int = 0
    later: int = 0
    lost: int = 0
    moved: int = 0
    errors: int = 0


@dataclass
class _Trail:
    """A rollout's previous turn: its prompt tokens and the replica that answered it."""

    prompt: int | None = None
    replica: str | None = None


async def _post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[dict[str, Any], str | None]:
    async with http.post(url, json=body, headers=headers) as response:
        data = await response.json(content_type=None)
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {data}")
        return data, response.headers.get("X-RolloutPool-Replica")


async def _exchange(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    *,
    tally: _Tally,
    trail: _Trail,
) -> dict[str, Any] | None:
    """One turn: its answer (None after an error, counted), with the turn, its lost prefix and any move tallied."""
    try:
        data, replica = await _post(http, url, body, headers)
    except (RuntimeError, aiohttp.ClientError):
        tally.errors += 1
        return None
    _account(tally, data["usage"], trail.prompt)
    if trail.replica is not None and replica is not None and replica != trail.replica:
        tally.moved += 1
    trail.prompt, trail.replica = data["usage"]["prompt_tokens"], replica
    return data


def _account(tally: _Tally, usage: dict[str, Any], previous_prompt: int | None) -> None:
    tally.turns += 1
    if previous_prompt is None:
        return
    tally.later += 1
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    if cached < previous_prompt - BLOCK:
        tally.lost += 1


async def _chat_rollout(
    http: aiohttp.ClientSession,
    url: str,
    cfg: SessionlessConfig,
    *,
    index: int,
    task: str,
    sid: str | None,
    tally: _Tally,
) -> None:
    rng = random.Random(cfg.seed * 1000 + index)  # noqa: S311 -- a reproducible workload, not cryptography
    headers = {} if sid is None else {"X-Session-ID": sid}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent. Use the tools."},
        {"role": "user", "content": task},
    ]
    trail = _Trail()
    for turn in range(cfg.turns):
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        body = {  # a seed per rollout: GRPO samples of one prompt answer differently, as with temperature
            "model": "sim",
            "messages": messages,
            "max_tokens": cfg.max_tokens,
            "temperature": 1.0,
            "seed": cfg.seed * 1000 + index,
        }
        data = await _exchange(http, f"{url}/v1/chat/completions", body, headers, tally=tally, trail=trail)
        if data is None:
            return
        message = data["choices"][0]["message"]
        messages.append({"role": "assistant", "content": message.get("content") or ""})
        messages.append({"role": "user", "content": _words(f"o{index}_{turn}_", cfg.observation_tokens)})
        await asyncio.sleep(rng.uniform(0.05, 0.3))  # the tool runs


async def _token_rollout(
    http: aiohttp.ClientSession, url: str, cfg: SessionlessConfig, *, index: int, sid: str | None, tally: _Tally
) -> None:
    rng = random.Random(cfg.seed * 1000 + index)  # noqa: S311 -- a reproducible workload, not cryptography
    headers = {} if sid is None else {"X-Session-ID": sid}
    prompt = [rng.randrange(1000, 30000) for _ in range(cfg.prompt_tokens)]
    trail = _Trail()
    for _turn in range(cfg.turns):
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        body = {  # AReaL's RemotevLLMEngine: token ids in, ids back through logprobs, no model
            "prompt": prompt,
            "max_tokens": cfg.max_tokens,
            "temperature": 1.0,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        data = await _exchange(http, f"{url}/v1/completions", body, headers, tally=tally, trail=trail)
        if data is None:
            return
        tokens = data["choices"][0]["logprobs"]["tokens"]
        prompt = prompt + [int(t.split(":", 1)[1]) for t in tokens]
        prompt += [rng.randrange(1000, 30000) for _ in range(cfg.observation_tokens)]
        await asyncio.sleep(rng.uniform(0.05, 0.3))


async def run_rollouts(url: str, cfg: SessionlessConfig, *, workload: str, with_ids: bool) -> _Tally:
    """Every rollout of ``workload`` at once against ``url``; the tally of their turns."""
    tally = _Tally()
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        jobs = []
        for i in range(cfg.rollouts):
            sid = f"rollout-{workload}-{i}" if with_ids else None
            if workload == "areal":
                jobs.append(_token_rollout(http, url, cfg, index=i, sid=sid, tally=tally))
                continue
            task_id = i // cfg.group_size if workload == "grpo" else i
            task = f"Task {task_id}: " + _words(f"t{task_id}_", cfg.prompt_tokens)
            jobs.append(_chat_rollout(http, url, cfg, index=i, task=task, sid=sid, tally=tally))
        await asyncio.gather(*jobs)
    return tally


def _engine_counts(url: str) -> tuple[float, float, float]:
    """(prefix-cache hits, queries, finished requests) of one engine-sim."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:  # noqa: S310 - our loopback URL
        text = response.read().decode()
    hits = queries = done = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:prefix_cache_hits_total":
                hits += sample.value
            elif sample.name == "vllm:prefix_cache_queries_total":
                queries += sample.value
            elif sample.name == "vllm:request_success_total":
                done += sample.value
    return hits, queries, done


def _engine_argv(port: int, cfg: SessionlessConfig) -> list[str]:
    return rolloutpool_argv(
        "engine-sim",
        "--port", str(port),
        "--model", "sim",
        "--time-scale", f"{cfg.time_scale:g}",
        "--max-model-len", "16384",
        "--kv-capacity-tokens", str(cfg.kv_capacity_tokens),
        "--seed", str(cfg.seed),
    )  # fmt: skip


def measure(router: str, workload: str, cfg: SessionlessConfig, *, log_dir: Path) -> Row:
    """One router on one workload, on two fresh engine-sims."""
    with ProcessSet(log_dir / f"{router}-{workload}") as procs:
        (log_dir / f"{router}-{workload}").mkdir(parents=True, exist_ok=True)
        engines = []
        for i in range(2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            procs.start(f"engine{i}", _engine_argv(port, cfg), ready_url=f"{url}/health")
            engines.append(url)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        if router == "cache-aware":
            launch = RouterLaunch(
                replica_urls=tuple(engines),
                port=port,
                kv_capacity_tokens=cfg.kv_capacity_tokens,
                max_model_len=None,
                time_scale=cfg.time_scale,
                scrape_interval_s=0.5,
                queue_timeout_s=60,
                prometheus_port=free_port(),
            )
            procs.start("router", vllm_router_argv("vllm-cache-aware", launch, binary=cfg.vllm_router_bin),
                        ready_url=f"{url}/health")  # fmt: skip
        else:
            argv = rolloutpool_argv("router", "--port", str(port), "--scrape-interval", "0.5")
            if router == "ours-off":
                argv.append("--no-implicit-sessions")
            for i, engine in enumerate(engines):
                argv += ["--replica", f"r{i}={engine}"]
            procs.start("router", argv, ready_url=f"{url}/readyz")
        tally = asyncio.run(run_rollouts(url, cfg, workload=workload, with_ids=router == "ours-ids"))
        counts = [_engine_counts(engine) for engine in engines]
    hits, queries = sum(c[0] for c in counts), sum(c[1] for c in counts)
    return Row(
        router=router,
        workload=workload,
        turns=tally.turns,
        later_turns=tally.later,
        lost_turns=tally.lost,
        moved_turns=None if router == "cache-aware" else tally.moved,
        errors=tally.errors,
        hit_ratio=round(hits / queries, 3) if queries else 0.0,
        requests_per_engine=[int(c[2]) for c in counts],
    )


def _table(rows: Sequence[Row]) -> str:
    head = f"{'workload':<8} {'router':<12} {'lost':>9} {'moved':>6} {'hit ratio':>9} {'per engine':>12} {'errors':>6}"
    lines = [head]
    for r in rows:
        moved = "-" if r.moved_turns is None else str(r.moved_turns)
        spread = "/".join(str(n) for n in r.requests_per_engine)
        lines.append(
            f"{r.workload:<8} {r.router:<12} {f'{r.lost_turns}/{r.later_turns}':>9} {moved:>6} "
            f"{r.hit_ratio:>9.3f} {spread:>12} {r.errors:>6}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurement; print the table (and write JSON with ``--out``)."""
    parser = argparse.ArgumentParser(
        prog="python -m rolloutpool.dev.bench.sessionless", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="repeatable; default: all")
    parser.add_argument("--router", action="append", choices=ROUTERS, help="repeatable; default: all but ours-off")
    parser.add_argument("--vllm-router-bin", default=str(Path(sys.executable).parent / "vllm-router"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    cfg = SessionlessConfig(
        rollouts=args.rollouts,
        turns=args.turns,
        group_size=args.group_size,
        seed=args.seed,
        vllm_router_bin=args.vllm_router_bin,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="sessionless-") as tmp:
        for workload in args.workload or WORKLOADS:
            for router in args.router or DEFAULT_ROUTERS:
                rows.append(measure(router, workload, cfg, log_dir=Path(tmp)))
                print(_table(rows[-1:]).splitlines()[1], flush=True)
    print(_table(rows))
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
