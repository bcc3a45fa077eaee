"""What the router reads from a request body, and the one change it may make to it (pure).

The router forwards the bytes it received. It reads only: the session key (when no
header carries it), ``cache_salt`` where asked, and, where it measures streams, ``stream`` and
``stream_options`` (a missing ``model`` is the engine's to serve: vLLM answers with its one
model). Those few top-level fields are found by
:func:`rolloutpool.routing.bodyscan.scan_object` and only they are decoded (orjson);
a body the scan cannot walk is decoded once in full. The one change: a stream whose
client did not ask for ``stream_options.include_usage`` gets it spliced in (every
other byte kept), so that the router can read the turn's usage; the router then
drops that extra usage chunk from the stream (:mod:`rolloutpool.router.relay`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from rolloutpool.routing.bodyscan import ScanError, scan_object, splice
from rolloutpool.routing.sessionkey import body_session_key

__all__ = ["SMALL_BODY_BYTES", "BodyError", "RequestBody", "read_body"]

_STREAM, _OPTIONS, _SALT = b"stream", b"stream_options", b"cache_salt"
_INCLUDE_USAGE = orjson.dumps({"include_usage": True})

SMALL_BODY_BYTES = 4096
"""Bodies up to this size are decoded whole (orjson takes about a microsecond); larger ones are scanned."""


class BodyError(ValueError):
    """A body the router must answer itself (400), e.g. not a JSON object on a JSON path."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class RequestBody:
    """What routing needs of one request body."""

    key: str | None
    """The session key (the header's when given), or None for a one-turn request."""
    stream: bool
    """``"stream": true`` (read only where the router measures streams)."""
    injected: bool
    """``include_usage`` was spliced in: the extra usage chunk must be dropped from the stream."""
    body: bytes
    """The bytes to forward: the received bytes, or those with ``include_usage`` spliced in."""
    salt: object = None
    """The body's ``cache_salt`` (read only when asked: a new salt re-prefills, routing/weights.py)."""


@functools.cache
def _wanted(fields: tuple[tuple[str, ...], ...], *, measure_stream: bool, want_salt: bool) -> frozenset[bytes]:
    wanted = {path[0].encode() for path in fields}
    if want_salt:
        wanted.add(_SALT)
    if measure_stream:
        wanted.update((_STREAM, _OPTIONS))
    return frozenset(wanted)


def _decode(raw: bytes, span: tuple[int, int] | None) -> Any:
    return None if span is None else orjson.loads(raw[span[0] : span[1]])


def read_body(
    raw: bytes,
    *,
    header_key: str | None,
    fields: Sequence[tuple[str, ...]],
    json_path: bool,
    measure_stream: bool,
    want_salt: bool = False,
) -> RequestBody:
    """Read what routing needs of ``raw``; raises :class:`BodyError` or ``SessionKeyError``.

    ``json_path``: the path takes a JSON object (an invalid one is the router's 400);
    elsewhere a body that is not a JSON object is forwarded untouched, keyed by the
    header alone. ``measure_stream``: read
    ``stream`` and splice ``include_usage`` in when the client did not ask for it.
    ``want_salt``: read ``cache_salt`` too.
    """
    need_key = header_key is None
    if not (need_key or measure_stream or want_salt) or (not json_path and not raw):
        return RequestBody(header_key, stream=False, injected=False, body=raw)
    wanted = _wanted(tuple(fields) if need_key else (), measure_stream=measure_stream, want_salt=want_salt)
    spans: dict[bytes, tuple[int, int]] | None = None
    decoded: dict[bytes, Any] = {}
    if len(raw) > SMALL_BODY_BYTES:
        try:
            spans = scan_object(raw, wanted)
            decoded = {k: _decode(raw, s) for k, s in spans.items() if k != _OPTIONS}
        except (ScanError, orjson.JSONDecodeError):
            spans = None
    whole: Any = None
    if spans is None:  # not walkable (or too many strings to walk): decode it all, once
        whole = _whole(raw, json_path=json_path)
        if whole is None:
            return RequestBody(header_key, stream=False, injected=False, body=raw)
        decoded = {k: whole.get(k.decode()) for k in wanted}
    key = header_key
    if need_key:
        key = body_session_key({k.decode(): v for k, v in decoded.items()}, fields=fields)
    stream = measure_stream and decoded.get(_STREAM) is True
    salt = decoded.get(_SALT)
    if not stream:
        return RequestBody(key, stream=stream, injected=False, body=raw, salt=salt)
    return dataclasses.replace(_with_usage(raw, spans, whole, key), salt=salt)


def _whole(raw: bytes, *, json_path: bool) -> dict[str, Any] | None:
    """The whole body decoded; None for a body that is not a JSON object off the JSON paths."""
    try:
        whole = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if json_path:
            raise BodyError(f"Invalid JSON body: {exc}") from None
        return None
    if not isinstance(whole, dict):
        if json_path:
            raise BodyError("The request body must be a JSON object.")
        return None
    return whole


def _with_usage(
    raw: bytes, spans: dict[bytes, tuple[int, int]] | None, whole: dict[str, Any] | None, key: str | None
) -> RequestBody:
    """A streaming request: ``include_usage`` added unless the client asked for it.

    Spliced into the received bytes when the scan walked them; re-encoded (same values)
    when the body had to be decoded in full.
    """
    span = None if spans is None else spans.get(_OPTIONS)
    options = whole.get("stream_options") if whole is not None else _decode(raw, span)
    if isinstance(options, dict) and options.get("include_usage") is True:
        return RequestBody(key, stream=True, injected=False, body=raw)
    usage_options = {**options, "include_usage": True} if isinstance(options, dict) else {"include_usage": True}
    if whole is not None and len(raw) <= SMALL_BODY_BYTES:
        try:  # a small body decoded whole: splice into it all the same, so that only the option changes
            spans = scan_object(raw, {_OPTIONS}, budget=SMALL_BODY_BYTES)
        except ScanError:
            spans = None
        else:
            whole, span = None, spans.get(_OPTIONS)
    if whole is not None:
        return RequestBody(
            key, stream=True, injected=True, body=orjson.dumps({**whole, "stream_options": usage_options})
        )
    value = orjson.dumps(usage_options) if isinstance(options, dict) else _INCLUDE_USAGE
    return RequestBody(key, stream=True, injected=True, body=splice(raw, span, _OPTIONS, value))
