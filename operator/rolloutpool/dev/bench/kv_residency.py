"""Residency from KV events against the ``cached_tokens`` each returning turn reports (dev tool).

:func:`check_residency` subscribes to an engine's KV events with the router's own subscriber
(:class:`~rolloutpool.router.kv_events.ReplicaKvEvents`, one residency index) and records the raw
stream on a second socket, then drives token-id sessions at the engine one turn at a time,
each round in a seeded shuffled order, each turn resending the session's context with the engine's own output ids and
new tokens, so contexts outgrow a small KV pool and returning turns find their prefixes evicted.
Before each turn it waits until the stream has been quiet for ``quiet_s`` (the engine is idle:
every event of the previous turn has arrived), reads the session's resident tokens from the
index and predicts ``cached_tokens = min(resident, (prompt_len - 1) // block_size * block_size)``
(vLLM never counts the prompt's last token, nor a partial block, as a hit).

The session id travels as vLLM 0.32 reads it, one way per session in turn: the completions
body's ``session_id``, the ``X-Session-ID`` header, ``vllm_xargs.session_id``, and the header on
``/inference/v1/generate``. The same run works against a real vLLM (``e2e/test_vllm_kv_events_e2e.py``)
and engine-sim (``tests/test_kv_events_pubsub.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import zmq
import zmq.asyncio

from rolloutpool.api.kv_events import decode_seq
from rolloutpool.dev.bench.conformance import BLOCK_SIZE, MAX_MODEL_LEN
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.localcluster.vllm_model import SERVED_MODEL, VllmServer, VllmServerConfig
from rolloutpool.dev.net import free_port
from rolloutpool.router.kv_events import ReplicaKvEvents
from rolloutpool.router.kv_sources import KvEventSource
from rolloutpool.routing.residency import IndexStats

__all__ = [
    "CARRIERS",
    "VLLM_BLOCKS",
    "ResidencyReport",
    "StreamShape",
    "TurnCheck",
    "check_engine",
    "check_residency",
    "engine_sim_publishing",
    "kv_events_config",
    "main",
    "same_traces",
    "summary",
    "vllm_publishing",
]

CARRIERS = ("body", "header", "xargs", "generate")
"""Where each session's id travels (session ``i`` uses ``CARRIERS[i % 4]``)."""


@dataclass(frozen=True)
class TurnCheck:
    """One turn: what the index predicted and what the engine reported."""

    session: str
    turn: int
    carrier: str
    prompt_tokens: int
    previous_context: int
    """Tokens of the session's context before this turn (prompt + output of its last turn)."""
    resident: int | None
    """The index's resident tokens of the session just before the turn (None: unknown)."""
    cached: int
    """``usage.prompt_tokens_details.cached_tokens`` of the turn."""
    block_size: int

    @property
    def predicted(self) -> int | None:
        """The hit vLLM's rule allows: whole blocks of the resident prefix, short of the prompt's last token."""
        if self.resident is None:
            return None
        return min(self.resident, (self.prompt_tokens - 1) // self.block_size * self.block_size)

    @property
    def match(self) -> bool:
        return self.predicted == self.cached

    @property
    def evicted(self) -> bool:
        """A returning turn that found less than its previous context's whole blocks cached."""
        whole = min(self.previous_context, self.prompt_tokens - 1) // self.block_size * self.block_size
        return self.turn > 0 and self.cached < whole


@dataclass
class StreamShape:
    """What the raw stream looked like (compared between engines)."""

    fields: dict[str, set[str]] = field(default_factory=dict)
    """Event type -> the field names seen on the wire."""
    batch_lengths: set[int] = field(default_factory=set)
    """Array lengths of the batches (``[ts, events, data_parallel_rank]``: 3)."""
    topics: set[bytes] = field(default_factory=set)
    seqs: list[int] = field(default_factory=list)
    mediums: set[str | None] = field(default_factory=set)
    hash_types: set[str] = field(default_factory=set)
    removed_per_event: set[int] = field(default_factory=set)
    sessions: set[str] = field(default_factory=set)

    def record(self, topic: bytes, seq: int, payload: bytes) -> None:
        self.topics.add(topic)
        self.seqs.append(seq)
        batch = msgspec.msgpack.decode(payload)
        self.batch_lengths.add(len(batch))
        for event in batch[1]:
            kind = event["type"]
            self.fields.setdefault(kind, set()).update(event)
            if "medium" in event:
                self.mediums.add(event["medium"])
            for h in event.get("block_hashes", ()):
                self.hash_types.add(type(h).__name__)
            if kind == "BlockRemoved":
                self.removed_per_event.add(len(event["block_hashes"]))
            if event.get("session_id"):
                self.sessions.add(event["session_id"])


@dataclass
class ResidencyReport:
    """Every turn's check, the stream's shape and the subscriber's counts."""

    turns: list[TurnCheck]
    shape: StreamShape
    stats: IndexStats
    gaps: int
    malformed: int
    after_reset: list[int | None] = field(default_factory=list)
    """With ``reset_at_end``: every session's resident tokens after ``/reset_prefix_cache`` and one more turn."""

    @property
    def returning(self) -> list[TurnCheck]:
        return [t for t in self.turns if t.turn > 0]

    @property
    def matched(self) -> int:
        return sum(t.match for t in self.returning)

    @property
    def mismatches(self) -> list[TurnCheck]:
        return [t for t in self.returning if not t.match]

    @property
    def evicted(self) -> int:
        return sum(t.evicted for t in self.returning)


def _new_tokens(seed: int, n: int) -> list[int]:
    return [3 + ((seed + i) * 7919) % 2040 for i in range(n)]  # ids the tiny vLLM model knows (< 2048)


async def _turn(
    http: aiohttp.ClientSession, base: str, *, model: str, carrier: str, sid: str, prompt: list[int], max_tokens: int
) -> tuple[int, list[int]]:
    """Send one turn; (cached_tokens, output ids)."""
    headers: dict[str, str] = {}
    if carrier == "generate":
        url = f"{base}/inference/v1/generate"
        body: dict[str, Any] = {
            "model": model,
            "token_ids": prompt,
            "sampling_params": {"max_tokens": max_tokens, "temperature": 0.0},
        }
        headers["X-Session-ID"] = sid
    else:
        url = f"{base}/v1/completions"
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "return_token_ids": True,
        }
        if carrier == "body":
            body["session_id"] = sid
        elif carrier == "header":
            headers["X-Session-ID"] = sid
        else:
            body["vllm_xargs"] = {"session_id": sid}
    async with http.post(url, json=body, headers=headers) as resp:
        reply = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"{carrier} turn failed with {resp.status}: {reply}")
    cached = int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])
    return cached, list(reply["choices"][0]["token_ids"])


async def _settle(sub: ReplicaKvEvents, shape: StreamShape, quiet_s: float) -> None:
    """Wait until neither socket has received a batch for ``quiet_s``."""
    while True:
        seen = (sub.batches, len(shape.seqs))
        await asyncio.sleep(quiet_s)
        if (sub.batches, len(shape.seqs)) == seen:
            return


async def _record(sock: zmq.asyncio.Socket, shape: StreamShape) -> None:
    while True:
        topic, seq, payload = await sock.recv_multipart()
        shape.record(topic, decode_seq(seq), payload)


async def check_residency(
    base: str,
    source: KvEventSource,
    *,
    model: str,
    block_size: int,
    sessions: int = 8,
    turns: int = 6,
    first_tokens: int = 200,
    new_tokens: int = 120,
    max_tokens: int = 30,
    carriers: Sequence[str] = CARRIERS,
    quiet_s: float = 0.5,
    connect_s: float = 1.0,
    seed: int = 0,
    reset_at_end: bool = False,
) -> ResidencyReport:
    """Drive ``sessions`` x ``turns`` token-id turns at the engine at ``base``, checking each against the index."""
    ctx = zmq.asyncio.Context()
    sub = ReplicaKvEvents("engine", source, block_size=block_size)
    raw = ctx.socket(zmq.SUB)
    raw.linger = 0
    raw.setsockopt(zmq.SUBSCRIBE, b"")
    raw.connect(source.endpoint)
    shape = StreamShape()
    tasks = [asyncio.create_task(sub.run(ctx)), asyncio.create_task(_record(raw, shape))]
    checks: list[TurnCheck] = []
    try:
        await asyncio.sleep(connect_s)  # both subscriptions joined before the first event
        contexts: list[list[int]] = [[] for _ in range(sessions)]
        order = list(range(sessions))
        rng = random.Random(seed)  # noqa: S311 - a reproducible order, not cryptography
        next_token = 0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            for turn in range(turns):
                rng.shuffle(order)  # not round-robin: under LRU that evicts every prefix before it returns
                for i in order:
                    sid = f"kv-{i}"
                    carrier = carriers[i % len(carriers)]
                    grow = first_tokens if turn == 0 else new_tokens + 40 * (i % 3)
                    prompt = contexts[i] + _new_tokens(next_token, grow)
                    next_token += grow
                    await _settle(sub, shape, quiet_s)
                    resident = sub.index.resident_tokens(sid)
                    cached, output = await _turn(
                        http, base, model=model, carrier=carrier, sid=sid, prompt=prompt, max_tokens=max_tokens
                    )
                    checks.append(
                        TurnCheck(sid, turn, carrier, len(prompt), len(contexts[i]), resident, cached, block_size)
                    )
                    contexts[i] = prompt + output
            after_reset: list[int | None] = []
            if reset_at_end:  # vLLM serves it under VLLM_SERVER_DEV_MODE=1; its event leaves with the next step
                async with http.post(f"{base}/reset_prefix_cache") as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"/reset_prefix_cache answered {resp.status}: {await resp.text()}")
                await _turn(
                    http,
                    base,
                    model=model,
                    carrier="body",
                    sid="kv-reset",
                    prompt=_new_tokens(next_token, 64),
                    max_tokens=1,
                )
                await _settle(sub, shape, quiet_s)
                after_reset = [sub.index.resident_tokens(f"kv-{i}") for i in range(sessions)]
        await _settle(sub, shape, quiet_s)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        raw.close(linger=0)
        ctx.term()
    return ResidencyReport(checks, shape, sub.index.stats, sub.gaps, sub.malformed, after_reset)


# -- a real vLLM and engine-sim side by side ------------------------------------------------------

VLLM_BLOCKS = 72
"""The KV pool of both engines: 72 blocks of 32 tokens (2,272 usable) against 8 growing sessions."""


def kv_events_config(port: int, replay_port: int) -> str:
    """The ``--kv-events-config`` both engines get."""
    return json.dumps(
        {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{replay_port}"}
    )


def _source(port: int, replay_port: int) -> KvEventSource:
    return KvEventSource(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}")


@contextlib.contextmanager
def vllm_publishing(log_dir: Path) -> Iterator[tuple[str, KvEventSource]]:
    """A tiny real vLLM publishing KV events (``/inference/v1/generate`` and ``/reset_prefix_cache`` on)."""
    port, replay = free_port(), free_port()
    server = VllmServer(
        VllmServerConfig(
            port=free_port(),
            num_gpu_blocks=VLLM_BLOCKS,
            extra_args=("--kv-events-config", kv_events_config(port, replay), "--enable-scale-out"),
            extra_env=(("VLLM_SERVER_DEV_MODE", "1"),),
        ),
        log_path=log_dir / "vllm.log",
    )
    server.start()
    try:
        yield server.url, _source(port, replay)
    finally:
        server.stop()


@contextlib.contextmanager
def engine_sim_publishing(log_dir: Path) -> Iterator[tuple[str, KvEventSource]]:
    """``rolloutpool engine-sim`` with the tiny vLLM's limits and the same ``--kv-events-config`` flag."""
    http, port, replay = free_port(), free_port(), free_port()
    argv = rolloutpool_argv(
        "engine-sim",
        *("--port", str(http), "--model", SERVED_MODEL, "--block-size", str(BLOCK_SIZE)),
        *("--num-gpu-blocks", str(VLLM_BLOCKS), "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8"),
        *(
            "--max-num-batched-tokens",
            "2048",
            "--time-scale",
            "1000",
            "--kv-events-config",
            kv_events_config(port, replay),
        ),
    )
    with ProcessSet(log_dir) as processes:
        processes.start("engine-sim", argv, ready_url=f"http://127.0.0.1:{http}/health", timeout_s=60.0)
        yield f"http://127.0.0.1:{http}", _source(port, replay)


async def check_engine(base: str, source: KvEventSource, *, quiet_s: float) -> ResidencyReport:
    """The check both engines run: 8 sessions x 6 turns, then a reset."""
    return await check_residency(
        base, source, model=SERVED_MODEL, block_size=BLOCK_SIZE, quiet_s=quiet_s, reset_at_end=True
    )


def summary(name: str, report: ResidencyReport) -> str:
    """One line of counts."""
    hits = sum(t.cached > 0 for t in report.returning)
    partial = sum(t.evicted and t.cached > 0 for t in report.returning)
    return (
        f"{name}: {report.matched}/{len(report.returning)} returning turns match (cached_tokens = the index's resident "
        f"tokens, capped by vLLM's rule); {report.evicted} found part ({partial}) or all of their prefix evicted, "
        f"{hits} a non-empty hit; gaps {report.gaps}, malformed {report.malformed}, unknown removals "
        f"{report.stats.unknown_removals}; resident tokens after the reset {report.after_reset}"
    )


def same_traces(a: ResidencyReport, b: ResidencyReport) -> bool:
    """Whether both engines reported the same cached_tokens on every turn (prompt lengths equal)."""
    return [(t.prompt_tokens, t.cached) for t in a.turns] == [(t.prompt_tokens, t.cached) for t in b.turns]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check on a fresh tiny vLLM and on engine-sim; print the counts; 1 on any mismatch."""
    parser = argparse.ArgumentParser(prog="python -m rolloutpool.dev.bench.kv_residency")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/rolloutpool-kv-residency"))  # noqa: S108 - dev logs
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    with vllm_publishing(args.log_dir) as (url, source):
        real = asyncio.run(check_engine(url, source, quiet_s=0.5))
    with engine_sim_publishing(args.log_dir) as (url, source):
        sim = asyncio.run(check_engine(url, source, quiet_s=0.2))
    print(summary("vLLM 0.32", real))
    print(summary("engine-sim", sim))
    same = {k: sorted(v) for k, v in real.shape.fields.items()} == {k: sorted(v) for k, v in sim.shape.fields.items()}
    print(f"event fields identical: {same}; turn-by-turn cached_tokens identical: {same_traces(real, sim)}")
    return 0 if same and not real.mismatches and not sim.mismatches else 1


if __name__ == "__main__":  # pragma: no cover - manual entry point
    raise SystemExit(main())
