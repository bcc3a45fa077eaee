"""Keys of a request's conversation prefix, for clients that send no session id (pure; docs/sessionless-clients.md).

A multi-turn rollout carries its identity in its prefix: each turn's messages or token ids extend
the previous turn's (DESIGN section 12). A request's :class:`PrefixKeys` is a hash chain over its
prompt, one 16-byte digest per boundary:

- chat (``messages``): one link per message, over its canonical form (role, text content, tool
  calls as name and arguments, ``name``, ``tool_call_id``); fields a client may add or drop when it
  sends an answer back (``refusal``, ``annotations``, reasoning) are not part of it;
- token ids (``/v1/completions`` with a list of ints, ``/inference/v1/generate``'s ``token_ids``):
  one link per full block of :data:`TOKEN_BLOCK` ids; the ids past the last full block are the
  ``tail``;
- text (``/v1/completions`` with a string): one link per :data:`TEXT_CHUNK` characters, the rest
  is the ``tail``.

``chain[i]`` names the prefix up to boundary ``i``, so two prompts share ``chain[i]`` exactly when
they share that prefix. :func:`extend` continues a chain with an answer (routing/answers.py).
A batch of prompts, prompt embeddings, ``/v1/responses`` and ``/v1/messages`` give no keys.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

__all__ = [
    "KEYED_PATHS",
    "TEXT_CHUNK",
    "TOKEN_BLOCK",
    "PrefixKeys",
    "canonical_message",
    "chat_keys",
    "extend",
    "prompt_group",
    "request_keys",
    "text_keys",
    "token_keys",
]

TOKEN_BLOCK = 16
"""Token ids per link of a token-id chain (vLLM's default KV block size)."""
TEXT_CHUNK = 64
"""Characters per link of a text chain."""

Kind = Literal["chat", "tokens", "text"]
_SEED: dict[str, bytes] = {"chat": b"rp-chat", "tokens": b"rp-tokens", "text": b"rp-text"}


@dataclass(frozen=True, slots=True)
class PrefixKeys:
    """A prompt's hash chain: ``chain[i]`` is the digest of its prefix up to boundary ``i``."""

    kind: Kind
    chain: tuple[bytes, ...]
    tail: tuple[int, ...] | str = ()
    """Token ids or text past the last full block (chat: always empty)."""

    @property
    def last(self) -> bytes | None:
        """The digest of the longest keyed prefix, or None when the prompt is shorter than one link."""
        return self.chain[-1] if self.chain else None


def _link(previous: bytes, payload: bytes) -> bytes:
    return hashlib.blake2b(previous + payload, digest_size=16).digest()


def _text_of(content: object) -> object:
    """A message's content as text where it is text (a list of text parts joined); other parts as they are."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[object] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(part)
        if all(isinstance(p, str) for p in parts):
            return "".join(str(p) for p in parts)
        return parts
    return content


def canonical_message(message: object) -> bytes:
    """The bytes of a chat message that say what the model reads (role, text, tool calls, name, call id)."""
    if not isinstance(message, Mapping):
        return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            calls.append([function.get("name"), function.get("arguments")])
        else:
            calls.append([call])
    canon = [
        message.get("role"),
        _text_of(message.get("content")),
        calls,
        message.get("name"),
        message.get("tool_call_id"),
    ]
    try:
        return orjson.dumps(canon, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON-serialisable content: its text form
        return repr(canon).encode()


def chat_keys(messages: Sequence[object], *, start: bytes | None = None) -> PrefixKeys:
    """One link per message; ``start`` continues an existing chain."""
    previous = _SEED["chat"] if start is None else start
    chain = []
    for message in messages:
        previous = _link(previous, canonical_message(message))
        chain.append(previous)
    return PrefixKeys("chat", tuple(chain))


def token_keys(ids: Sequence[int], *, start: bytes | None = None, block: int = TOKEN_BLOCK) -> PrefixKeys:
    """One link per full block of ``block`` ids; the rest is the tail."""
    previous = _SEED["tokens"] if start is None else start
    chain = []
    full = len(ids) - len(ids) % block
    packed = (ids if isinstance(ids, array) else array("q", ids))[:full].tobytes()  # 8 bytes an id, then slices
    step = 8 * block
    for i in range(0, len(packed), step):
        previous = _link(previous, packed[i : i + step])
        chain.append(previous)
    return PrefixKeys("tokens", tuple(chain), tuple(ids[full:]))


def text_keys(text: str, *, start: bytes | None = None, chunk: int = TEXT_CHUNK) -> PrefixKeys:
    """One link per ``chunk`` characters; the rest is the tail."""
    previous = _SEED["text"] if start is None else start
    chain = []
    full = len(text) - len(text) % chunk
    for i in range(0, full, chunk):
        previous = _link(previous, text[i : i + chunk].encode())
        chain.append(previous)
    return PrefixKeys("text", tuple(chain), text[full:])


def _int_array(value: object) -> array[int] | None:
    """``value`` as an array of 64-bit ids when it is a non-empty list of ints (one C pass), else None."""
    if not isinstance(value, list) or not value or type(value[0]) is not int:
        return None
    try:
        return array("q", value)
    except (TypeError, OverflowError):  # not all ints (a float, a list: a batch), or past 64 bits
        return None


def _prompt_keys(prompt: object) -> PrefixKeys | None:
    ids = _int_array(prompt)
    if ids is None and isinstance(prompt, list) and len(prompt) == 1:  # a batch of one
        prompt = prompt[0]
        ids = _int_array(prompt)
    if ids is not None:
        return token_keys(ids)
    return text_keys(prompt) if isinstance(prompt, str) else None


_TOKEN_ID_PATHS = frozenset({"/inference/v1/generate", "/skyrl/v1/generate"})
KEYED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"}) | _TOKEN_ID_PATHS
"""The generation paths whose body can give prefix keys (:func:`request_keys`)."""


def request_keys(path: str, body: Mapping[str, Any]) -> PrefixKeys | None:
    """The prefix keys of a generation request, or None when its shape gives none (a batch, embeddings, ...)."""
    if path == "/v1/chat/completions":
        messages = body.get("messages")
        return chat_keys(messages) if isinstance(messages, list) and messages else None
    if path == "/v1/completions":
        return _prompt_keys(body.get("prompt"))
    if path in _TOKEN_ID_PATHS:
        ids = _int_array(body.get("token_ids"))
        return None if ids is None else token_keys(ids)
    return None


_RENDERING = ("model", "cache_salt", "tools", "chat_template", "chat_template_kwargs", "add_generation_prompt",
              "continue_final_message", "add_special_tokens")  # fmt: skip
"""Fields besides the prompt that change the tokens a request opens with, or whether its KV is shared at all."""


def prompt_group(path: str, body: Mapping[str, Any]) -> str | None:
    """A name for every session that opens with this request's prompt, or None when its shape gives no keys.

    The rollouts of a GRPO group open with one prompt, and a replica keeps its KV once for all of them: the router
    counts it once when it knows they share it (routing/workingset.py). The name covers the prompt (its chain and
    tail) and what else decides its tokens or their sharing: the ``model`` (an adapter shares no KV with the base),
    the ``cache_salt`` (a salt shares none), and the chat template's inputs (``tools`` render at the prompt's start).
    """
    keys = request_keys(path, body)
    if keys is None or (not keys.chain and not keys.tail):
        return None
    digest = hashlib.blake2b(keys.last or _SEED[keys.kind], digest_size=12)
    rendering = [keys.tail, *(body.get(name) for name in _RENDERING)]
    digest.update(orjson.dumps(rendering, default=str, option=orjson.OPT_SORT_KEYS))
    return f"prompt-{digest.hexdigest()}"


def extend(keys: PrefixKeys, appended: object) -> tuple[bytes, ...]:
    """The chain of ``keys``'s prompt followed by ``appended`` (a message, token ids or text): its new links.

    The whole chain of prompt + appended is ``keys.chain + extend(keys, appended)``; an empty
    result means the appended part completed no link.
    """
    start = keys.last
    if keys.kind == "chat":
        return chat_keys([appended], start=start).chain
    if keys.kind == "tokens" and isinstance(keys.tail, tuple) and isinstance(appended, list | tuple):
        try:
            return token_keys([*keys.tail, *appended], start=start).chain
        except (TypeError, OverflowError):  # not 64-bit ids
            return ()
    if keys.kind == "text" and isinstance(keys.tail, str) and isinstance(appended, str):
        return text_keys(keys.tail + appended, start=start).chain
    return ()
