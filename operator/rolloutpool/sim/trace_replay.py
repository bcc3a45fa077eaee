"""Replaying a turn trace in the simulator, and comparing the replay's cached tokens with the recorded ones.

A replay is closed-loop, like the trainer that produced the trace: the fleet keeps the trace's
peak concurrency of sessions in flight and starts the next recorded session (in recorded start
order) when one ends; the first ``in_flight`` start as they started in the trace. Recorded arrival
times are not replayed open-loop, because they are the recorded fleet's answer to its load: a
replay on other caps finishes turns at other times, and a trainer waits for them (each session
still waits its recorded tool gaps). The run ends when the last recorded session does.

The fleet is the trace's own unless the caller says otherwise: its replicas and their reported KV
capacity (``replica`` lines), its ``max_model_len``. :func:`compare` joins the replay's turns with
the recorded ones on (session, turn) and reports cached tokens per turn index and in total.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from rolloutpool.routing.quarantine import expected_cached_tokens
from rolloutpool.routing.trace import Trace, TurnLine
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.fleet import simulate_policy
from rolloutpool.sim.results import RunResult
from rolloutpool.sim.trace_feed import TraceLog, TraceSource, episodes, peak_concurrency
from rolloutpool.sim.workload import Scenario

__all__ = ["Replay", "compare", "recorded_reprefill", "replay", "replay_config", "synthesize"]

_DEFAULT_MAX_MODEL_LEN = 32768
_BUCKETS = (0, 1, 2, 3, 5, 10, 20)
"""Turn-index buckets of the comparison: 0, 1, 2, 3-4, 5-9, 10-19, 20+."""


def _bucket(turn: int) -> str:
    lower = max(b for b in _BUCKETS if b <= turn)
    i = _BUCKETS.index(lower)
    if i + 1 == len(_BUCKETS):
        return f"{lower}+"
    upper = _BUCKETS[i + 1] - 1
    return str(lower) if upper == lower else f"{lower}-{upper}"


def recorded_reprefill(turns: tuple[TurnLine, ...], *, block_size: int = 16) -> int:
    """Tokens a session's turns re-prefilled of the context its previous turn left on the same replica (pure)."""
    total = 0
    for before, after in itertools.pairwise(turns):
        if before.replica != after.replica or after.cached_tokens is None:
            continue
        limit = expected_cached_tokens(
            previous_context=before.prompt_tokens + before.output_tokens - 1,
            prompt_tokens=after.prompt_tokens,
            block_size=block_size,
        )
        total += max(0, limit - after.cached_tokens)
    return total


def replay_config(
    trace: Trace,
    *,
    base: FleetConfig | None = None,
    time_scale: float = 1.0,
    replicas: int | None = None,
    num_gpu_blocks: int | None = None,
    max_model_len: int | None = None,
) -> FleetConfig:
    """The fleet a trace replays on (pure): the trace's unless overridden, ``base`` for everything else."""
    eps = episodes(trace)
    if not eps:
        raise ValueError("the trace has no session that starts at turn 0: nothing to replay")
    names = {t.replica for e in eps for t in e.turns} | {r.name for r in trace.replicas}
    capacities = Counter(
        (r.capacity_tokens, r.block_size) for r in trace.replicas if r.capacity_tokens and r.block_size
    )
    if num_gpu_blocks is None and capacities:
        (tokens, block), _ = capacities.most_common(1)[0]
        num_gpu_blocks = tokens // block
    longest = TraceSource(eps).max_context() + 2
    mml = max_model_len or trace.header.max_model_len or max(_DEFAULT_MAX_MODEL_LEN, longest)
    in_flight = peak_concurrency(eps)
    first = eps[min(in_flight, len(eps)) - 1].start - eps[0].start
    scenario = Scenario(name="trace", description=f"a recorded trace of {len(eps)} sessions", max_model_len=mml)
    span = max(t.ended for e in eps for t in e.turns) - eps[0].start
    config = base or FleetConfig(scenario=scenario, in_flight=in_flight)
    return replace(
        config,
        scenario=scenario,
        in_flight=in_flight,
        replicas=replicas or max(1, len(names)),
        num_gpu_blocks=num_gpu_blocks if num_gpu_blocks is not None else config.num_gpu_blocks,
        start_spread_s=first * time_scale * in_flight / max(1, in_flight - 1),
        duration_s=max(60.0, span * time_scale * 20),  # an upper bound: the run ends with its last session
    )


@dataclass(frozen=True)
class Replay:
    """One replay of a trace under one policy."""

    policy: str
    config: FleetConfig
    result: RunResult
    log: TraceLog
    source: TraceSource


def replay(trace: Trace, config: FleetConfig, policy: str, *, time_scale: float = 1.0) -> Replay:
    """Replay the trace's sessions on ``config`` (see :func:`replay_config`) under ``policy``."""
    source = TraceSource(episodes(trace), time_scale=time_scale)
    log = TraceLog()
    result = simulate_policy(config, policy, source=source, recorder=log)
    return Replay(policy=policy, config=config, result=result, log=log, source=source)


def compare(run: Replay) -> dict[str, Any]:
    """The replay's cached tokens beside the recorded ones, per turn and in total (pure).

    Rows per turn-index bucket: turns matched, recorded and replayed cached tokens, and the median
    absolute per-turn error; the totals; ``turns_missing``: recorded turns the replay did not run
    (a session the replay ended earlier, at the context limit or its end of time).
    """
    replayed: dict[tuple[int, int], int] = {}
    makespan = busy = 0.0
    for line in run.log.lines:
        if line["kind"] == "turn":
            replayed[int(line["session"]), int(line["turn"])] = int(line["cached_tokens"] or 0)
            makespan = max(makespan, float(line["ended"]))
            busy += float(line["ended"]) - float(line["arrived"])
    rows: dict[str, dict[str, list[int]]] = {}
    missing = unreported = 0
    for index, episode in enumerate(run.source.episodes):
        for turn in episode.turns:
            got = replayed.get((index, turn.turn))
            if got is None:
                missing += 1
                continue
            if turn.cached_tokens is None:  # the engine did not report it: nothing to compare
                unreported += 1
                continue
            row = rows.setdefault(_bucket(turn.turn), {"recorded": [], "replayed": [], "prompt": []})
            row["recorded"].append(turn.cached_tokens or 0)
            row["replayed"].append(got)
            row["prompt"].append(turn.prompt_tokens)

    def summary(recorded: list[int], again: list[int], prompt: list[int]) -> dict[str, Any]:
        errors = [abs(a - b) for a, b in zip(recorded, again, strict=True)]
        total = sum(recorded)
        return {
            "turns": len(recorded),
            "recorded_cached": total,
            "replayed_cached": sum(again),
            "total_error": (sum(again) - total) / total if total else None,
            "median_abs_error_tokens": statistics.median(errors) if errors else None,
            "median_abs_error_of_prompt": statistics.median(e / max(1, p) for e, p in zip(errors, prompt, strict=True))
            if errors
            else None,
        }

    order = sorted(rows, key=lambda b: int(b.rstrip("+").split("-")[0]))
    everything: dict[str, list[int]] = {"recorded": [], "replayed": [], "prompt": []}
    for bucket in order:
        for key in everything:
            everything[key] += rows[bucket][key]
    return {
        "policy": run.policy,
        "sessions": len(run.source.episodes),
        "in_flight": run.config.in_flight,
        "replicas": run.config.replicas,
        "fixed_cap": run.config.fixed_cap,
        "kv_capacity_tokens": None if run.config.num_gpu_blocks is None else run.config.num_gpu_blocks * 16,
        "turns_missing": missing,
        "turns_unreported": unreported,
        "non_append_turns": run.source.non_append,
        "replay_makespan_s": round(makespan, 1),
        "replay_mean_turn_s": round(busy / len(replayed), 3) if replayed else None,
        "recorded_reprefill_tokens": sum(recorded_reprefill(e.turns) for e in run.source.episodes),
        "replayed_reprefill_tokens": run.result.reprefilled_tokens,
        "by_turn": {b: summary(rows[b]["recorded"], rows[b]["replayed"], rows[b]["prompt"]) for b in order},
        "total": summary(everything["recorded"], everything["replayed"], everything["prompt"]),
    }


def synthesize(config: FleetConfig, policy: str) -> tuple[RunResult, list[dict[str, Any]]]:
    """Run the workload generator's scenario and return the run and its trace's lines (header first)."""
    log = TraceLog()
    result = simulate_policy(config, policy, recorder=log)
    lines = [log.header(max_model_len=config.scenario.max_model_len)]
    blocks = config.num_gpu_blocks
    if blocks is not None:
        lines += [
            {"kind": "replica", "name": f"r{i}", "capacity_tokens": blocks * 16, "block_size": 16, "at": 0.0}
            for i in range(config.replicas)
        ]
    return result, lines + log.lines
