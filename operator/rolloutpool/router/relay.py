"""Usage of engine responses, and the stream relay that reads it without changing the stream.

A response carries the OpenAI ``usage`` object when it is a generation (vLLM's
completions, chat completions and ``/inference/v1/generate`` responses; the final
chunk of a stream asked with ``include_usage``; ``/v1/responses`` answers and their
stream's ``response.completed`` event). :func:`response_usage` finds it at the top
level of a JSON response without decoding the rest (token ids, text).

:class:`EventRelay` forwards a server-sent-event stream: chunks go out as they
came in, except that an event mentioning ``"usage"`` is read, and the usage chunk
the router injected (``choices: []``) is dropped when the client did not ask for
it. Nothing else in the stream changes (``system_fingerprint`` included): without
a drop the output is the input, byte for byte.
"""

from __future__ import annotations

from typing import Any

import orjson

from rolloutpool.router.renewal_body import TextCollector
from rolloutpool.router.sessions import Usage
from rolloutpool.routing.bodyscan import ScanError, scan_object
from rolloutpool.routing.requestbody import SMALL_BODY_BYTES

__all__ = ["EventRelay", "parse_usage", "response_usage"]

_USAGE = b'"usage"'
_USAGE_KEY = frozenset((b"usage",))


def parse_usage(obj: Any) -> Usage | None:
    """The usage of a response or usage chunk, or None (pure).

    Completions, chat and generate carry ``prompt_tokens`` / ``completion_tokens`` /
    ``prompt_tokens_details.cached_tokens``; the Responses API ``input_tokens`` / ``output_tokens`` /
    ``input_tokens_details.cached_tokens``, and its stream nests the response (with its usage) in the
    ``response.completed`` event. Anthropic's ``/v1/messages`` usage (no ``input_tokens_details``; its
    ``input_tokens`` leaves out cache reads) is not read.
    """
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        nested = obj.get("response")  # a Responses stream event
        return parse_usage(nested) if isinstance(nested, dict) and "response" not in nested else None
    if "prompt_tokens" in usage:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
        details = usage.get("prompt_tokens_details")
    elif isinstance(usage.get("input_tokens_details"), dict):
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens", 0)
        details = usage["input_tokens_details"]
    else:
        return None
    if type(prompt) is not int or type(completion) is not int:
        return None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(prompt, completion, cached if type(cached) is int else None)


def _decoded_usage(data: bytes) -> Usage | None:
    try:
        return parse_usage(orjson.loads(data))
    except orjson.JSONDecodeError:
        return None


def response_usage(data: bytes) -> Usage | None:
    """The top-level ``usage`` of a JSON response, decoding only that object; None without one."""
    if len(data) <= SMALL_BODY_BYTES:
        return _decoded_usage(data)
    try:
        span = scan_object(data, _USAGE_KEY).get(b"usage")
    except ScanError:  # not walkable, or too many strings to walk: decode it all
        return _decoded_usage(data)
    if span is None:
        return None
    return _decoded_usage(b'{"usage":' + data[span[0] : span[1]] + b"}")


class EventRelay:
    """Splits an SSE byte stream into events, records the usage chunk and optionally drops it.

    With a ``collector`` (prefix renewal on) every event is decoded and handed to it, to
    accumulate the generated text; without one only events that mention ``usage`` are,
    and a chunk of whole events without it is forwarded as it is (no copy).
    """

    def __init__(self, *, drop_usage_chunk: bool, collector: TextCollector | None = None) -> None:
        self.drop_usage_chunk = drop_usage_chunk
        self.collector = collector
        self.usage: Usage | None = None
        self._buffer = bytearray()

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward for ``data`` (whole events only; the rest waits for more)."""
        if not self._buffer and self.collector is None and _USAGE not in data and data.endswith(b"\n\n"):
            return data  # whole events (an SSE event ends with a blank line), none to read
        self._buffer += data
        out = bytearray()
        while True:
            end = self._event_end()
            if end < 0:
                return bytes(out)
            event = bytes(self._buffer[:end])
            del self._buffer[:end]
            if self._keep(event):
                out += event

    def close(self) -> bytes:
        """Whatever remains at the end of the stream."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    def _event_end(self) -> int:
        ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if (i := self._buffer.find(sep)) >= 0]
        return min(ends) if ends else -1

    def _keep(self, event: bytes) -> bool:
        if self.collector is None and _USAGE not in event:
            return True
        payload = b"".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return True  # e.g. [DONE]
        if self.collector is not None:
            self.collector.feed(obj)
        usage = parse_usage(obj)
        if usage is None:
            return True
        self.usage = usage
        return not (self.drop_usage_chunk and obj.get("choices") == [])
