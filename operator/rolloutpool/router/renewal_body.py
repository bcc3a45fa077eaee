"""What a prefix renewal sends: the request body that renews a turn's context, and the turn's text (pure).

See :mod:`rolloutpool.router.renewal` for why and when renewals are sent. The body
keeps what shapes the prompt (model, chat template options, tools) and asks for one
greedy token, not streamed, without logprobs. ``/v1/completions``: a string prompt
renews prompt + generated text; token ids renew the prompt ids only (responses do not
carry the output's ids); a batch of prompts, ``n > 1``, ``echo``, ``suffix`` or
prompt embeddings are not renewed. ``/v1/chat/completions``: the messages followed by
the assistant's reply (appended to the last message when the client continued it
with ``continue_final_message``); a reply without text content (tool calls) or
``n > 1`` is not renewed.
"""

from __future__ import annotations

from typing import Any

from rolloutpool.router.types import JSONObject

__all__ = ["CHAT_PATH", "COMPLETIONS_PATH", "TextCollector", "renewal_body", "response_text"]

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"

_DROPPED = frozenset(
    {
        "stream_options",
        "logprobs",
        "top_logprobs",
        "prompt_logprobs",
        "echo",
        "best_of",
        "use_beam_search",
        "min_tokens",
        "max_tokens",
        "max_completion_tokens",
        "request_id",
        "response_format",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "return_tokens_as_token_ids",
        "return_token_ids",
    }
)
"""Request fields a renewal leaves out: sampling and output options that cost work or conflict with one token."""


def _single_prompt(prompt: Any) -> str | list[int] | None:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    return None


def renewal_body(path: str, body: JSONObject, *, text: str) -> JSONObject | None:
    """The request that renews a turn's context, or None when this turn's shape cannot be renewed (pure).

    ``body`` is the client's request, ``text`` the generated output of choice 0.
    """
    if body.get("n") not in (None, 1):
        return None
    out: JSONObject = {k: v for k, v in body.items() if k not in _DROPPED}
    out.update({"stream": False, "n": 1, "temperature": 0, "max_tokens": 1})
    if path == COMPLETIONS_PATH:
        prompt = _completion_prompt(body, text=text)
        if prompt is None:
            return None
        out["prompt"] = prompt
        return out
    messages = _chat_messages(body, text=text) if path == CHAT_PATH else None
    if messages is None:
        return None
    out["messages"] = messages
    if "max_completion_tokens" in body:
        out["max_completion_tokens"] = 1
    if out.get("tool_choice") not in (None, "auto", "none"):
        out["tool_choice"] = "none"  # a forced tool call would compile a grammar for one token
    return out


def _completion_prompt(body: JSONObject, *, text: str) -> str | list[int] | None:
    if body.get("echo") or body.get("suffix") or "prompt_embeds" in body:
        return None
    prompt = _single_prompt(body.get("prompt"))
    if isinstance(prompt, str):
        return prompt + text
    return prompt  # token ids: the prompt part only (the output's ids are not in the response)


def _chat_messages(body: JSONObject, *, text: str) -> list[Any] | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return None
    last = messages[-1]
    if body.get("continue_final_message") is True and last.get("role") == "assistant":
        content = last.get("content")
        return [*messages[:-1], {**last, "content": content + text}] if isinstance(content, str) else None
    return [*messages, {"role": "assistant", "content": text}]


def response_text(path: str, obj: Any) -> str | None:
    """Generated text of choice 0 of a non-streamed response, or None (no text, tool calls, n > 1) (pure)."""
    if not isinstance(obj, dict):
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if path == CHAT_PATH:
        message = choice.get("message")
        if not isinstance(message, dict) or message.get("tool_calls"):
            return None
        content = message.get("content")
    else:
        content = choice.get("text")
    return content if isinstance(content, str) else None


class TextCollector:
    """Accumulates choice 0's text from the chunks of a stream (completions ``text``, chat ``delta.content``)."""

    def __init__(self, path: str) -> None:
        self._chat = path == CHAT_PATH
        self._parts: list[str] = []
        self._renewable = True
        self.finished = False
        """Set by the relay when the stream ended normally (a broken stream is not a turn to renew)."""

    def feed(self, obj: Any) -> None:
        """One decoded SSE event."""
        choices = obj.get("choices") if isinstance(obj, dict) else None
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self._renewable = False  # n > 1: not renewed
                continue
            if self._chat:
                delta = choice.get("delta")
                if not isinstance(delta, dict):
                    continue
                if delta.get("tool_calls"):
                    self._renewable = False
                piece = delta.get("content")
            else:
                piece = choice.get("text")
            if isinstance(piece, str):
                self._parts.append(piece)

    def text(self) -> str | None:
        """The whole text, or None when the stream cannot be renewed."""
        return "".join(self._parts) if self._renewable else None
