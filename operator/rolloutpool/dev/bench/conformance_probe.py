"""Observe one engine (real vLLM or engine-sim) the way the router and the operator read it.

:func:`probe` sends the same deterministic traffic to an engine at a base URL and
returns an :class:`Observation`: the metric families the project reads (type, label
keys, a few label values), the answer and usage keys of completions and chat, the
stream framing and tail, ``cached_tokens`` on the returning turns of multi-turn
sessions (token-id prompts, replayed with the engine's own output ids, and chat), the
prefix-cache counters over an oversubscribed trace, error shapes, and last what RL
trainers read (:mod:`rolloutpool.dev.bench.conformance_trainer`).
:mod:`rolloutpool.dev.bench.conformance` compares two observations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from rolloutpool.api import vllm_metrics as vm
from rolloutpool.dev.bench.conformance_trainer import Counters, TrainerObservation, probe_trainer

__all__ = ["CACHE_LABELS", "ERROR_CASES", "Observation", "TraceShape", "counter_reader", "probe", "scrape", "total"]

CACHE_LABELS = ("block_size", "num_gpu_blocks", "enable_prefix_caching", "kv_cache_size_tokens", "engine")

ERROR_CASES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("unknown model", "/v1/completions", {"model": "nope", "prompt": [1, 2, 3]}),
    ("prompt over the context", "/v1/completions", {"prompt": list(range(5, 2105)), "max_tokens": 2}),
    ("max_tokens of the wrong type", "/v1/completions", {"prompt": [1, 2], "max_tokens": "x"}),
    ("max_tokens 0", "/v1/completions", {"prompt": [1, 2], "max_tokens": 0}),
    ("no prompt", "/v1/completions", {"max_tokens": 2}),
    ("empty prompt", "/v1/completions", {"prompt": [], "max_tokens": 2}),
    ("n 0", "/v1/completions", {"prompt": [1, 2], "n": 0}),
    ("stream of the wrong type", "/v1/completions", {"prompt": [1, 2], "stream": "x"}),
    ("empty messages", "/v1/chat/completions", {"messages": []}),
    ("logprobs over max_logprobs", "/v1/completions", {"prompt": [1, 2], "logprobs": 21}),
    ("logprobs -2", "/v1/completions", {"prompt": [1, 2], "logprobs": -2}),
    ("prompt_logprobs streamed", "/v1/completions", {"prompt": [1, 2], "prompt_logprobs": 1, "stream": True}),
    (
        "top_logprobs without logprobs",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
    ),
    ("generate n over max_num_seqs", "/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"n": 9}}),
    ("generate n 0", "/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"n": 0}}),
    (
        "generate logprobs over max_logprobs",
        "/inference/v1/generate",
        {"token_ids": [1, 2], "sampling_params": {"logprobs": 21}},
    ),
)


@dataclass(frozen=True)
class TraceShape:
    """The multi-turn traffic: sessions x turns, tokens added per turn, tokens generated per turn."""

    sessions: int = 4
    turns: int = 6
    new_tokens: int = 70
    max_tokens: int = 20
    base: int = 100
    """Where the trace's token sequence starts (ids are spread over the tiny model's 2048)."""


@dataclass
class Observation:
    """Everything read from one engine."""

    metrics: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """Family name -> (type, sorted label keys but ``le``/``quantile``)."""
    cache_config: dict[str, str] = field(default_factory=dict)
    keys: dict[str, list[str]] = field(default_factory=dict)
    """A JSON path -> its sorted keys (answers, choices, usage, stream chunks)."""
    stream: dict[str, Any] = field(default_factory=dict)
    turns: list[list[int]] = field(default_factory=list)
    """``cached_tokens`` of each turn of each token-id session (small trace, nothing evicted)."""
    chat_turns: list[list[tuple[int, int]]] = field(default_factory=list)
    """(prompt_tokens, cached_tokens) of each chat turn."""
    evict_turns: list[list[int]] = field(default_factory=list)
    """``cached_tokens`` of each turn of the oversubscribed trace."""
    counters: dict[str, float] = field(default_factory=dict)
    """Counter deltas over the oversubscribed trace."""
    errors: dict[str, tuple[int, str, str | None]] = field(default_factory=dict)
    null_details: Any = None
    trainer: TrainerObservation = field(default_factory=TrainerObservation)
    """What RL trainers read: logprobs, top-k, prompt_logprobs, n > 1 (taken last, after the traces)."""


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


async def scrape(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    """The engine's metric families by name."""
    async with http.get(f"{base}/metrics") as resp:
        return _families(await resp.text())


def counter_reader(http: aiohttp.ClientSession, base: str) -> Counters:
    """Reads named counters (summed samples) of the engine at ``base``."""

    async def read(names: tuple[str, ...]) -> dict[str, float]:
        families = await scrape(http, base)
        return {name: total(families, name) for name in names}

    return read


def total(families: dict[str, Any], name: str) -> float:
    """A family's summed samples (a counter's ``_total``); NaN when the family is absent."""
    fam = families.get(name)
    if fam is None:
        return float("nan")
    return float(sum(s.value for s in fam.samples if s.name in (name, f"{name}_total")))


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(url, json=body) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except json.JSONDecodeError:
            return resp.status, text


async def _stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    async with http.post(url, json=body) as resp:
        buffer = b""
        async for chunk in resp.content.iter_any():
            buffer += chunk
            while b"\n\n" in buffer:
                raw, buffer = buffer.split(b"\n\n", 1)
                data = raw.decode().removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _keys(value: Any) -> list[str]:
    return sorted(value) if isinstance(value, dict) else []


async def probe(base: str, *, model: str, shape: TraceShape, evict: TraceShape) -> Observation:
    """Send the traffic to one engine and read what the project reads."""
    obs = Observation()
    common = {"model": model, "ignore_eos": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        fams = await scrape(http, base)
        for name in vm.ENGINE_FAMILIES:
            fam = fams.get(name)
            if fam is not None:
                labels = sorted({k for s in fam.samples for k in s.labels if k not in ("le", "quantile")})
                obs.metrics[name] = (fam.type, tuple(labels))
        info = fams.get(vm.CACHE_CONFIG_INFO)
        if info is not None and info.samples:
            obs.cache_config = {k: info.samples[0].labels.get(k, "") for k in CACHE_LABELS}

        # answer shapes
        url = f"{base}/v1/completions"
        _, reply = await _post(http, url, {**common, "prompt": [5, 6, 7, 8, 9, 10], "max_tokens": 3})
        obs.keys["completion"] = _keys(reply)
        obs.keys["completion.choices[0]"] = _keys(reply["choices"][0])
        obs.keys["completion.usage"] = _keys(reply["usage"])
        obs.keys["completion.usage.prompt_tokens_details"] = _keys(reply["usage"]["prompt_tokens_details"])
        _, chat = await _post(
            http, f"{base}/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "hi"}]}
        )
        obs.keys["chat"] = _keys(chat)
        obs.keys["chat.choices[0].message"] = _keys(chat["choices"][0]["message"])
        obs.keys["chat.usage"] = _keys(chat["usage"])

        # stream framing and tail
        body = {**common, "prompt": [11, 12, 13, 14], "max_tokens": 5, "stream": True}
        events = await _stream(http, url, {**body, "stream_options": {"include_usage": True}})
        token_events = [e for e in events if isinstance(e, dict) and e.get("choices")]
        tail = events[-2] if len(events) > 1 else {}
        # vLLM sends one event per token while its output loop keeps up, and coalesces several tokens into one
        # event when it falls behind (seen on a loaded CPU: 3 events for 4 tokens): the count is a range
        obs.stream = {
            "token events for 5 tokens: 1 to 5": 1 <= len(token_events) <= 5,
            "finish only on the last token event": [bool(e["choices"][0]["finish_reason"]) for e in token_events]
            == [False] * (len(token_events) - 1) + [True],
            "usage chunk has choices []": isinstance(tail, dict) and tail.get("choices") == [],
            "usage chunk has cached_tokens": isinstance(tail, dict)
            and isinstance((tail.get("usage") or {}).get("prompt_tokens_details"), dict),
            "last event is [DONE]": events[-1] == "[DONE]",
        }
        obs.keys["stream.chunk"] = _keys(token_events[0]) if token_events else []
        obs.keys["stream.chunk.choices[0]"] = _keys(token_events[0]["choices"][0]) if token_events else []
        obs.keys["stream.usage"] = _keys(tail.get("usage") if isinstance(tail, dict) else None)
        chat_events = await _stream(
            http,
            f"{base}/v1/chat/completions",
            {**common, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True},
        )
        first = chat_events[0] if chat_events else {}
        role_first = isinstance(first, dict) and bool(first.get("choices")) and "role" in first["choices"][0]["delta"]
        obs.stream["chat events for 4 tokens: the role event, then 1 to 4"] = (
            role_first and 2 <= len(chat_events) - 1 <= 5
        )

        # multi-turn, token ids, nothing evicted
        obs.turns = await _sessions(http, url, common, shape)
        obs.chat_turns = await _chat_sessions(http, f"{base}/v1/chat/completions", common, shape)

        # an oversubscribed cache: counters and per-turn cached tokens
        before = await scrape(http, base)
        obs.evict_turns = await _sessions(http, url, common, evict)
        after = await scrape(http, base)
        for name in (vm.PREFIX_CACHE_QUERIES, vm.PREFIX_CACHE_HITS, vm.PROMPT_TOKENS):
            obs.counters[name] = total(after, name) - total(before, name)
        obs.counters[vm.PROMPT_TOKENS_CACHED] = total(after, vm.PROMPT_TOKENS_CACHED) - total(
            before, vm.PROMPT_TOKENS_CACHED
        )

        for label, path, err_body in ERROR_CASES:
            status, error = await _post(http, f"{base}{path}", {"model": model, **err_body})
            detail = error.get("error", {}) if isinstance(error, dict) else {}
            obs.errors[label] = (status, str(detail.get("type")), detail.get("param"))

        obs.trainer = await probe_trainer(http, base, model=model, counters=counter_reader(http, base))
    return obs


async def _sessions(
    http: aiohttp.ClientSession, url: str, common: dict[str, Any], shape: TraceShape
) -> list[list[int]]:
    """Round-robin token-id sessions; each turn resends the context with the engine's own output ids."""
    contexts: list[list[int]] = [[] for _ in range(shape.sessions)]
    cached: list[list[int]] = [[] for _ in range(shape.sessions)]
    next_id = shape.base
    for _ in range(shape.turns):
        for s in range(shape.sessions):
            new = [3 + ((next_id + i) * 7919) % 2040 for i in range(shape.new_tokens)]  # ids < 2048
            next_id += shape.new_tokens
            prompt = contexts[s] + new
            status, reply = await _post(
                http, url, {**common, "prompt": prompt, "max_tokens": shape.max_tokens, "return_token_ids": True}
            )
            if status != 200:
                raise RuntimeError(f"turn failed with {status}: {reply}")
            cached[s].append(int(reply["usage"]["prompt_tokens_details"]["cached_tokens"]))
            contexts[s] = prompt + list(reply["choices"][0]["token_ids"])
    return cached


async def _chat_sessions(
    http: aiohttp.ClientSession, url: str, common: dict[str, Any], shape: TraceShape
) -> list[list[tuple[int, int]]]:
    """Chat sessions: the assistant's text goes back as a message, re-tokenized by the engine."""
    out: list[list[tuple[int, int]]] = []
    for s in range(2):
        messages: list[dict[str, str]] = []
        turns = []
        for t in range(shape.turns):
            words = " ".join(f"w{(s * 97 + t * 13 + i) % 50}" for i in range(30))
            messages.append({"role": "user", "content": f"Session {s} turn {t}: {words}"})
            status, reply = await _post(http, url, {**common, "messages": messages, "max_tokens": shape.max_tokens})
            if status != 200:
                raise RuntimeError(f"chat turn failed with {status}: {reply}")
            use = reply["usage"]
            turns.append((int(use["prompt_tokens"]), int(use["prompt_tokens_details"]["cached_tokens"])))
            messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        out.append(turns)
    return out
