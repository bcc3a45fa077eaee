"""The OpenAI-compatible proxy: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

A generation request is validated just enough to route it (a JSON object naming a
model), its session is looked up or placed (possibly after waiting in the
admission queue), and the body is forwarded unchanged to the session's replica;
streams are relayed event by event. The response's ``usage`` feeds the fast loop:
a returning session whose ``cached_tokens`` fell short of its previous context
was re-prefilled, which may quarantine the replica.

Streams: when the client did not ask for ``stream_options.include_usage`` (and
``measure_streams`` is on) the router asks for it and drops the extra final usage
chunk, so the client sees exactly the stream it asked for while every turn is
measured.

Failures: an upstream that cannot be reached or dies mid-stream is a 502 (or an
error event ending the stream), its session is unbound so that the next turn is
placed again, and the replica takes no new sessions until its next good scrape.
An upstream silent for ``upstream_timeout_s`` is a 504 and its session is unbound.
Errors the engine answers itself (4xx/5xx JSON) pass through untouched.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from rolloutpool.router.config import RouterConfig
from rolloutpool.router.errors import error_body, error_response
from rolloutpool.router.renewal_body import TextCollector, response_text
from rolloutpool.router.sessions import AdmissionError, QueueFullError, SessionManager, Usage
from rolloutpool.router.types import JSONObject
from rolloutpool.routing.table import Session

if TYPE_CHECKING:
    from rolloutpool.router.fleet import Fleet
    from rolloutpool.router.renewal import Renewer

__all__ = [
    "REPLICA_HEADER",
    "EventRelay",
    "Proxy",
    "admission_response",
    "parse_usage",
    "read_json_object",
    "session_key",
    "upstream_timeout",
]

_log = logging.getLogger(__name__)

REPLICA_HEADER = "X-RolloutPool-Replica"
"""Response header naming the replica that served the request."""

_FORWARDED_HEADERS = ("Authorization", "Accept", "X-Request-Id", "traceparent", "tracestate")
_TRUE = {"1", "true", "yes", "on"}


def parse_usage(obj: Any) -> Usage | None:
    """The usage of a response or usage chunk, or None (pure)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("usage"), dict):
        return None
    usage = obj["usage"]
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(prompt, completion, cached if isinstance(cached, int) else None)


def session_key(headers: Any, body: JSONObject, *, header: str) -> str | None:
    """The session id: the header, then body ``session_id``, then ``session_params.session_id`` (pure)."""
    value = headers.get(header)
    if value:
        return str(value).strip() or None
    for holder in (body, body.get("session_params")):
        if isinstance(holder, dict):
            sid = holder.get("session_id")
            if isinstance(sid, (str, int)) and not isinstance(sid, bool) and str(sid):
                return str(sid)
    return None


async def read_json_object(
    request: web.Request, *, max_bytes: int, allow_empty: bool = False
) -> JSONObject | web.Response:
    """The request body as a JSON object, or the 400/413 error response to send."""
    if request.content_length is not None and request.content_length > max_bytes:
        return error_response(413, f"Request body of {request.content_length} bytes exceeds the limit of {max_bytes}.")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"Request body exceeds the limit of {max_bytes} bytes.")
    if allow_empty and not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return error_response(400, f"Invalid JSON body: {exc}")
    if not isinstance(body, dict):
        return error_response(400, "The request body must be a JSON object.")
    return body


def upstream_timeout(config: RouterConfig) -> aiohttp.ClientTimeout:
    """Timeouts of a request to a replica: connect, then each read (a stream may run long; no total)."""
    return aiohttp.ClientTimeout(
        total=None,
        connect=config.upstream_connect_timeout_s,
        sock_connect=config.upstream_connect_timeout_s,
        sock_read=config.upstream_timeout_s,
    )


def admission_response(exc: AdmissionError, config: RouterConfig) -> web.Response:
    """429 when the queue is full, 503 when the wait timed out or the router stops; both with Retry-After."""
    status = 429 if isinstance(exc, QueueFullError) else 503
    return error_response(status, str(exc), headers={"Retry-After": str(config.retry_after_s)})


class EventRelay:
    """Splits an SSE byte stream into events, records the usage chunk and optionally drops it.

    With a ``collector`` (prefix renewal on) every event is decoded and handed to it, to
    accumulate the generated text; without one only events that mention ``usage`` are.
    """

    def __init__(self, *, drop_usage_chunk: bool, collector: TextCollector | None = None) -> None:
        self.drop_usage_chunk = drop_usage_chunk
        self.collector = collector
        self.usage: Usage | None = None
        self._buffer = bytearray()

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward for ``data`` (whole events only; the rest waits for more)."""
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
        if self.collector is None and b'"usage"' not in event:
            return True
        payload = b"".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
        try:
            obj = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return True  # e.g. [DONE]
        if self.collector is not None:
            self.collector.feed(obj)
        usage = parse_usage(obj)
        if usage is None:
            return True
        self.usage = usage
        return not (self.drop_usage_chunk and obj.get("choices") == [])


class Proxy:
    """Handlers of the OpenAI endpoints."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager
        self._client: aiohttp.ClientSession | None = None
        self.renewer: Renewer | None = None
        """Prefix renewal (``renew_every_s``), told about the turns of sessions with an explicit id."""
        self.fleet: Fleet | None = None
        """One of N routers (``router/fleet.py``): a session owned by another router is forwarded to it."""
        self.config = manager.config
        self.metrics = manager.metrics
        self._timeout = upstream_timeout(self.config)

    def attach(self, client: aiohttp.ClientSession) -> None:
        """Use ``client`` for upstream requests (set at startup, inside the event loop)."""
        self._client = client

    @property
    def client(self) -> aiohttp.ClientSession:
        """The upstream HTTP client."""
        if self._client is None:
            raise RuntimeError("the proxy serves only between startup and cleanup")
        return self._client

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions``."""
        return await self._generate(request, "/v1/completions")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``."""
        return await self._generate(request, "/v1/chat/completions")

    async def models(self, request: web.Request) -> web.Response:
        """``GET /v1/models`` from the first ready replica that answers."""
        replicas = sorted(self.manager.table.replicas.values(), key=lambda r: not r.ready)
        for replica in replicas:
            runtime = self.manager.runtime.get(replica.name)
            if runtime is None:  # removed while we asked another replica
                continue
            url = runtime.spec.url
            try:
                async with self.client.get(f"{url}/v1/models", timeout=self._timeout) as upstream:
                    data = await upstream.read()
                    if upstream.status < 500:
                        return web.Response(body=data, status=upstream.status, content_type="application/json")
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.metrics.upstream_errors.labels(replica.name, type(exc).__name__).inc()
        return error_response(502, "No replica answered GET /v1/models.")

    # -- generation --------------------------------------------------------------------

    async def _generate(self, request: web.Request, path: str) -> web.StreamResponse:
        cfg = self.config
        body = await read_json_object(request, max_bytes=cfg.max_body_bytes)
        if isinstance(body, web.Response):
            return body
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return error_response(400, "The request body must name a model (`model`).", param="model")
        key = session_key(request.headers, body, header=cfg.session_header)
        if self.fleet is not None and key is not None:  # a session id from the body: its owner may be elsewhere
            forwarded = await self.fleet.forward_if_foreign(request, key)
            if forwarded is not None:
                return forwarded
        ephemeral = key is None
        sid = key if key is not None else f"oneshot-{uuid.uuid4().hex}"
        group = request.headers.get(cfg.group_header) or None
        final = request.headers.get(cfg.final_header, "").strip().lower() in _TRUE
        try:
            session, _ = await self.manager.acquire(sid, group=group, ephemeral=ephemeral)
        except AdmissionError as exc:
            return admission_response(exc, cfg)
        self.manager.begin(session)
        renewer = None if ephemeral else self.renewer
        if renewer is not None:
            renewer.turn_started(sid)
        try:
            return await self._forward(request, session, path, body, renewer)
        finally:
            self.manager.end(session)
            if ephemeral and self.manager.is_current(session):
                self.manager.release(sid, how="request")
            elif final:
                self.manager.release(sid, how="final")
            if renewer is not None:
                renewer.turn_ended(session)

    async def _forward(
        self, request: web.Request, session: Session, path: str, body: JSONObject, renewer: Renewer | None
    ) -> web.StreamResponse:
        cfg = self.config
        original = body
        stream = body.get("stream") is True
        options = body.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        inject = stream and cfg.measure_streams and not asked
        if inject:
            body = {**body, "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}
        headers = {"Content-Type": "application/json"}
        headers.update({h: request.headers[h] for h in _FORWARDED_HEADERS if h in request.headers})
        replica = session.replica
        url = f"{self.manager.runtime[replica].spec.url}{path}"
        try:
            async with self.client.post(url, data=json.dumps(body), headers=headers, timeout=self._timeout) as upstream:
                if stream and upstream.status == 200:
                    collector = None if renewer is None else TextCollector(path)
                    response = await self._relay(
                        request, upstream, session, drop_usage_chunk=inject, collector=collector
                    )
                    if renewer is not None and collector is not None and collector.finished:
                        renewer.turn_answered(
                            session, path=path, body=original, text=collector.text(), headers=request.headers
                        )
                    return response
                data = await upstream.read()
                content_type = upstream.headers.get("Content-Type", "application/json")
        except TimeoutError:
            return self._failed(session, "timeout", 504, f"Replica {replica} did not answer within the timeout.")
        except aiohttp.ClientError as exc:
            return self._failed(session, type(exc).__name__, 502, f"Replica {replica} failed: {type(exc).__name__}.")
        if upstream.status == 200:
            try:
                obj = json.loads(data)
            except (UnicodeDecodeError, json.JSONDecodeError):
                obj = None
            self._turn(session, parse_usage(obj))
            if renewer is not None:
                text = response_text(path, obj)
                renewer.turn_answered(session, path=path, body=original, text=text, headers=request.headers)
        return web.Response(
            body=data, status=upstream.status, headers={"Content-Type": content_type, REPLICA_HEADER: replica}
        )

    def _failed(self, session: Session, kind: str, status: int, message: str) -> web.Response:
        self.metrics.upstream_errors.labels(session.replica, kind).inc()
        _log.warning("Failed upstream request replica=%s kind=%s status=%d", session.replica, kind, status)
        self.manager.upstream_failed(session, replica_down=status == 502)
        return error_response(status, message)

    def _turn(self, session: Session, usage: Usage | None) -> None:
        self.manager.finish_turn(session, usage=usage)

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        session: Session,
        *,
        drop_usage_chunk: bool,
        collector: TextCollector | None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": upstream.headers.get("Content-Type", "text/event-stream"),
                "Cache-Control": "no-cache",
                REPLICA_HEADER: session.replica,
            }
        )
        relay = EventRelay(drop_usage_chunk=drop_usage_chunk, collector=collector)
        try:
            await response.prepare(request)
            while True:
                try:
                    chunk = await upstream.content.readany()
                except TimeoutError:
                    return await self._end_stream(response, session, "timeout", "did not answer within the timeout")
                except aiohttp.ClientError as exc:
                    return await self._end_stream(response, session, type(exc).__name__, "failed mid-stream")
                if not chunk:
                    break
                out = relay.feed(chunk)
                if out:
                    await response.write(out)
            tail = relay.close()
            if tail:
                await response.write(tail)
            await response.write_eof()
        except ConnectionError:  # the client went away; its session stays
            _log.info("Lost streaming client session=%s replica=%s", session.session_id, session.replica)
            return response
        self._turn(session, relay.usage)
        if collector is not None:
            collector.finished = True
        return response

    async def _end_stream(
        self, response: web.StreamResponse, session: Session, kind: str, what: str
    ) -> web.StreamResponse:
        status = 504 if kind == "timeout" else 502
        self.metrics.upstream_errors.labels(session.replica, kind).inc()
        _log.warning("Failed upstream stream replica=%s kind=%s", session.replica, kind)
        message = f"Replica {session.replica} {what}; the session will be placed again on its next turn."
        self.manager.upstream_failed(session, replica_down=status == 502)
        event = f"data: {json.dumps(error_body(status, message))}\n\n".encode()
        try:
            await response.write(event)
            await response.write_eof()
        except ConnectionError:
            pass
        return response
