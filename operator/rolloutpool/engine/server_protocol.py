"""OpenAI wire format of the engine simulator: request validation and response shapes (pure).

Requests are validated leniently the way vLLM does it: unknown fields (``session_id``,
``temperature``, ...) are ignored, malformed known fields are a 400
``BadRequestError``. Responses, stream chunks and errors copy vLLM's field names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rolloutpool.engine.tokenizer import VOCAB_SIZE, ChatMessage, render_chat, tokenize

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_BATCH",
    "MAX_N",
    "Choice",
    "GenerationParams",
    "OpenAIError",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "parse_chat",
    "parse_completion",
    "parse_json_object",
    "usage",
    "usage_chunk",
]

MAX_N = 64
"""Largest ``n`` the simulator takes (each choice is one engine request)."""
MAX_BATCH = 256
"""Most prompts in one completions request."""

DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` when the body has none (OpenAI's completions default; also used for chat)."""

_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


class OpenAIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        """The JSON body vLLM sends."""
        return {
            "error": {
                "message": self.message,
                "type": _ERROR_TYPES.get(self.status, "InternalServerError"),
                "param": self.param,
                "code": self.status,
            }
        }


@dataclass(frozen=True)
class GenerationParams:
    """The fields of a request body the simulator acts on."""

    model: str | None
    max_tokens: int
    stream: bool
    include_usage: bool
    seed: int | None
    n: int = 1
    """Choices per prompt (vLLM's ``n``)."""
    return_token_ids: bool = False
    """vLLM's ``return_token_ids``: add ``token_ids`` (and ``prompt_token_ids``) to the answer."""


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OpenAIError(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "The request body must be a JSON object.")
    return body


def _int_field(body: dict[str, Any], name: str, *, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpenAIError(400, f"{name} must be an integer, got {value!r}.", param=name)
    if value < minimum:
        raise OpenAIError(400, f"{name} must be at least {minimum}, got {value}.", param=name)
    return value


def _params(body: dict[str, Any], *, max_tokens_names: tuple[str, ...]) -> GenerationParams:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise OpenAIError(400, "model must be a string.", param="model")
    max_tokens = None
    for name in max_tokens_names:
        max_tokens = _int_field(body, name, minimum=1)
        if max_tokens is not None:
            break
    n = _int_field(body, "n", minimum=1) or 1
    if n > MAX_N:
        raise OpenAIError(400, f"n must be at most {MAX_N}, got {n}.", param="n")
    return_token_ids = body.get("return_token_ids")
    if return_token_ids is not None and not isinstance(return_token_ids, bool):
        raise OpenAIError(400, "return_token_ids must be a boolean.", param="return_token_ids")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise OpenAIError(400, "stream must be a boolean.", param="stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise OpenAIError(400, "stream_options must be an object.", param="stream_options")
        include_usage = options.get("include_usage") is True
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise OpenAIError(400, "seed must be an integer.", param="seed")
    return GenerationParams(
        model=model,
        max_tokens=max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS,
        stream=stream,
        include_usage=include_usage,
        seed=seed,
        n=n,
        return_token_ids=bool(return_token_ids),
    )


def _token_ids(value: list[Any]) -> list[int]:
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < VOCAB_SIZE:
            raise OpenAIError(400, f"Token id {token!r} is out of vocabulary (size {VOCAB_SIZE}).", param="prompt")
    return list(value)


def _one_prompt(prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        ids = tokenize(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        ids = _token_ids(prompt)
    else:
        raise OpenAIError(400, "prompt must be a string, a list of token ids, or a list of either.", param="prompt")
    if not ids:
        raise OpenAIError(400, "The prompt cannot be empty.", param="prompt")
    return ids


def parse_completion(body: dict[str, Any]) -> tuple[list[list[int]], GenerationParams]:
    """Prompts (a batch: one or more, as vLLM accepts them) and parameters of ``POST /v1/completions``."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > MAX_BATCH:
            raise OpenAIError(400, f"At most {MAX_BATCH} prompts per request, got {len(prompt)}.", param="prompt")
        prompts = [_one_prompt(p) for p in prompt]
    else:
        prompts = [_one_prompt(prompt)]
    return prompts, _params(body, max_tokens_names=("max_tokens",))


def _content(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise OpenAIError(400, "Only text content parts are supported.", param="messages")
            parts.append(part["text"])
        return "\n".join(parts)
    raise OpenAIError(400, "Message content must be a string or a list of text parts.", param="messages")


def parse_chat(body: dict[str, Any]) -> tuple[list[int], GenerationParams]:
    """Prompt ids (messages through the chat template) and parameters of ``POST /v1/chat/completions``."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, "messages must be a non-empty list.", param="messages")
    rendered: list[ChatMessage] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAIError(400, "Each message must be an object with a string role.", param="messages")
        rendered.append({"role": message["role"], "content": _content(message.get("content"))})
    ids = tokenize(render_chat(rendered))
    return ids, _params(body, max_tokens_names=("max_completion_tokens", "max_tokens"))


def usage(*, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    """vLLM's usage object; ``prompt_tokens_details`` is null when ``cached_tokens`` is None (details off)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None if cached_tokens is None else {"cached_tokens": cached_tokens},
    }


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
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
                "prompt_token_ids": c.prompt_token_ids,
                "token_ids": c.token_ids,
            }
            for c in choices
        ],
        "usage": usage,
        "kv_transfer_params": None,
    }


def chat_response(
    *,
    rid: str,
    created: int,
    model: str,
    choices: list[Choice],
    usage: dict[str, Any],
    prompt_token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` (``prompt_token_ids`` sits on the response, not the choice)."""
    out = []
    for c in choices:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": c.text,
            "refusal": None,
            "tool_calls": [],
            "reasoning_content": None,
        }
        out.append(
            {
                "index": c.index,
                "message": message,
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "token_ids": c.token_ids,
            }
        )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": out,
        "usage": usage,
        "prompt_logprobs": None,
        "prompt_token_ids": prompt_token_ids,
        "kv_transfer_params": None,
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
) -> dict[str, Any]:
    """One streamed ``text_completion`` chunk (one generated token, or the finish)."""
    choice = {
        "index": index,
        "text": text,
        "logprobs": None,
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
) -> dict[str, Any]:
    """One streamed ``chat.completion.chunk``."""
    choice: dict[str, Any] = {
        "index": index,
        "delta": delta,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if prompt_token_ids is not None:
        chunk["prompt_token_ids"] = prompt_token_ids
    return chunk


def usage_chunk(*, rid: str, obj: str, created: int, model: str, usage: dict[str, Any]) -> dict[str, Any]:
    """The last chunk of a stream with ``include_usage``: no choices, only usage."""
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage}
