"""What the four framework-style clients share: a turn's verdict and the summary they print.

Each client runs several multi-turn trajectories at once (more than the fleet's cap, so
that new ones wait) and records every turn here. A turn is judged by what the engine
reports back, so the same code judges vllm-router and ours:

- **lost**: a planned turn that did not complete (an error answer, a dropped
  connection, a timeout, or a turn never sent because an earlier one of its trajectory
  failed).
- **affinity miss**: a later turn whose ``usage.prompt_tokens_details.cached_tokens``
  fell short of the blocks its previous turn's prompt filled. The previous prompt was
  resident on the engine that served it; a shortfall means the turn landed elsewhere.
  Where the router names the engine (ours adds ``X-RolloutPool-Replica``), a shortfall
  on the same engine is counted as **evicted** instead (the prefix was no longer
  resident); vllm-router does not name it, so there every shortfall counts as a miss:
  run the engines with a KV pool that holds the workload (as ``run_all.py`` does) and
  nothing is evicted.
- **logprobs**: the turn's answer carried per-token logprobs for every output token.

The summary is one JSON object on stdout; the exit code is 0 only when no turn was
lost, no turn missed its prefix and every turn carried logprobs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

REPLICA_HEADER = "X-RolloutPool-Replica"
"""The engine our router forwarded to; vllm-router sends no such header."""


def client_parser(doc: str | None, *, model: bool = True, token_ids: bool = True) -> argparse.ArgumentParser:
    """The options every client style takes (``model``: --model; ``token_ids``: prompt and observation sizes)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="vllm-router or rolloutpool router.")
    if model:
        parser.add_argument("--model", default=None, help="Served model (default: the first of /v1/models).")
    parser.add_argument("--turns", type=int, default=4)
    if token_ids:
        parser.add_argument("--prompt-tokens", type=int, default=200)
        parser.add_argument("--observation-tokens", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--tool-time", type=float, default=0.05, help="Seconds between a reply and the next turn.")
    parser.add_argument("--block-size", type=int, default=16, help="The engines' KV block size.")
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--health-timeout", type=float, default=30.0)
    return parser


def cached_tokens(usage: dict[str, Any] | None) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens``; ``None`` when the server does not report it."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    value = details.get("cached_tokens")
    return int(value) if isinstance(value, int) else None


@dataclass
class Trajectory:
    """What the previous turn of one trajectory left behind."""

    prompt_tokens: int = 0
    engine: str | None = None
    turns_done: int = 0


@dataclass
class Tally:
    """Every turn of every trajectory, and the verdicts the summary prints."""

    client: str
    url: str
    block_size: int = 16
    planned: int = 0
    turns: int = 0
    misses: int = 0
    evicted: int = 0
    unknown_cache: int = 0
    logprobs_missing: int = 0
    engines: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    """A client's own verdicts besides the three every client has."""
    started: float = field(default_factory=time.monotonic)

    def turn(
        self,
        trajectory: Trajectory,
        *,
        usage: dict[str, Any] | None,
        engine: str | None,
        logprobs_ok: bool,
    ) -> None:
        """Record one completed turn of ``trajectory``."""
        self.turns += 1
        if engine is not None:
            self.engines[engine] += 1
        if not logprobs_ok:
            self.logprobs_missing += 1
        cached = cached_tokens(usage)
        if trajectory.turns_done > 0:
            resident = (trajectory.prompt_tokens // self.block_size) * self.block_size
            if cached is None:
                self.unknown_cache += 1
            elif cached < resident:
                same = engine is not None and engine == trajectory.engine
                if same:
                    self.evicted += 1
                else:
                    self.misses += 1
        trajectory.prompt_tokens = int((usage or {}).get("prompt_tokens") or 0)
        trajectory.engine = engine
        trajectory.turns_done += 1

    def lost(self, what: str) -> None:
        """A request of a turn failed: the trajectory stops here (its remaining turns are lost)."""
        self.errors.append(what[:300])

    @property
    def lost_turns(self) -> int:
        return self.planned - self.turns

    def verdicts(self) -> dict[str, bool]:
        return {
            "no lost turns": self.lost_turns == 0,
            "no affinity misses": self.misses == 0,
            "logprobs present": self.logprobs_missing == 0 and self.turns > 0,
            **self.checks,
        }

    def report(self) -> int:
        """Print the summary as one JSON object; return the exit code (0: every verdict holds)."""
        verdicts = self.verdicts()
        summary = {
            "client": self.client,
            "url": self.url,
            "turns": self.turns,
            "planned_turns": self.planned,
            "lost_turns": self.lost_turns,
            "affinity_misses": self.misses,
            "evicted": self.evicted,
            "cached_tokens_unreported": self.unknown_cache,
            "turns_without_logprobs": self.logprobs_missing,
            "engines": dict(sorted(self.engines.items())) or "not named by the router",
            "elapsed_s": round(time.monotonic() - self.started, 2),
            **self.extra,
            "errors": self.errors[:5],
            "verdicts": {k: "ok" if v else "FAIL" for k, v in verdicts.items()},
        }
        print(json.dumps(summary, indent=2))
        return 0 if all(verdicts.values()) else 1


async def wait_healthy(http: aiohttp.ClientSession, url: str, timeout_s: float) -> None:
    """Poll ``GET /health`` until it answers 200, as SkyRL and ART's launchers do."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with http.get(f"{url}/health") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise SystemExit(f"{url}/health did not answer 200 within {timeout_s} s")


async def served_model(http: aiohttp.ClientSession, url: str) -> str:
    """The first model of ``GET /v1/models`` (what a trainer configures as its model name)."""
    async with http.get(f"{url}/v1/models") as resp:
        resp.raise_for_status()
        return str((await resp.json())["data"][0]["id"])


def observation_ids(trajectory: int, turn: int, length: int) -> list[int]:
    """A tool observation as token ids (what the trainer's own tokenizer would give): deterministic, distinct."""
    return [1000 + (trajectory * 7919 + turn * 104_729 + i * 31) % 30_000 for i in range(length)]
