"""Wire format of vLLM 0.32's RL endpoints as the engine simulator speaks them (pure).

- ``POST /inference/v1/generate`` (vLLM's ``GenerateRequest``): ``token_ids`` (at least
  one) and ``sampling_params`` (an object: ``max_tokens``, ``seed``, ``n``, ``logprobs``,
  ``prompt_logprobs``) are required; ``model``, ``request_id``, ``stream``,
  ``stream_options``, ``cache_salt``, ``priority``, ``return_token_ids``, ``output_mode``
  (``tokens`` or ``text``), ``features`` and ``kv_transfer_params`` are optional, unknown
  fields are ignored. The answer's shape is vLLM 0.32's ``GenerateTokensResponse`` (or
  ``GenerateTextResponse``): ``choices[]`` with ``index``, ``finish_reason``, ``token_ids``,
  ``logprobs`` and ``weight_versions`` (spans of output tokens by the weight version that
  generated them), ``usage``, ``prompt_logprobs`` and, with ``return_token_ids``,
  ``prompt_token_ids``.
- ``POST /pause?mode=abort|wait|keep&clear_cache=true|false`` (default ``abort`` and
  ``true``).

Errors are vLLM's OpenAI error shape (:class:`~rolloutpool.engine.server.protocol.OpenAIError`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rolloutpool.engine.model.hashing import MASK
from rolloutpool.engine.model.logprobs import MAX_LOGPROBS
from rolloutpool.engine.model.tokenizer import VOCAB_SIZE
from rolloutpool.engine.server.protocol import DEFAULT_MAX_TOKENS, MAX_N, OpenAIError

__all__ = [
    "PAUSE_MODES",
    "GenerateParams",
    "Span",
    "generate_choice",
    "generate_chunk",
    "generate_response",
    "generate_usage_chunk",
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
    n: int = 1
    logprobs: int | None = None
    """``sampling_params.logprobs``: top entries per generated token; None: no logprobs."""
    prompt_logprobs: int | None = None
    return_token_ids: bool = False
    """Answer ``prompt_token_ids`` (vLLM sends them only when asked)."""


def _int(holder: Mapping[str, Any], name: str, *, minimum: int, param: str) -> int | None:
    value = holder.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OpenAIError(400, f"{param} must be an integer >= {minimum}, got {value!r}.", param=param)
    return value


def _count(sampling: Mapping[str, Any], name: str) -> int | None:
    """``sampling_params.logprobs`` or ``prompt_logprobs``: 0 to :data:`MAX_LOGPROBS` (-1, all, is over it)."""
    value = sampling.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpenAIError.invalid_body(f"sampling_params.{name}", "Input should be a valid integer.")
    if value < -1:
        raise OpenAIError(
            400, f"{name} must be non-negative or -1, got {value}. (parameter={name}, value={value})", param=name
        )
    count = VOCAB_SIZE if value == -1 else value
    if count > MAX_LOGPROBS:
        kind = "prompt logprobs" if name == "prompt_logprobs" else "sample logprobs"
        raise OpenAIError(
            400,
            f"Requested {kind} of {count}, which is greater than max allowed: {MAX_LOGPROBS} "
            f"(parameter={name}, value={count})",
            param=name,
        )
    return value


def _n(sampling: Mapping[str, Any]) -> int:
    n = sampling.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int):
        raise OpenAIError.invalid_body("sampling_params.n", "Input should be a valid integer.")
    if n < 1:
        raise OpenAIError(400, f"n must be at least 1, got {n}.")  # vLLM names no parameter here
    if n > MAX_N:
        raise OpenAIError(400, f"n must be at most {MAX_N}, got {n}.")
    return n


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
    n = _n(sampling)
    logprobs = _count(sampling, "logprobs")
    prompt_logprobs = _count(sampling, "prompt_logprobs")
    return_token_ids = body.get("return_token_ids")
    if return_token_ids is not None and not isinstance(return_token_ids, bool):
        raise OpenAIError(400, "return_token_ids must be a boolean.", param="return_token_ids")
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
        n=n,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        return_token_ids=bool(return_token_ids),
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
    """``weight_versions`` of a finished choice: one ``{version, start, end}`` per non-empty span (vLLM's strings)."""
    out = []
    for i, (version, start) in enumerate(spans):
        end = spans[i + 1][1] if i + 1 < len(spans) else total
        end = min(end, total)
        if end > start:
            out.append({"version": str(version), "start": start, "end": end})
    return out


def generate_choice(
    *,
    index: int,
    token_ids: list[int],
    finish_reason: str | None,
    logprobs: dict[str, Any] | None,
    weight_versions: list[dict[str, Any]] | None,
    text: str | None,
) -> dict[str, Any]:
    """One choice (whole, or a stream's delta) in vLLM's key order; ``text`` only in text mode."""
    choice: dict[str, Any] = {
        "index": index,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": token_ids,
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": weight_versions,
    }
    if text is not None:
        choice["text"] = text
    choice["logprobs"] = logprobs
    return choice


def generate_response(
    *,
    rid: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage: dict[str, Any],
    prompt_ids: list[int] | None,
    prompt_logprobs: list[Any] | None,
    text_mode: bool,
) -> dict[str, Any]:
    """The non-streamed answer of ``/inference/v1/generate`` (every field, as vLLM's ``model_dump``)."""
    return {
        "request_id": rid,
        "model": model,
        "created": created,
        "usage": usage,
        "prompt_logprobs": prompt_logprobs,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": prompt_ids,
        "mm_placeholders": None,
        "metrics": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "output_mode": "text" if text_mode else "tokens",
        "choices": choices,
    }


def generate_chunk(
    *, rid: str, choice: dict[str, Any], prompt_ids: list[int] | None, text_mode: bool
) -> dict[str, Any]:
    """One streamed event: one choice's new tokens (``prompt_token_ids`` on the first event, when asked)."""
    chunk: dict[str, Any] = {"request_id": rid, "usage": None}
    if prompt_ids is not None:
        chunk["prompt_token_ids"] = prompt_ids
    chunk["output_mode"] = "text" if text_mode else "tokens"
    chunk["choices"] = [choice]
    return chunk


def generate_usage_chunk(*, rid: str, usage: dict[str, Any], text_mode: bool) -> dict[str, Any]:
    """The closing ``"choices": []`` event with usage (vLLM drops its null fields)."""
    slim = {k: v for k, v in usage.items() if v is not None}
    details = slim.get("prompt_tokens_details")
    if isinstance(details, dict):
        slim["prompt_tokens_details"] = {k: v for k, v in details.items() if v is not None}
    return {"request_id": rid, "usage": slim, "output_mode": "text" if text_mode else "tokens", "choices": []}
