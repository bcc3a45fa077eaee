"""The keys of a conversation after its answer: prompt + the answer the engine gave (pure).

A sessionless client's next turn sends the previous prompt, the answer it got (an assistant
message, or the output token ids, or the text) and what came back from its tools. So the key the
next turn must match is the previous request's chain extended by its answer
(:func:`rolloutpool.routing.prefixkey.extend`); these are the *tips* of the conversation
(one per choice when ``n > 1``). Where the answer is not in the response (a token-id prompt
without ``return_token_ids`` or ``return_tokens_as_token_ids``, a streamed tool call), no tip is
known and :mod:`rolloutpool.routing.implicit` falls back on the prompt's own key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rolloutpool.routing.prefixkey import PrefixKeys, extend

__all__ = ["answer_tips", "output_ids", "streamed_tips"]

_TOKEN_ID = "token_id:"  # noqa: S105 -- a token marker, not a secret


def _marked_ids(tokens: object) -> list[int] | None:
    """``["token_id:12", ...]`` as ids (``return_tokens_as_token_ids``); None when any is not so marked."""
    if not isinstance(tokens, list) or not tokens:
        return None
    out = []
    for token in tokens:
        if not isinstance(token, str) or not token.startswith(_TOKEN_ID) or not token[len(_TOKEN_ID) :].isdigit():
            return None
        out.append(int(token[len(_TOKEN_ID) :]))
    return out


def output_ids(choice: Mapping[str, Any]) -> list[int] | None:
    """A choice's output token ids: ``token_ids`` (``return_token_ids``), else its logprobs' ``token_id:N`` tokens."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(type(i) is int for i in ids):
        return ids
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, Mapping):
        return None
    content = logprobs.get("content")  # chat-shaped logprobs
    if isinstance(content, list):
        return _marked_ids([e.get("token") if isinstance(e, Mapping) else None for e in content])
    return _marked_ids(logprobs.get("tokens"))


def _appended(keys: PrefixKeys, choice: Mapping[str, Any]) -> object | None:
    if keys.kind == "chat":
        message = choice.get("message")
        if not isinstance(message, Mapping):
            return None
        return {"role": message.get("role") or "assistant", **{k: v for k, v in message.items() if k != "role"}}
    if keys.kind == "tokens":
        return output_ids(choice)
    text = choice.get("text")
    return text if isinstance(text, str) else None


def answer_tips(keys: PrefixKeys, response: object) -> tuple[bytes, ...]:
    """The tip of each choice of a (non-streamed) response: the digest of prompt + that choice's answer."""
    choices = response.get("choices") if isinstance(response, Mapping) else None
    if not isinstance(choices, list):
        return ()
    tips = []
    for choice in choices:
        if not isinstance(choice, Mapping):
            continue
        appended = _appended(keys, choice)
        if appended is None:
            continue
        chain = keys.chain + extend(keys, appended)
        if chain:
            tips.append(chain[-1])
    return tuple(tips)


def streamed_tips(keys: PrefixKeys, text: str | None) -> tuple[bytes, ...]:
    """The tip of a stream's single answer from its collected text (chat: an assistant message with that text).

    ``text`` is None where the stream cannot give it (``n > 1``, tool calls): no tip. A token-id
    prompt's stream gives no ids here: no tip.
    """
    if text is None or keys.kind == "tokens":
        return ()
    appended: object = {"role": "assistant", "content": text} if keys.kind == "chat" else text
    chain = keys.chain + extend(keys, appended)
    return (chain[-1],) if chain else ()
