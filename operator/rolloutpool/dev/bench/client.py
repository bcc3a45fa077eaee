"""The RL-style rollout driver of the benchmark (asyncio + aiohttp) and its accounting.

It behaves like an asynchronous GRPO trainer's rollout workers (DESIGN section 6):
``in_flight`` trajectories at all times, a new one started as soon as one ends.
Each turn is an OpenAI chat completion carrying the session key twice (header
``X-Session-ID`` and body ``session_id``); the reply is appended, then, after the
drawn tool latency (divided by the time scale), a synthetic observation of the
drawn length. A trajectory ends after its drawn turns or at ``max_model_len`` and is
released with ``POST /finish_session?session_id=ID``, as RL frameworks do with
vllm-router. Every turn records its prompt, cached and completion tokens, so
re-prefill is measured from what the engines report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from rolloutpool.routing.quarantine import expected_cached_tokens
from rolloutpool.sim.workload import Scenario, Trajectory, TrajectorySource

__all__ = [
    "ClientConfig",
    "ClientResult",
    "TrajectoryRecord",
    "TurnRecord",
    "observation_text",
    "prompt_text",
    "queued_mean",
    "reprefilled_tokens",
    "run_client",
]

_RETRY_STATUSES = frozenset({429, 502, 503})
_USER_OVERHEAD = 3
"""Tokens a user message adds besides its words: ``<|im_start|>``, ``user``, ``<|im_end|>``."""
_TURN_OVERHEAD = 6
"""Tokens a turn adds besides the observation's words: the reply's ``<|im_end|>``, the
user message's three, and the next generation prompt's ``<|im_start|>assistant``."""


def reprefilled_tokens(
    *, previous_context: int | None, prompt_tokens: int, cached_tokens: int, block_size: int = 16
) -> int:
    """Tokens a returning turn had to prefill again because its prefix was evicted (pure).

    ``previous_context`` is the previous turn's ``prompt_tokens + completion_tokens - 1``
    on the same session (``None`` on the first turn, which is never counted). Expected
    cached tokens follow :func:`rolloutpool.routing.quarantine.expected_cached_tokens`;
    the shortfall of the reported ``cached_tokens`` is the re-prefill.
    """
    if previous_context is None:
        return 0
    expected = expected_cached_tokens(
        previous_context=previous_context, prompt_tokens=prompt_tokens, block_size=block_size
    )
    return max(0, expected - cached_tokens)


def prompt_text(group: int, tokens: int) -> str:
    """The group's shared prompt: ``tokens`` prompt tokens once rendered as one user message."""
    return " ".join(f"g{group}_{i}" for i in range(max(1, tokens - _USER_OVERHEAD - 2)))


def observation_text(index: int, turn: int, tokens: int) -> str:
    """A synthetic tool observation adding ``tokens`` to the context (unique to its trajectory)."""
    return " ".join(f"o{index}_{turn}_{i}" for i in range(max(1, tokens - _TURN_OVERHEAD)))


def _retry_after(value: str | None, default: float) -> float:
    try:
        return float(value) if value else default
    except ValueError:  # an HTTP date: not worth parsing for a sub-second wait
        return default


@dataclass(frozen=True)
class ClientConfig:
    """Every knob of one driver run."""

    base_url: str
    scenario: Scenario
    seed: int
    in_flight: int
    duration_s: float
    """Wall seconds of the measured window; trajectories still running then are abandoned."""
    time_scale: float
    """Simulated seconds per wall second (tool latencies are divided by it)."""
    model: str = "Qwen/Qwen3-8B"
    session_header: str = "X-Session-ID"
    session_prefix: str = "traj"
    group_header: str | None = None
    """Also send each trajectory's GRPO group (``<prefix>-g<group>``) in this header (e.g. ``X-Session-Group``)."""
    request_timeout_s: float = 600.0
    retry_sleep_s: float = 0.25
    """Longest wait before retrying a 429/502/503 (``Retry-After`` is honoured up to this)."""
    block_size: int = 16


@dataclass(frozen=True)
class TurnRecord:
    """One turn as the engine reported it."""

    trajectory: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reprefilled_tokens: int
    at: float = 0.0
    """Wall clock (``time.monotonic``) when the response arrived."""
    sent: float = 0.0
    """Wall clock when the turn's request was first sent (``at - sent``: its time in the router and the engine,
    retries included)."""


@dataclass
class TrajectoryRecord:
    """One trajectory's outcome."""

    index: int
    group: int
    planned_turns: int
    started: float
    """Wall clock (``time.monotonic``)."""
    turns: int = 0
    first_turn_at: float | None = None
    """Wall clock when the first turn's response arrived (admission queueing + the first turn)."""
    finished: float | None = None
    completed: bool = False
    """Ended by its drawn turns or ``max_model_len`` inside the window."""
    error: str | None = None

    def sim_seconds(self, time_scale: float) -> float | None:
        """Duration in simulated seconds, if finished."""
        return None if self.finished is None else (self.finished - self.started) * time_scale


@dataclass
class ClientResult:
    """Everything one driver run observed."""

    window_start: float
    window_end: float = 0.0
    trajectories: list[TrajectoryRecord] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    retries: int = 0
    errors: int = 0
    finish_failures: int = 0

    @property
    def completed(self) -> list[TrajectoryRecord]:
        """Trajectories completed inside the window."""
        return [t for t in self.trajectories if t.completed]

    @property
    def reprefilled_tokens(self) -> int:
        """Sum over every turn."""
        return sum(t.reprefilled_tokens for t in self.turns)


def queued_mean(records: list[TrajectoryRecord], *, window_start: float, window_end: float) -> float:
    """Time-averaged trajectories waiting for their first response over the window (pure).

    A trajectory waits from its start until its first turn answers (or the window ends): the
    router's admission queue plus the first turn itself, the same for every router.
    """
    span = window_end - window_start
    if span <= 0:
        return 0.0
    waited = 0.0
    for record in records:
        begin = max(record.started, window_start)
        end = min(record.first_turn_at if record.first_turn_at is not None else window_end, window_end)
        waited += max(0.0, end - begin)
    return waited / span


class _Driver:
    def __init__(self, config: ClientConfig, http: aiohttp.ClientSession, result: ClientResult) -> None:
        self.config = config
        self.http = http
        self.result = result
        self.source = TrajectorySource(config.scenario, config.seed)
        self.max_model_len = config.scenario.max_model_len
        self._prompts: dict[int, str] = {}

    def _prompt(self, trajectory: Trajectory) -> str:
        if trajectory.group not in self._prompts:
            if len(self._prompts) >= 64:
                self._prompts.clear()
            self._prompts[trajectory.group] = prompt_text(trajectory.group, trajectory.prompt_tokens)
        return self._prompts[trajectory.group]

    async def _chat(self, sid: str, body: dict[str, Any], group: int = 0) -> dict[str, Any] | None:
        """One completion with retries on back-pressure; ``None`` on a hard error."""
        cfg = self.config
        headers = {cfg.session_header: sid}
        if cfg.group_header is not None:
            headers[cfg.group_header] = f"{cfg.session_prefix}-g{group}"
        while True:
            try:
                async with self.http.post(
                    f"{cfg.base_url}/v1/chat/completions", json=body, headers=headers
                ) as response:
                    if response.status == 200:
                        data: dict[str, Any] = await response.json()
                        return data
                    if response.status not in _RETRY_STATUSES:
                        self.result.errors += 1
                        return None
                    retry_after = _retry_after(response.headers.get("Retry-After"), cfg.retry_sleep_s)
            except (aiohttp.ClientConnectionError, TimeoutError):
                retry_after = cfg.retry_sleep_s
            self.result.retries += 1
            await asyncio.sleep(min(retry_after, cfg.retry_sleep_s))

    async def finish(self, sid: str) -> None:
        """``POST /finish_session?session_id=ID`` (best effort)."""
        try:
            async with self.http.post(
                f"{self.config.base_url}/finish_session",
                params={"session_id": sid},
                timeout=aiohttp.ClientTimeout(total=5.0),
            ) as response:
                await response.read()
                if response.status >= 400 and response.status != 404:
                    self.result.finish_failures += 1
        except (aiohttp.ClientError, TimeoutError):
            self.result.finish_failures += 1

    async def run_trajectory(self, trajectory: Trajectory, record: TrajectoryRecord) -> None:
        cfg = self.config
        sid = f"{cfg.session_prefix}-{trajectory.index}"
        messages: list[dict[str, str]] = [{"role": "user", "content": self._prompt(trajectory)}]
        previous_context: int | None = None
        try:
            for turn in range(trajectory.turns):
                body = {
                    "model": cfg.model,
                    "messages": messages,
                    "max_tokens": trajectory.actions[turn],
                    "seed": trajectory.index,
                    "session_id": sid,
                }
                sent = time.monotonic()
                data = await self._chat(sid, body, trajectory.group)
                if data is None:
                    record.error = "request failed"
                    return
                usage = data["usage"]
                prompt, completion = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
                cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                self.result.turns.append(
                    TurnRecord(
                        trajectory=trajectory.index,
                        turn=turn,
                        prompt_tokens=prompt,
                        cached_tokens=cached,
                        completion_tokens=completion,
                        reprefilled_tokens=reprefilled_tokens(
                            previous_context=previous_context,
                            prompt_tokens=prompt,
                            cached_tokens=cached,
                            block_size=cfg.block_size,
                        ),
                        at=time.monotonic(),
                        sent=sent,
                    )
                )
                record.turns = turn + 1
                if turn == 0:
                    record.first_turn_at = time.monotonic()
                previous_context = prompt + completion - 1
                context = prompt + completion
                observation = trajectory.observations[turn]
                if turn + 1 == trajectory.turns or context + observation >= self.max_model_len - 1:
                    break
                messages.append({"role": "assistant", "content": data["choices"][0]["message"]["content"]})
                await asyncio.sleep(trajectory.tool_latencies[turn] / cfg.time_scale)
                messages.append({"role": "user", "content": observation_text(trajectory.index, turn, observation)})
            record.completed = True
        finally:
            record.finished = time.monotonic()
            await asyncio.shield(self.finish(sid))

    async def worker(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            trajectory = self.source.next()
            record = TrajectoryRecord(
                index=trajectory.index,
                group=trajectory.group,
                planned_turns=trajectory.turns,
                started=time.monotonic(),
            )
            self.result.trajectories.append(record)
            await self.run_trajectory(trajectory, record)
            if record.error is not None:
                await asyncio.sleep(self.config.retry_sleep_s)


async def run_client(config: ClientConfig) -> ClientResult:
    """Drive ``in_flight`` trajectories for ``duration_s`` wall seconds; abandon the rest at the deadline."""
    connector = aiohttp.TCPConnector(limit=config.in_flight + 16)
    timeout = aiohttp.ClientTimeout(total=config.request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        result = ClientResult(window_start=time.monotonic())
        driver = _Driver(config, http, result)
        deadline = result.window_start + config.duration_s
        tasks = [asyncio.create_task(driver.worker(deadline)) for _ in range(config.in_flight)]
        try:
            await asyncio.wait(tasks, timeout=config.duration_s)
        finally:
            result.window_end = time.monotonic()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for record in result.trajectories:
            if record.finished is not None and record.finished > result.window_end:
                record.completed = False
        return result


def write_turns(path: Path, result: ClientResult) -> None:
    """Every turn of a run as JSON lines (times relative to the window's start): the data behind the run's figures,
    for paired comparisons of routers on the same trajectories (``turns-<router>.jsonl`` beside the point's logs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for turn in result.turns:
            row = asdict(turn)
            row["at"], row["sent"] = turn.at - result.window_start, turn.sent - result.window_start
            out.write(json.dumps(row) + "\n")
