"""OpenAI wire format of the engine simulator: request validation and error shapes (pure).

Requests are validated leniently the way vLLM does it: unknown fields (``temperature``,
...) are ignored, malformed known fields are a 400 ``BadRequestError``. The session a
request's KV events name is found where vLLM 0.32 looks (:func:`session_id_of`). Errors
copy vLLM's ``type``/``param`` values; the answer shapes live in
:mod:`rolloutpool.engine.server.shapes`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rolloutpool.engine.model.logprobs import MAX_LOGPROBS
from rolloutpool.engine.model.tokenizer import VOCAB_SIZE, ChatMessage, render_chat, tokenize

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_BATCH",
    "MAX_N",
    "SESSION_ID_HEADER",
    "GenerationParams",
    "OpenAIError",
    "parse_chat",
    "parse_completion",
    "parse_json_object",
    "session_id_of",
]

MAX_N = 64
"""Largest ``n`` the simulator takes (each choice is one engine request)."""
MAX_BATCH = 256
"""Most prompts in one completions request."""

SESSION_ID_HEADER = "X-Session-ID"
"""The header vLLM 0.32 reads a request's session from (``GenerateBaseServing.SESSION_ID_HEADER``)."""

DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` when the body has none (OpenAI's completions default; also used for chat)."""

_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}
_VALIDATION_TYPE = "Bad Request"
"""vLLM 0.32's ``type`` for a body that fails its request model (a type error), as FastAPI names the status."""


class OpenAIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, err_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type
        """vLLM's ``type`` when it is not the status's default (``Bad Request`` for body validation)."""

    @classmethod
    def invalid_body(cls, field: str, message: str) -> OpenAIError:
        """A field of the wrong type: vLLM's request validation answers ``Bad Request`` with ``body.<field>``."""
        return cls(400, f"1 validation error: {message}", param=f"body.{field}", err_type=_VALIDATION_TYPE)

    def body(self) -> dict[str, Any]:
        """The JSON body vLLM sends."""
        return {
            "error": {
                "message": self.message,
                "type": self.err_type or _ERROR_TYPES.get(self.status, "InternalServerError"),
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
    logprobs: int | None = None
    """Top entries per generated token (completions' ``logprobs``, chat's ``top_logprobs``); None: no logprobs."""
    prompt_logprobs: int | None = None
    """Top entries per prompt token (``prompt_logprobs``); None: none."""
    token_ids_as_strings: bool = False
    """``return_tokens_as_token_ids``: logprob tokens are ``token_id:<id>``."""


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OpenAIError(400, f"JSON decode error: {exc}", param="body.0", err_type=_VALIDATION_TYPE) from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "The request body must be a JSON object.", param="body", err_type=_VALIDATION_TYPE)
    return body


def _int_field(body: dict[str, Any], name: str, *, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpenAIError.invalid_body(name, f"{name} should be a valid integer, got {value!r}.")
    if value < minimum:
        # vLLM names the parameter for max_tokens but not for n
        raise OpenAIError(
            400,
            f"{name} must be at least {minimum}, got {value}."
            + (f" (parameter={name}, value={value})" if name != "n" else ""),
            param=None if name == "n" else name,
        )
    return value


def _top_count(body: dict[str, Any], name: str) -> int | None:
    """A logprob count: an integer from 0 to :data:`MAX_LOGPROBS` (vLLM rejects -1, the whole vocabulary, over it).

    A boolean reads as 0 or 1, as vLLM's request model parses it.
    """
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, int):
        raise OpenAIError(400, f"`{name}` must be an integer. (parameter={name}, value={value})", param=name)
    if value < 0 and value != -1:
        raise OpenAIError(
            400, f"`{name}` must be a positive value or -1. (parameter={name}, value={value})", param=name
        )
    count = VOCAB_SIZE if value == -1 else value
    if count > MAX_LOGPROBS:
        kind = "prompt logprobs" if name == "prompt_logprobs" else "sample logprobs"
        raise OpenAIError(
            400,
            f"Requested {kind} of {count}, which is greater than max allowed: {MAX_LOGPROBS} "
            f"(parameter={'prompt_logprobs' if name == 'prompt_logprobs' else 'logprobs'}, value={count})",
            param="prompt_logprobs" if name == "prompt_logprobs" else "logprobs",
        )
    return value


def _logprob_params(body: dict[str, Any], *, chat: bool, stream: bool) -> tuple[int | None, int | None, bool]:
    """``(logprobs, prompt_logprobs, token_ids_as_strings)`` of a completions or chat body."""
    prompt = _top_count(body, "prompt_logprobs")
    if prompt is not None and stream and prompt != 0:
        raise OpenAIError(
            400,
            "`prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)",
            param="prompt_logprobs",
        )
    if chat:
        wanted = body.get("logprobs")
        if wanted is not None and wanted not in (True, False):  # 0 and 1 read as booleans
            raise OpenAIError.invalid_body("logprobs", "Input should be a valid boolean, unable to interpret input")
        top = _top_count(body, "top_logprobs")
        if top is not None and top != 0 and not wanted:
            raise OpenAIError(
                400,
                "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
                param="top_logprobs",
            )
        sample = (top or 0) if wanted else None
    else:
        sample = _top_count(body, "logprobs")
    as_ids = body.get("return_tokens_as_token_ids")
    if as_ids is not None and not isinstance(as_ids, bool):
        raise OpenAIError.invalid_body("return_tokens_as_token_ids", "return_tokens_as_token_ids should be a boolean.")
    return sample, prompt, bool(as_ids)


def _params(body: dict[str, Any], *, max_tokens_names: tuple[str, ...], chat: bool = False) -> GenerationParams:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise OpenAIError.invalid_body("model", "model should be a valid string.")
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
        raise OpenAIError.invalid_body("return_token_ids", "return_token_ids should be a valid boolean.")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise OpenAIError.invalid_body("stream", "stream should be a valid boolean.")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise OpenAIError.invalid_body("stream_options", "stream_options should be a valid object.")
        include_usage = options.get("include_usage") is True
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise OpenAIError.invalid_body("seed", "seed should be a valid integer.")
    logprobs, prompt_logprobs, as_ids = _logprob_params(body, chat=chat, stream=stream)
    return GenerationParams(
        model=model,
        max_tokens=max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS,
        stream=stream,
        include_usage=include_usage,
        seed=seed,
        n=n,
        return_token_ids=bool(return_token_ids),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        token_ids_as_strings=as_ids,
    )


def _token_ids(value: list[Any]) -> list[int]:
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < VOCAB_SIZE:
            raise OpenAIError(400, f"Token id {token!r} is out of vocabulary")
    return list(value)


def _one_prompt(prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        ids = tokenize(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        ids = _token_ids(prompt)
    else:
        raise OpenAIError.invalid_body("prompt", "prompt should be a string, a list of token ids, or a list of either.")
    if not ids:
        raise OpenAIError(400, "You must pass at least one prompt")
    return ids


def parse_completion(body: dict[str, Any]) -> tuple[list[list[int]], GenerationParams]:
    """Prompts (a batch: one or more, as vLLM accepts them) and parameters of ``POST /v1/completions``."""
    prompt = body.get("prompt")
    if prompt is None or prompt == "":
        raise OpenAIError(
            400, "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)", param="prompt"
        )
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
    if not isinstance(messages, list):
        raise OpenAIError.invalid_body("messages", "messages should be a valid list.")
    if not messages:
        raise OpenAIError(400, "Cannot apply chat template to an empty conversation. Provide at least one message.")
    rendered: list[ChatMessage] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAIError.invalid_body("messages", "each message should be an object with a string role.")
        rendered.append({"role": message["role"], "content": _content(message.get("content"))})
    ids = tokenize(render_chat(rendered))
    return ids, _params(body, max_tokens_names=("max_completion_tokens", "max_tokens"), chat=True)


def session_id_of(body: dict[str, Any], header: str | None, *, openai: bool) -> str | None:
    """The session vLLM 0.32 stamps on a request's KV events, or None.

    Completions and chat (``openai``): the body's ``session_id``, then the ``X-Session-ID``
    header, then ``vllm_xargs.session_id``; the first non-empty string wins. vLLM's
    ``/inference/v1/generate`` reads the header only.
    """
    if openai:
        value = body.get("session_id")
        if value is not None and not isinstance(value, str):
            raise OpenAIError.invalid_body("session_id", "session_id should be a valid string.")
        if value:
            return value
    if header:
        return header
    if openai:
        xargs = body.get("vllm_xargs")
        value = xargs.get("session_id") if isinstance(xargs, dict) else None
        if isinstance(value, str) and value:
            return value
    return None
