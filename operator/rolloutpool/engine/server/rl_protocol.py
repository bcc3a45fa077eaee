"""Wire format of vLLM 0.32's RL endpoints as the engine simulator speaks them (pure).

- ``POST /inference/v1/generate`` (vLLM's ``GenerateRequest``): ``token_ids`` (at least
  one) and ``sampling_params`` (an object: ``max_tokens``, ``seed``, ``n`` = 1) are
  required; ``model``, ``request_id``, ``stream``, ``stream_options``, ``cache_salt``,
  ``priority``, ``return_token_ids``, ``output_mode`` (``tokens`` or ``text``),
  ``features`` and ``kv_transfer_params`` are optional, unknown fields are ignored.
  The answer carries ``request_id``, ``model``, ``created``, ``usage``,
  ``prompt_token_ids`` and ``choices[]`` with ``index``, ``finish_reason``,
  ``token_ids``, ``logprobs`` and ``weight_versions`` (spans of output tokens by the
  weight version that generated them).
- ``POST /pause?mode=abort|wait|keep&clear_cache=true|false`` (default ``abort`` and
  ``true``).

Errors are vLLM's OpenAI error shape (:class:`~rolloutpool.engine.server.protocol.OpenAIError`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rolloutpool.engine.model.hashing import MASK
from rolloutpool.engine.model.tokenizer import VOCAB_SIZE
from rolloutpool.engine.server.protocol import DEFAULT_MAX_TOKENS, OpenAIError

__all__ = [
    "PAUSE_MODES",
    "GenerateParams",
    "Span",
    "generate_chunk",
    "generate_response",
    "parse_bool",
    "parse_generate",
    "parse_pause",
    "salt_hash",
    "weight_version_spans",
]

PAUSE_MODES = ("abort", "wait", "keep")
"""``abort`` ends requests in flight (``finish_reason: abort``); ``wait`` lets them finish; ``keep`` freezes them."""

Span = tuple[int | str, int]
"""(weight version, index of the first output token it generated)."""


@dataclass(frozen=True)
class GenerateParams:
    """The fields of a generate request the simulator acts on."""

    token_ids: list[int]
    max_tokens: int
    model: str | None
    request_id: str | None
    stream: bool
    include_usage: bool
    cache_salt: str | None
    seed: int | None
    text_output: bool


def _int(holder: Mapping[str, Any], name: str, *, minimum: int, param: str) -> int | None:
    value = holder.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OpenAIError(400, f"{param} must be an integer >= {minimum}, got {value!r}.", param=param)
    return value


def parse_generate(body: Mapping[str, Any]) -> GenerateParams:
    """The parameters of ``POST /inference/v1/generate``, or a 400 naming the field."""
    ids = body.get("token_ids")
    if not isinstance(ids, list) or not ids:
        raise OpenAIError(400, "token_ids is required: a non-empty list of token ids.", param="token_ids")
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < VOCAB_SIZE:
            raise OpenAIError(400, f"Token id {token!r} is out of vocabulary (size {VOCAB_SIZE}).", param="token_ids")
    sampling = body.get("sampling_params")
    if not isinstance(sampling, dict):
        raise OpenAIError(400, "sampling_params is required: an object.", param="sampling_params")
    max_tokens = _int(sampling, "max_tokens", minimum=1, param="sampling_params.max_tokens")
    n = _int(sampling, "n", minimum=1, param="sampling_params.n")
    if n is not None and n != 1:
        raise OpenAIError(400, "The engine simulator supports n=1 only.", param="sampling_params.n")
    seed = sampling.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise OpenAIError(400, "sampling_params.seed must be an integer.", param="sampling_params.seed")
    for name in ("model", "request_id", "cache_salt"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise OpenAIError(400, f"{name} must be a string.", param=name)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise OpenAIError(400, "stream must be a boolean.", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise OpenAIError(400, "stream_options must be an object.", param="stream_options")
    mode = body.get("output_mode") or "tokens"
    if mode not in {"tokens", "text"}:
        raise OpenAIError(400, f"output_mode must be 'tokens' or 'text', got {mode!r}.", param="output_mode")
    return GenerateParams(
        token_ids=list(ids),
        max_tokens=max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS,
        model=body.get("model"),
        request_id=body.get("request_id"),
        stream=stream,
        include_usage=bool(options and options.get("include_usage") is True),
        cache_salt=body.get("cache_salt") or None,
        seed=seed,
        text_output=mode == "text",
    )


def salt_hash(cache_salt: str | None) -> int:
    """The chain seed of a ``cache_salt``: requests with different salts share no cached block (0 unsalted)."""
    if cache_salt is None:
        return 0
    return hash(("cache_salt", cache_salt)) & MASK or 1


def parse_bool(value: str | None, *, name: str, default: bool) -> bool:
    """A query flag (``true``/``false``/``1``/``0``), or a 400 naming it."""
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes"}:
        return True
    if lowered in {"0", "false", "no"}:
        return False
    raise OpenAIError(400, f"{name} must be true or false, got {value!r}.", param=name)


def parse_pause(query: Mapping[str, str]) -> tuple[str, bool]:
    """``mode`` and ``clear_cache`` of ``POST /pause`` (defaults: abort, clear)."""
    mode = query.get("mode") or "abort"
    if mode not in PAUSE_MODES:
        raise OpenAIError(400, f"mode must be one of {', '.join(PAUSE_MODES)}; got {mode!r}.", param="mode")
    return mode, parse_bool(query.get("clear_cache"), name="clear_cache", default=True)


def weight_version_spans(spans: Sequence[Span], total: int) -> list[dict[str, Any]]:
    """``weight_versions`` of a choice: one ``{weight_version, start, end}`` per non-empty span."""
    out = []
    for i, (version, start) in enumerate(spans):
        end = spans[i + 1][1] if i + 1 < len(spans) else total
        end = min(end, total)
        if end > start:
            out.append({"weight_version": version, "start": start, "end": end})
    return out


def generate_response(
    *,
    rid: str,
    created: int,
    model: str,
    prompt_ids: list[int],
    output_ids: list[int],
    finish_reason: str,
    usage: dict[str, Any],
    spans: Sequence[Span],
    text: str | None,
) -> dict[str, Any]:
    """The non-streamed answer of ``/inference/v1/generate``."""
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": finish_reason,
        "token_ids": output_ids,
        "logprobs": None,
        "weight_versions": weight_version_spans(spans, len(output_ids)),
    }
    if text is not None:
        choice["text"] = text
    return {
        "request_id": rid,
        "model": model,
        "created": created,
        "usage": usage,
        "prompt_token_ids": prompt_ids,
        "choices": [choice],
    }


def generate_chunk(
    *, rid: str, created: int, model: str, token_ids: list[int], finish_reason: str | None, text: str | None
) -> dict[str, Any]:
    """One streamed event of ``/inference/v1/generate``: the new output tokens."""
    choice: dict[str, Any] = {"index": 0, "token_ids": token_ids, "finish_reason": finish_reason, "logprobs": None}
    if text is not None:
        choice["text"] = text
    return {"request_id": rid, "model": model, "created": created, "choices": [choice]}
