"""engine-sim against a real vLLM: the same traffic, compared on what the project reads.

``python -m rolloutpool.dev.bench.conformance --out docs/conformance.md`` starts a real vLLM
(the cached CPU install and tiny model, :mod:`rolloutpool.dev.localcluster.vllm_model`)
with a small KV cache, starts engine-sim with the same limits, probes both
(:mod:`rolloutpool.dev.bench.conformance_probe`) and writes the table (item, vLLM 0.32,
engine-sim, match). Rows marked *read* are what the router, the operator or an RL trainer
depends on: they must all match. The page also lists what engine-sim knowingly does not model.
The same run keeps the real vLLM's answers to the RL-trainer cases in :data:`TRAINER_JSON`,
so the unit tier checks engine-sim against them without a vLLM (``tests/test_engine_trainers.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from rolloutpool.api import vllm_metrics as vm
from rolloutpool.dev.bench.conformance_probe import CACHE_LABELS, Observation, TraceShape, counter_reader, probe
from rolloutpool.dev.bench.conformance_trainer import TrainerObservation, compare_trainer, probe_trainer, to_json
from rolloutpool.dev.localcluster.vllm_model import SERVED_MODEL, VllmServer, VllmServerConfig
from rolloutpool.dev.net import free_port
from rolloutpool.engine.server.app import ServerConfig, build_app

__all__ = [
    "NOT_MODELLED",
    "TRAINER_JSON",
    "VLLM_ARGS",
    "Row",
    "compare",
    "main",
    "observe_sim_trainer",
    "render",
    "run",
]

BLOCK_SIZE = 32
NUM_GPU_BLOCKS = 128
MAX_MODEL_LEN = 2048
TRAINER_JSON = Path("tests/data/vllm_trainer_answers.json")
"""The real vLLM's answers to the trainer cases, as the last run recorded them (the unit tier compares with them)."""
VLLM_ARGS = ("--enable-scale-out",)
"""``/inference/v1/generate`` answers 403 without it (vLLM 0.32)."""
SMALL = TraceShape()
EVICT = TraceShape(sessions=6, turns=6, new_tokens=150, max_tokens=30, base=1000)
"""6 sessions growing by 180 tokens a turn: ~6,500 tokens of context against a 4,064-token cache."""

NOT_MODELLED = (
    "Sampling: engine-sim never samples EOS or stop strings; every answer ends on max_tokens or the context "
    "(finish_reason `length`), and its text comes from its own vocabulary.",
    "Tokenizer and chat template: engine-sim tokenizes on whitespace with a Qwen-like template, so prompt_tokens "
    "of text and chat prompts differ from a real model's (token-id prompts are counted the same).",
    "Re-tokenization drift: vLLM may re-tokenize a previous answer differently in the next text/chat prompt "
    "(cached_tokens one block short); engine-sim's tokenizer is stable, so it never does.",
    "Timing: step times come from the cost model of the chosen hardware preset, not from a CPU or GPU; "
    "latency histograms have the same names, types and buckets but other values.",
    "Metrics the project does not read (iteration tokens, request_* histograms, mm cache, estimated flops, "
    "engine_sleep_state, ...) are not exported.",
    "Logprob values: engine-sim makes them up (valid and deterministic: each <= 0, top-k sorted, the sampled "
    "token at its rank), so only their shape matches; the top-k around a scored token depends on that token. "
    "Tool calls, structured output, LoRA, multimodal inputs, echo, logprob_token_ids, /tokenize and the "
    "Responses API are not modelled.",
    "`/inference/v1/generate` and the render endpoints: vLLM 0.32 serves them only with `--enable-scale-out` "
    "(else 403 `PermissionDeniedError`); engine-sim always does. Its weight-version label starts at `0`, "
    "vLLM's at `default`.",
    "A block filled with a hash already cached: vLLM keeps both physical copies until one is freed; "
    "engine-sim adopts the cached block at once (the same hits).",
    "KV events (`--kv-events-config`): that private copy's `BlockRemoved` follows its `BlockStored` in the same batch "
    "where vLLM sends it when the copy is evicted, and a run of decode steps taken at once sends one batch "
    "(`e2e/test_vllm_kv_events_e2e.py` checks both streams against the same residency index).",
    "Chunked-prefill and async-scheduling details inside a step (one token per running request per step).",
)


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    section: str
    item: str
    vllm: str
    sim: str
    match: bool
    read: bool
    """The router, the operator or an RL trainer depends on it."""


def _fmt(value: object) -> str:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple):
        return f"{value[0]} {{{', '.join(value[1])}}}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "(none)"
    return str(value)


def _turn_summary(turns: list[list[int]]) -> str:
    flat = [c for session in turns for c in session]
    return f"{len(flat)} turns, sum {sum(flat)}: " + " / ".join(",".join(str(c) for c in s) for s in turns)


def _chat_rule(turns: list[list[tuple[int, int]]], block: int) -> tuple[int, int, int]:
    """(returning turns, within one block of the previous context, short by more) over chat sessions."""
    total = ok = worse = 0
    for session in turns:
        prev = None
        for prompt, cached in session:
            if prev is not None:
                total += 1
                expected = (min(prev, prompt - 1) // block) * block
                short = expected - cached
                if short <= block:
                    ok += 1
                else:
                    worse += 1
            prev = prompt  # the assistant's answer is re-tokenized into the next prompt: compare prompts
    return total, ok, worse


def compare(real: Observation, sim: Observation) -> list[Row]:
    """The table's rows (pure)."""
    rows: list[Row] = []
    for name in vm.ENGINE_FAMILIES:
        a, b = real.metrics.get(name, "missing"), sim.metrics.get(name, "missing")
        if name == vm.CACHE_CONFIG_INFO and isinstance(a, tuple) and isinstance(b, tuple):
            # an info gauge: the project reads a few labels (rows below); vLLM has many more
            read = ("gauge", tuple(sorted(CACHE_LABELS)))
            a_r = (a[0], tuple(k for k in a[1] if k in CACHE_LABELS))
            b_r = (b[0], tuple(k for k in b[1] if k in CACHE_LABELS))
            rows.append(
                Row("metrics", f"`{name}` type and read labels", _fmt(a_r), _fmt(b_r), a_r == b_r == read, True)
            )
            extra = [k for k in a[1] if k not in b[1]]
            rows.append(Row("metrics", f"`{name}` labels engine-sim lacks", _fmt(extra), "", True, False))
            continue
        rows.append(Row("metrics", f"`{name}` type and labels", _fmt(a), _fmt(b), a == b, True))
    for key in sorted(set(real.cache_config) | set(sim.cache_config)):
        a_s, b_s = real.cache_config.get(key, "missing"), sim.cache_config.get(key, "missing")
        rows.append(Row("metrics", f"`cache_config_info{{{key}}}`", a_s, b_s, a_s == b_s, True))
    read_keys = {
        "completion.usage": {"prompt_tokens", "completion_tokens", "prompt_tokens_details"},
        "completion.usage.prompt_tokens_details": {"cached_tokens"},
        "chat.usage": {"prompt_tokens", "completion_tokens", "prompt_tokens_details"},
        "stream.usage": {"prompt_tokens", "completion_tokens", "prompt_tokens_details"},
    }
    for path in sorted(set(real.keys) | set(sim.keys)):
        a_k, b_k = real.keys.get(path, []), sim.keys.get(path, [])
        wanted = read_keys.get(path)
        if wanted is not None:
            match = wanted <= set(a_k) and wanted <= set(b_k)
            rows.append(Row("answers", f"`{path}` has {', '.join(sorted(wanted))}", _fmt(a_k), _fmt(b_k), match, True))
        else:
            rows.append(Row("answers", f"`{path}` keys", _fmt(a_k), _fmt(b_k), set(a_k) == set(b_k), False))
    for key in sorted(set(real.stream) | set(sim.stream)):
        a_v, b_v = real.stream.get(key), sim.stream.get(key)
        rows.append(Row("stream", key, str(a_v), str(b_v), a_v == b_v, True))
    rows.append(
        Row(
            "cached tokens",
            "returning turns, token-id prompts, nothing evicted (per session)",
            _turn_summary(real.turns),
            _turn_summary(sim.turns),
            real.turns == sim.turns,
            True,
        )
    )
    total_a, _, worse_a = _chat_rule(real.chat_turns, BLOCK_SIZE)
    total_b, _, worse_b = _chat_rule(sim.chat_turns, BLOCK_SIZE)
    rows.append(
        Row(
            "cached tokens",
            "chat returning turns short by more than one block (the router's rule)",
            f"{worse_a} of {total_a}",
            f"{worse_b} of {total_b}",
            worse_a == worse_b == 0,
            True,
        )
    )
    rows.append(
        Row(
            "eviction",
            f"cached tokens per turn, {EVICT.sessions} sessions x {EVICT.turns} turns on {NUM_GPU_BLOCKS} blocks",
            _turn_summary(real.evict_turns),
            _turn_summary(sim.evict_turns),
            real.evict_turns == sim.evict_turns,
            True,
        )
    )
    for name in sorted(real.counters):
        a_c, b_c = real.counters[name], sim.counters.get(name, float("nan"))
        rows.append(Row("eviction", f"`{name}` over the trace", f"{a_c:.0f}", f"{b_c:.0f}", a_c == b_c, True))
    for label, a_e in real.errors.items():
        b_e = sim.errors.get(label, (0, "missing", None))
        rows.append(Row("errors", f"{label}: status", str(a_e[0]), str(b_e[0]), a_e[0] == b_e[0], True))
        rows.append(
            Row(
                "errors",
                f"{label}: type, param",
                f"{a_e[1]}, {a_e[2]}",
                f"{b_e[1]}, {b_e[2]}",
                a_e[1:] == b_e[1:],
                False,
            )
        )
    rows += [Row(*row, read=True) for row in compare_trainer(real.trainer, sim.trainer)]
    return rows


def render(rows: list[Row], *, command: str, seconds: float) -> str:
    """The markdown page (pure)."""
    read_bad = [r for r in rows if r.read and not r.match]
    other_bad = [r for r in rows if not r.read and not r.match]
    lines = [
        "# engine-sim conformance with vLLM 0.32",
        "",
        f"Generated by `{command}` in {seconds:.0f} s: a real vLLM 0.32.0 (CPU build, the tiny local model, "
        f"block size {BLOCK_SIZE}, `--num-gpu-blocks-override {NUM_GPU_BLOCKS}`, `--enable-prompt-tokens-details`, "
        "`--enable-scale-out`) and engine-sim with the same limits get the same requests, one at a time. *Read* "
        "rows are what the router, the operator or an RL trainer depends on. Trainer answers compare shapes: "
        "every JSON path with its types and list lengths (a top-k map of k or k + 1 entries reads `k..k+1`; "
        "`bytes` and a chat prompt's `prompt_logprobs` follow the tokenizer and are not counted).",
        "",
        f"**{len(read_bad)} mismatches on read rows; {len(other_bad)} on informational rows.**",
        "",
        "| section | item | vLLM 0.32 | engine-sim | match | read |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cells = (r.section, r.item, r.vllm, r.sim, "yes" if r.match else "**no**", "read" if r.read else "")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "## What engine-sim knowingly does not model", ""]
    lines += [f"- {item}" for item in NOT_MODELLED]
    return "\n".join(lines) + "\n"


@contextlib.asynccontextmanager
async def _engine_sim() -> AsyncIterator[str]:
    config = ServerConfig(
        model=SERVED_MODEL,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        gpu_memory_utilization=0.92,
        time_scale=1000.0,
    )
    runner = web.AppRunner(build_app(config), shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def observe_sim() -> Observation:
    """Probe a fresh engine-sim configured like the tiny vLLM."""
    async with _engine_sim() as url:
        return await probe(url, model=SERVED_MODEL, shape=SMALL, evict=EVICT)


async def observe_sim_trainer() -> TrainerObservation:
    """Only the trainer cases, on a fresh engine-sim configured like the tiny vLLM (the unit tier's check)."""
    async with _engine_sim() as url, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        return await probe_trainer(http, url, model=SERVED_MODEL, counters=counter_reader(http, url))


async def run(*, vllm_url: str | None) -> tuple[Observation, Observation]:
    """Probe a real vLLM (started here unless ``vllm_url`` is given: then it must be fresh) and engine-sim."""
    if vllm_url is not None:
        real = await probe(vllm_url, model=SERVED_MODEL, shape=SMALL, evict=EVICT)
    else:
        server = VllmServer(VllmServerConfig(port=free_port(), num_gpu_blocks=NUM_GPU_BLOCKS, extra_args=VLLM_ARGS))
        await asyncio.to_thread(server.start)
        try:
            real = await probe(server.url, model=SERVED_MODEL, shape=SMALL, evict=EVICT)
        finally:
            await asyncio.to_thread(server.stop)
    return real, await observe_sim()


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the conformance page; exit 1 when a read row mismatches."""
    parser = argparse.ArgumentParser(prog="python -m rolloutpool.dev.bench.conformance")
    parser.add_argument("--out", type=Path, default=Path("docs/conformance.md"))
    parser.add_argument(
        "--trainer-json",
        type=Path,
        default=TRAINER_JSON,
        help="Where to keep the real vLLM's trainer answers (shapes and n > 1 accounting) for the unit tier.",
    )
    parser.add_argument(
        "--vllm-url",
        default=None,
        help="A fresh tiny vLLM already serving with --enable-scale-out (default: start one).",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    real, sim = asyncio.run(run(vllm_url=args.vllm_url))
    rows = compare(real, sim)
    command = "python -m rolloutpool.dev.bench.conformance --out docs/conformance.md"
    args.out.write_text(render(rows, command=command, seconds=time.monotonic() - started))
    args.trainer_json.write_text(json.dumps(to_json(real.trainer), indent=1, sort_keys=True) + "\n")
    bad = [r for r in rows if r.read and not r.match]
    for r in bad:
        print(f"MISMATCH {r.section}: {r.item}: vllm={r.vllm} sim={r.sim}", file=sys.stderr)
    print(f"wrote {args.out}: {len(rows)} rows, {len(bad)} read mismatches")
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
