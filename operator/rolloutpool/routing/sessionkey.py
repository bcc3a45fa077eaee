"""The session key of a request, as the RL frameworks send it (pure; DESIGN sections 3 and 10).

Precedence: the configured header (``X-Session-ID`` by default), matched
case-insensitively; then the body fields in the configured order, by default
``session_params.session_id``, ``session_id``, ``user`` (vllm-router's body order,
without its ``user_id`` legacy field and without its hash-of-the-body fallback: a
request without a key here is a one-turn session).

Types: a string is the key (surrounding blanks stripped); an empty string or
``null`` counts as absent (the next field is tried). An integer is coerced to its
decimal text, as vllm-router does (it reads an unquoted JSON value as text), so
``{"session_id": 7}`` and ``{"session_id": "7"}`` are one session. Any other type
(a boolean, a float, an object, a list), a non-object on the way to a nested field
(``"session_params": "x"``) or a key longer than :data:`MAX_KEY_CHARS` is a
:class:`SessionKeyError`, which the router answers with a 400 in the OpenAI error
shape naming the field: vllm-router would hash such a value's text (``{`` for an
object), which silently merges unrelated sessions.

The body is parsed by the caller at most once (:func:`load_json`, orjson) and only
when it is needed: when no header carries the key, or when the router must read the
``stream`` flag anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

__all__ = [
    "DEFAULT_BODY_FIELDS",
    "MAX_KEY_CHARS",
    "SessionKeyError",
    "body_session_key",
    "header_session_key",
    "load_json",
    "parse_fields",
    "session_key",
]

DEFAULT_BODY_FIELDS: tuple[str, ...] = ("session_params.session_id", "session_id", "user")
"""Body fields read for the key, in order, when no header carries it."""

MAX_KEY_CHARS = 1024
"""Longest accepted session key."""


class SessionKeyError(ValueError):
    """A body field meant to carry the session key has the wrong type (answered 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def parse_fields(fields: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """Dotted field names (``session_params.session_id``) as paths; raises ValueError on an empty part."""
    paths = []
    for name in fields:
        parts = tuple(name.split("."))
        if not name or any(not p.strip() or p != p.strip() for p in parts):
            raise ValueError(f"session body field {name!r}: expected dotted names such as session_params.session_id")
        paths.append(parts)
    return tuple(paths)


def load_json(raw: bytes) -> Any:
    """The decoded JSON value of ``raw`` (orjson); raises ValueError when it is not JSON."""
    return orjson.loads(raw)


def header_session_key(headers: Mapping[str, str], *, header: str) -> str | None:
    """The key in ``header`` (case-insensitive), or None when absent or blank.

    aiohttp's headers are case-insensitive already; a plain mapping is scanned.
    """
    value = headers.get(header)
    if value is None and not hasattr(headers, "getall"):  # not a CIMultiDict: compare names ourselves
        lowered = header.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    if value is None:
        return None
    value = value.strip()
    if len(value) > MAX_KEY_CHARS:
        raise SessionKeyError(header, f"Header {header} exceeds {MAX_KEY_CHARS} characters.")
    return value or None


def _coerce(value: object, field: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        key = value.strip()
    elif isinstance(value, int) and not isinstance(value, bool):
        key = str(value)
    else:
        raise SessionKeyError(
            field, f"`{field}` must be a string (or an integer) to name a session, not {_json_type(value)}."
        )
    if len(key) > MAX_KEY_CHARS:
        raise SessionKeyError(field, f"`{field}` exceeds {MAX_KEY_CHARS} characters.")
    return key or None


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a number with a fraction"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def body_session_key(body: object, *, fields: Sequence[tuple[str, ...]]) -> str | None:
    """The key in the first present body field of ``fields`` (paths from :func:`parse_fields`), or None."""
    if not isinstance(body, dict):
        return None
    for path in fields:
        holder: object = body
        for depth, part in enumerate(path[:-1]):
            if not isinstance(holder, dict):
                break
            holder = holder.get(part)
            if holder is not None and not isinstance(holder, dict):
                name = ".".join(path[: depth + 1])
                raise SessionKeyError(name, f"`{name}` must be an object, not {_json_type(holder)}.")
        if not isinstance(holder, dict):
            continue
        key = _coerce(holder.get(path[-1]), ".".join(path))
        if key is not None:
            return key
    return None


def session_key(
    headers: Mapping[str, str], body: object, *, header: str, fields: Sequence[tuple[str, ...]]
) -> str | None:
    """The session key of a request: the header, then the body fields; None for a one-turn request."""
    key = header_session_key(headers, header=header)
    if key is not None:
        return key
    return body_session_key(body, fields=fields)
