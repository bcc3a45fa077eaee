"""Answer shapes of the engine simulator: vLLM 0.32's response, chunk and usage objects (pure).

Key sets copy what a real vLLM 0.32 answers (``docs/conformance.md`` compares them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "SYSTEM_FINGERPRINT",
    "Choice",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "usage",
    "usage_chunk",
]

SYSTEM_FINGERPRINT = "vllm-0.32.0-engine-sim"
"""``system_fingerprint`` of every answer (vLLM: ``vllm-<version>-<hash>``)."""


def usage(
    *,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None,
    stream: bool = False,
    created_cache_tokens: int | None = None,
) -> dict[str, Any]:
    """vLLM's usage object; ``prompt_tokens_details`` is null when ``cached_tokens`` is None (details off).

    A stream's closing usage carries fewer fields than a whole answer's (no null ones), as vLLM's does;
    chat answers ``created_cache_tokens`` 0 where completions answer null.
    """
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }
    if cached_tokens is not None:
        details: dict[str, Any] = {"cached_tokens": cached_tokens}
        if not stream:
            details.update(created_cache_tokens=created_cache_tokens, multimodal_tokens=None)
        elif created_cache_tokens is not None:
            details["created_cache_tokens"] = created_cache_tokens
        out["prompt_tokens_details"] = details
    if not stream:
        out["completion_tokens_details"] = None
    return out


@dataclass(frozen=True)
class Choice:
    """One finished choice of a non-streaming answer."""

    index: int
    text: str
    finish_reason: str
    token_ids: list[int] | None = None
    """Generated ids, when the request set ``return_token_ids``."""
    prompt_token_ids: list[int] | None = None
    """Its prompt's ids, when the request set ``return_token_ids`` (completions put them on the choice)."""
    logprobs: dict[str, Any] | None = None
    """The choice's ``logprobs`` object (:mod:`rolloutpool.engine.server.logprob_shapes`), when asked for."""
    prompt_logprobs: list[Any] | None = None
    """Its prompt's ``prompt_logprobs`` (completions put them on the choice, chat on the answer)."""


def completion_response(
    *, rid: str, created: int, model: str, choices: list[Choice], usage: dict[str, Any]
) -> dict[str, Any]:
    """A non-streaming ``text_completion``."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "text": c.text,
                "logprobs": c.logprobs,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "prompt_logprobs": c.prompt_logprobs,
                "prompt_token_ids": c.prompt_token_ids,
                "token_ids": c.token_ids,
                "routed_experts": None,
            }
            for c in choices
        ],
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def chat_response(
    *,
    rid: str,
    created: int,
    model: str,
    choices: list[Choice],
    usage: dict[str, Any],
    prompt_token_ids: list[int] | None = None,
    prompt_logprobs: list[Any] | None = None,
) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` (``prompt_token_ids`` and ``prompt_logprobs`` sit on the response)."""
    out = []
    for c in choices:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": c.text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        out.append(
            {
                "index": c.index,
                "message": message,
                "logprobs": c.logprobs,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "token_ids": c.token_ids,
                "routed_experts": None,
            }
        )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": out,
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage,
        "prompt_logprobs": prompt_logprobs,
        "prompt_token_ids": prompt_token_ids,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion_chunk(
    *,
    rid: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    index: int = 0,
    token_ids: list[int] | None = None,
    prompt_token_ids: list[int] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed ``text_completion`` chunk (one generated token, or the finish)."""
    choice = {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_token_ids": prompt_token_ids,
        "token_ids": token_ids,
    }
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def chat_chunk(
    *,
    rid: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None,
    index: int = 0,
    token_ids: list[int] | None = None,
    prompt_token_ids: list[int] | None = None,
    opening: bool = False,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed ``chat.completion.chunk``: the opening role event, a token, or the finish (vLLM's keys)."""
    choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = None
    if not opening:
        choice["token_ids"] = token_ids
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if opening:
        chunk["prompt_token_ids"] = prompt_token_ids
        chunk["prompt_text"] = None
    return chunk


def usage_chunk(*, rid: str, obj: str, created: int, model: str, usage: dict[str, Any]) -> dict[str, Any]:
    """The last chunk of a stream with ``include_usage``: no choices, only usage."""
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
