"""What RL trainers read from an engine: logprobs, top-k, prompt_logprobs, n > 1, token-id strings.

:func:`probe_trainer` sends the same requests (:data:`SHAPE_CASES`, :data:`N_CASES`) to one
engine and returns, per case, the *shape* of the answer: every JSON path with the types
found there and the length of each list (:func:`shape_paths`), and for ``n > 1`` the usage
and the prefix-cache counters. Values (logprobs, texts, token strings) differ between a
real model and engine-sim; shapes must not. Maps keyed by tokens (completions'
``top_logprobs`` entries, ``prompt_logprobs`` entries) are summarised by their size: ``k``
or ``k + 1`` entries (the sampled or prompt token joins the top ``k`` when it is not among
them) both read as ``k..k+1``. Lengths that depend on the tokenizer (``bytes``, a chat
prompt's ``prompt_logprobs``) are not compared. :func:`compare_trainer` turns two
observations into rows of the conformance table.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from rolloutpool.api import vllm_metrics as vm

__all__ = [
    "N_CASES",
    "SHAPE_CASES",
    "Case",
    "Counters",
    "TrainerObservation",
    "compare_trainer",
    "from_json",
    "probe_trainer",
    "shape_paths",
    "to_json",
]

_PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
_MESSAGES = [{"role": "user", "content": "hello there friend"}]
_CMPL, _CHAT, _GEN = "/v1/completions", "/v1/chat/completions", "/inference/v1/generate"
_MAP_SUFFIXES = ("logprobs.top_logprobs[]", "prompt_logprobs[]")
"""Objects at these paths are maps keyed by token (completions' top-k, prompt logprobs): keys are data, not fields."""


@dataclass(frozen=True)
class Case:
    """One request whose answer's shape is compared."""

    name: str
    path: str
    body: dict[str, Any]
    k: int = 0
    """Top entries asked per position, generated or prompt (sizes ``k`` and ``k + 1`` read alike)."""
    free: tuple[str, ...] = ("bytes",)
    """Path suffixes whose list lengths depend on the tokenizer."""

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def _cmpl(**fields: Any) -> dict[str, Any]:
    return {"prompt": _PROMPT, "max_tokens": 3, "ignore_eos": True, **fields}


def _chat(**fields: Any) -> dict[str, Any]:
    return {"messages": _MESSAGES, "max_tokens": 3, "ignore_eos": True, **fields}


def _gen(sampling: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"token_ids": _PROMPT, "sampling_params": {"max_tokens": 3, "ignore_eos": True, **sampling}, **fields}


_CHAT_FREE = ("bytes", "prompt_logprobs")
_USAGE = {"stream_options": {"include_usage": True}}
SHAPE_CASES: tuple[Case, ...] = (
    Case("completions logprobs=2", _CMPL, _cmpl(logprobs=2), k=2),
    Case(
        "completions logprobs=0, token ids, no model (AReaL)", _CMPL, _cmpl(logprobs=0, return_tokens_as_token_ids=True)
    ),
    Case(
        "completions prompt_logprobs=2, logprobs=2, token ids",
        _CMPL,
        _cmpl(logprobs=2, prompt_logprobs=2, return_tokens_as_token_ids=True),
        k=2,
    ),
    Case("completions n=2 logprobs=1 return_token_ids", _CMPL, _cmpl(n=2, logprobs=1, return_token_ids=True), k=1),
    Case("completions stream logprobs=2", _CMPL, _cmpl(logprobs=2, stream=True, **_USAGE), k=2),
    Case(
        "completions stream n=2 token ids",
        _CMPL,
        _cmpl(n=2, logprobs=1, stream=True, return_tokens_as_token_ids=True),
        k=1,
    ),
    Case("chat logprobs top_logprobs=2", _CHAT, _chat(logprobs=True, top_logprobs=2), k=2, free=_CHAT_FREE),
    Case("chat logprobs, no top_logprobs", _CHAT, _chat(logprobs=True), free=_CHAT_FREE),
    Case(
        "chat n=2 token ids prompt_logprobs=2",
        _CHAT,
        _chat(logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True, prompt_logprobs=2, n=2),
        k=2,
        free=_CHAT_FREE,
    ),
    Case(
        "chat stream top_logprobs=2",
        _CHAT,
        _chat(logprobs=True, top_logprobs=2, stream=True, **_USAGE),
        k=2,
        free=_CHAT_FREE,
    ),
    Case("generate logprobs=2 (prime-rl)", _GEN, _gen({"logprobs": 2}), k=2),
    Case("generate no logprobs", _GEN, _gen({})),
    Case(
        "generate logprobs=0 prompt_logprobs=2 return_token_ids",
        _GEN,
        _gen({"logprobs": 0, "prompt_logprobs": 2}, return_token_ids=True),
        k=2,
    ),
    Case("generate n=3 logprobs=1 (SkyRL sample)", _GEN, _gen({"n": 3, "logprobs": 1}), k=1),
    Case("generate output_mode=text logprobs=2", _GEN, _gen({"logprobs": 2}, output_mode="text"), k=2),
    Case("generate stream logprobs=2", _GEN, _gen({"logprobs": 2}, stream=True, **_USAGE), k=2),
    Case(
        "generate stream n=2 return_token_ids",
        _GEN,
        _gen({"n": 2, "logprobs": 1}, stream=True, return_token_ids=True, **_USAGE),
        k=1,
    ),
)
"""Requests whose answers must have vLLM 0.32's shape (``model`` is added to all but the AReaL case)."""

N_CASES: tuple[tuple[str, str, Callable[[list[int]], dict[str, Any]]], ...] = (
    ("completions n=3", _CMPL, lambda ids: {"prompt": ids, "max_tokens": 4, "n": 3, "ignore_eos": True}),
    (
        "completions n=3, streamed",
        _CMPL,
        lambda ids: {"prompt": ids, "max_tokens": 4, "n": 3, "ignore_eos": True, "stream": True, **_USAGE},
    ),
    (
        "completions 2 prompts x n=2",
        _CMPL,
        lambda ids: {"prompt": [ids, ids[:50] + [7] * 50], "max_tokens": 4, "n": 2, "ignore_eos": True},
    ),
    (
        "generate n=3",
        _GEN,
        lambda ids: {"token_ids": ids, "sampling_params": {"max_tokens": 4, "n": 3, "ignore_eos": True}},
    ),
    (
        "generate n=3, streamed",
        _GEN,
        lambda ids: {
            "token_ids": ids,
            "stream": True,
            **_USAGE,
            "sampling_params": {"max_tokens": 4, "n": 3, "ignore_eos": True},
        },
    ),
    (
        "completions prompt_logprobs=1 on a cached prompt",
        _CMPL,
        lambda ids: {"prompt": ids, "max_tokens": 2, "prompt_logprobs": 1},
    ),
)
"""``n > 1`` and prompt_logprobs accounting: each runs twice on a fresh 100-token prompt (then it is cached)."""

_COUNTERS = (vm.PROMPT_TOKENS, vm.PREFIX_CACHE_QUERIES, vm.PREFIX_CACHE_HITS, vm.PROMPT_TOKENS_CACHED)


@dataclass
class TrainerObservation:
    """One engine's answers to the trainer cases."""

    shapes: dict[str, dict[str, str]] = field(default_factory=dict)
    """Case -> JSON path -> types and list lengths."""
    statuses: dict[str, int] = field(default_factory=dict)
    accounting: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    """N case -> (usage fields and counter deltas of the first run, the same of the second)."""


def to_json(obs: TrainerObservation) -> dict[str, Any]:
    """An observation as JSON (a real vLLM's is kept in ``tests/data`` for the unit tier)."""
    return {"shapes": obs.shapes, "statuses": obs.statuses, "accounting": obs.accounting}


def from_json(data: Mapping[str, Any]) -> TrainerObservation:
    """The observation :func:`to_json` wrote."""
    accounting = {label: tuple(tuple(run) for run in runs) for label, runs in data["accounting"].items()}
    return TrainerObservation(shapes=dict(data["shapes"]), statuses=dict(data["statuses"]), accounting=accounting)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "list" if isinstance(value, list) else "object"


def shape_paths(value: Any, *, k: int = 0, free: tuple[str, ...] = ("bytes",)) -> dict[str, str]:
    """Every path of a JSON value -> ``|``-joined types found there, and ``<path>#len`` -> list lengths (pure)."""
    found: dict[str, set[str]] = {}

    def add(path: str, what: str) -> None:
        found.setdefault(path, set()).add(what)

    def walk(v: Any, path: str) -> None:
        add(path, _kind(v))
        if isinstance(v, dict):
            if path.endswith(_MAP_SUFFIXES):
                add(f"{path}#size", "k..k+1" if k <= len(v) <= k + 1 else str(len(v)))
                for item in v.values():
                    walk(item, f"{path}{{*}}")
                return
            for key, item in v.items():
                walk(item, f"{path}.{key}" if path else key)
        elif isinstance(v, list):
            if not path.endswith(free):
                add(f"{path}#len", str(len(v)))
            for item in v:
                walk(item, f"{path}[]")

    walk(value, "")
    return {path: "|".join(sorted(kinds)) for path, kinds in sorted(found.items())}


async def _answer(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(url, json=body) as resp:
        if not body.get("stream") or resp.status != 200:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except json.JSONDecodeError:
                return resp.status, text
        events: list[Any] = []
        buffer = b""
        async for chunk in resp.content.iter_any():
            buffer += chunk
            while b"\n\n" in buffer:
                raw, buffer = buffer.split(b"\n\n", 1)
                data = raw.decode().removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
        return resp.status, events


def _stream_summary(events: list[Any]) -> dict[str, Any]:
    """A stream as one value: its token events (all alike), the usage event and the end."""
    chunks = [e for e in events if isinstance(e, dict) and e.get("choices")]
    usage = [e for e in events if isinstance(e, dict) and not e.get("choices")]
    return {"events": len(events), "token_events": chunks, "usage_events": usage, "done": events[-1:] == ["[DONE]"]}


Counters = Callable[[tuple[str, ...]], Awaitable[dict[str, float]]]
"""Reads the named counters of the engine being probed."""


def _usage_fields(usage: Any) -> tuple[Any, ...]:
    if not isinstance(usage, Mapping):
        return (usage,)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else details
    return (usage.get("prompt_tokens"), usage.get("completion_tokens"), cached)


async def probe_trainer(
    http: aiohttp.ClientSession, base: str, *, model: str, counters: Counters
) -> TrainerObservation:
    """Send the trainer cases to one engine (fresh or not: prompts here are unique to these cases)."""
    obs = TrainerObservation()
    for case in SHAPE_CASES:
        body = case.body if "AReaL" in case.name else {"model": model, **case.body}
        status, answer = await _answer(http, f"{base}{case.path}", body)
        obs.statuses[case.name] = status
        value = _stream_summary(answer) if case.stream and isinstance(answer, list) else answer
        obs.shapes[case.name] = shape_paths(value, k=case.k, free=case.free)
    for n, (label, path, make) in enumerate(N_CASES):
        # 3 whole blocks of 32, unseen so far: no trace before starts with id 2047 (theirs are 3..2042)
        ids = [2047, n] + [3 + ((n + 1) * 997 + i * 7919) % 2040 for i in range(98)]
        runs = []
        for _ in range(2):
            before = await counters(_COUNTERS)
            status, answer = await _answer(http, f"{base}{path}", {"model": model, **make(ids)})
            after = await counters(_COUNTERS)
            if isinstance(answer, list):
                usage = next((e.get("usage") for e in answer if isinstance(e, dict) and e.get("usage")), None)
            else:
                usage = answer.get("usage") if isinstance(answer, dict) else answer
            deltas = tuple(round(after[name] - before[name]) for name in _COUNTERS)
            runs.append((status, *_usage_fields(usage), *deltas))
        obs.accounting[label] = tuple(runs)
    return obs


def compare_trainer(real: TrainerObservation, sim: TrainerObservation) -> list[tuple[str, str, str, str, bool]]:
    """Rows ``(section, item, vLLM, engine-sim, match)`` (pure)."""
    rows: list[tuple[str, str, str, str, bool]] = []
    for name in real.shapes:
        a, b = real.shapes[name], sim.shapes.get(name, {})
        only_a = sorted(f"{p}: {a[p]}" for p in a if b.get(p) != a[p])
        only_b = sorted(f"{p}: {b[p]}" for p in b if a.get(p) != b[p])
        status = f"{real.statuses.get(name)} / {sim.statuses.get(name)}"
        vllm = f"{len(a)} paths" + (f"; differs: {'; '.join(only_a)}" if only_a else "")
        own = f"{len(b)} paths" + (f"; differs: {'; '.join(only_b)}" if only_b else "")
        same_status = real.statuses.get(name) == sim.statuses.get(name)
        rows.append(
            ("trainer answers", f"{name} (status {status})", vllm, own, same_status and not only_a and not only_b)
        )
    heads = "status, prompt_tokens, completion_tokens, cached_tokens, " + ", ".join(
        f"Δ{name.removeprefix('vllm:')}" for name in _COUNTERS
    )
    for label, a_runs in real.accounting.items():
        b_runs = sim.accounting.get(label, ())
        rows.append(
            (
                "n > 1 accounting",
                f"{label}: fresh, then again ({heads})",
                " / ".join(str(r) for r in a_runs),
                " / ".join(str(r) for r in b_runs),
                a_runs == b_runs,
            )
        )
    return rows
