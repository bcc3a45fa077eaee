"""The data path: the engine paths a trainer may reach, forwarded to the replica of its session (DESIGN 3, 10, 12).

One handler serves every path the router does not own itself (its session and admin API,
health, metrics), after :func:`rolloutpool.routing.paths.classify` says what the path is for:

- generation (``/v1/completions``, ``/v1/chat/completions``, vLLM's ``/inference/v1/generate``,
  ``/v1/responses``, ...): its session key (the header, else the body:
  :mod:`rolloutpool.routing.sessionkey`), then the session's replica, placed under caps through the
  admission queue when new, then the received bytes forwarded unchanged
  (:mod:`rolloutpool.routing.requestbody` reads the few fields routing needs without decoding the
  body). A request without a key continues the implicit session whose conversation it extends
  (:mod:`rolloutpool.router.implicit`, docs/sessionless-clients.md); with ``--no-implicit-sessions``, or
  when its body gives no prefix keys, it is a one-turn session released when it ends. A session that the
  request created is released again when the engine refuses that request (any status but 2xx), so a
  rejected request leaves no session behind. A body without ``model`` goes to the engine as it came:
  vLLM serves its one model then, and so does the router.
- auxiliary (tokenize, detokenize, render, embeddings, ...): no session is created, nothing waits
  and nothing is refused for capacity; the request goes to the replica of the live session it names,
  else to the next ready replica in turn.
- engine control (``/pause``, ``/update_weights``, ``/reset_prefix_cache``, ``/sleep``, ...): refused
  with a 403 that names the authenticated admin fan-out; unknown paths: 404 (``--allow-path`` forwards
  more).

Every response carrying the OpenAI ``usage`` object (any path; the final chunk of a
stream) feeds the fast loop: a returning session whose ``cached_tokens`` fell short
of its previous context was re-prefilled, which may quarantine the replica.
Responses pass through unchanged (status, body, headers but the hop-by-hop ones);
the router adds ``X-RolloutPool-Replica``. Request headers the router owns (the fleet's
``X-RolloutPool-*``) never reach an engine.

Streams: when the client did not ask for ``stream_options.include_usage`` (and
``measure_streams`` is on) on a path that takes it, the router asks for it and
drops that extra final usage chunk, so the client sees exactly the stream it asked
for while every turn is measured (:mod:`rolloutpool.router.relay`).

Failures: an upstream that cannot be reached or dies mid-stream is a 502 (or an
error event ending the stream), its session is unbound so that the next turn is
placed again, and the replica takes no new sessions until its next good scrape.
An upstream silent for ``upstream_timeout_s`` is a 504 and its session is unbound.
Errors the engine answers itself (any status, e.g. a 404 for a path it lacks) pass
through untouched and change no count.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from typing import TYPE_CHECKING

import aiohttp
import orjson
from aiohttp import web

from rolloutpool.router.bodyread import read_raw
from rolloutpool.router.errors import admission_response, error_body, error_response
from rolloutpool.router.hop import forward_headers, response_headers, upstream_timeout
from rolloutpool.router.implicit import ImplicitSessions, Resolved
from rolloutpool.router.relay import EventRelay, response_usage
from rolloutpool.router.renewal_body import TextCollector, response_text
from rolloutpool.router.sessions import AdmissionError, SessionManager
from rolloutpool.router.upstream import UpstreamError, UpstreamPool, UpstreamResponse
from rolloutpool.routing.paths import AUXILIARY_PATHS, GENERATION_PATHS, PathKind, classify, refusal
from rolloutpool.routing.prefixkey import KEYED_PATHS, prompt_group
from rolloutpool.routing.requestbody import BodyError, RequestBody, read_body
from rolloutpool.routing.sessionkey import SessionKeyError, header_session_key, parse_fields
from rolloutpool.routing.table import Session

if TYPE_CHECKING:
    from rolloutpool.router.fleet import Fleet
    from rolloutpool.router.renewal import Renewer

__all__ = ["DATA_PATHS", "OPENAI_PATHS", "USAGE_STREAM_PATHS", "Proxy"]

_log = logging.getLogger(__name__)

OPENAI_PATHS = frozenset(("/v1/completions", "/v1/chat/completions"))
"""Generation paths whose answers feed prefix renewal (and close a turn even without usage)."""
USAGE_STREAM_PATHS = OPENAI_PATHS | {"/inference/v1/generate"}
"""Paths that take ``stream_options.include_usage`` (the router may inject it)."""
DATA_PATHS = GENERATION_PATHS | AUXILIARY_PATHS
"""The fixed paths of the data port (:mod:`rolloutpool.routing.paths`): plain routes, and metric labels."""
_TRUE = frozenset(("1", "true", "yes", "on"))


class Proxy:
    """The forwarding handler (any engine path) and ``GET /v1/models``."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager
        self._client: aiohttp.ClientSession | None = None
        self._pool: UpstreamPool | None = None
        self.renewer: Renewer | None = None
        """Prefix renewal (``renew_every_s``), told about the turns of sessions with an explicit id."""
        self.fleet: Fleet | None = None
        """One of N routers (``router/fleet.py``): a session owned by another router is forwarded to it."""
        self.config = manager.config
        self.metrics = manager.metrics
        self.implicit = None if self.config.implicit is None else ImplicitSessions(self.config.implicit, manager)
        """Sessionless requests matched to the conversation their prefix extends (``--no-implicit-sessions``: off)."""
        self.owned: tuple[str, ...] = ()
        """Path prefixes the router serves itself: a method it does not serve there is a 405, not forwarded."""
        self._timeout = upstream_timeout(self.config)
        self._fields = parse_fields(self.config.session_body_fields)
        self._oneshot = itertools.count()
        self._aux_turn = itertools.count()
        self._oneshot_prefix = f"oneshot-{uuid.uuid4().hex[:12]}-"

    def _owns(self, path: str) -> bool:
        return any(path == p or path.startswith(f"{p}/") for p in self.owned)

    def attach(self, client: aiohttp.ClientSession) -> None:
        """Use ``client`` for ``/v1/models`` and a new keep-alive pool for the data path (at startup, in the loop)."""
        self._client = client
        self._pool = UpstreamPool(
            connect_timeout_s=self.config.upstream_connect_timeout_s, read_timeout_s=self.config.upstream_timeout_s
        )

    def close(self) -> None:
        """Close the data path's idle connections (at cleanup)."""
        if self._pool is not None:
            self._pool.close()

    @property
    def client(self) -> aiohttp.ClientSession:
        """The upstream HTTP client."""
        if self._client is None:
            raise RuntimeError("the proxy serves only between startup and cleanup")
        return self._client

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

    # -- any engine path ---------------------------------------------------------------

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """Any path the router does not own: refuse it, or serve it as generation or as an auxiliary request."""
        cfg = self.config
        path = request.path
        if path.startswith(self.owned) and self._owns(path):
            return error_response(405, f"{request.method} is not served on {path}.")
        kind = classify(path, allowed=cfg.allowed_paths)
        if kind is PathKind.CONTROL or kind is PathKind.UNKNOWN:
            status, message = refusal(path, kind)
            return error_response(status, message)
        generation = kind is PathKind.GENERATION
        body = await self._read(request, generation=generation)
        if isinstance(body, web.Response):
            return body
        if not generation:
            return await self.auxiliary(request, body)
        # The session key is known here and nothing is placed yet: the one place to hook routing decisions.
        if self.fleet is not None and body.key is not None:  # one of N routers: its owner may be another router
            forwarded = await self.fleet.forward_if_foreign(request, body.key)
            if forwarded is not None:
                return forwarded
        return await self.serve(request, path, body)

    async def _read(self, request: web.Request, *, generation: bool) -> RequestBody | web.Response:
        """What routing needs of the body (a generation path's must be a JSON object), or the router's 4xx."""
        cfg = self.config
        raw = await read_raw(request, max_bytes=cfg.max_body_bytes)
        if isinstance(raw, web.Response):
            return raw
        try:
            return read_body(
                raw,
                header_key=header_session_key(request.headers, header=cfg.session_header),
                fields=self._fields,
                json_path=generation,
                measure_stream=generation and cfg.measure_streams and request.path in USAGE_STREAM_PATHS,
                want_salt=generation,
            )
        except SessionKeyError as exc:
            return error_response(400, str(exc), param=exc.field)
        except BodyError as exc:
            return error_response(400, str(exc), param=exc.param)

    async def serve(self, request: web.Request, path: str, body: RequestBody) -> web.StreamResponse:
        """Place (or find) the request's session, forward the request there, then account for the turn."""
        cfg = self.config
        sid, implicit = self._session_of(path, body)
        ephemeral = body.key is None and implicit is None
        headers = request.headers
        group = headers.get(cfg.group_header) or (None if implicit is None else implicit.group)
        if group is None and body.key is not None and self.manager.lookup(sid) is None:  # keyed: never implicit
            group = self._opening_group(path, body)
        try:
            session, created = await self.manager.acquire(sid, group=group, ephemeral=ephemeral)
        except AdmissionError as exc:
            if implicit is not None and self.implicit is not None:
                self.implicit.ended(implicit)
            return admission_response(exc, cfg)
        self.manager.weights.note_salt(sid, body.salt)  # a new salt re-prefills: routing/weights.py
        self.manager.begin(session)
        renewer = None if body.key is None or path not in OPENAI_PATHS else self.renewer
        if renewer is not None:
            renewer.turn_started(sid)
        status = 500
        try:
            response = await self._forward(request, session, path, body, renewer, implicit=implicit)
            status = response.status
            return response
        finally:
            self.manager.end(session)
            if implicit is not None and self.implicit is not None:
                self.implicit.ended(implicit)
            if ephemeral:
                if self.manager.is_current(session):
                    self.manager.release(sid, how="request")
            elif created and not 200 <= status < 300 and self.manager.is_current(session):
                self.manager.release(sid, how="rejected")  # the request that made it was refused: no session
            elif cfg.final_header in headers and headers[cfg.final_header].strip().lower() in _TRUE:
                self.manager.release(sid, how="final")
            if renewer is not None:
                renewer.turn_ended(session)

    def _session_of(self, path: str, body: RequestBody) -> tuple[str, Resolved | None]:
        """The request's session id: its key, else its implicit session, else a fresh one-turn id."""
        if body.key is not None:
            return body.key, None
        implicit = None if self.implicit is None else self.implicit.resolve(path, body.body)
        if implicit is not None:
            return implicit.session_id, implicit
        return f"{self._oneshot_prefix}{next(self._oneshot)}", None

    def _opening_group(self, path: str, body: RequestBody) -> str | None:
        """A new session's group named by its opening prompt (``infer_groups``; our turn scheduler only)."""
        if not self.config.infer_groups or self.config.turn_scheduler is not None or path not in KEYED_PATHS:
            return None
        try:
            decoded = orjson.loads(body.body)
        except orjson.JSONDecodeError:
            return None
        return prompt_group(path, decoded) if isinstance(decoded, dict) else None

    def _auxiliary_replica(self, key: str | None) -> str | None:
        """Where an auxiliary request goes: its live session's replica, else the next ready replica in turn."""
        session = None if key is None else self.manager.lookup(key)
        if session is not None and session.replica in self.manager.runtime:
            return session.replica
        ready = [r.name for r in self.manager.table.replicas.values() if r.ready]
        if not ready:
            return None
        return ready[next(self._aux_turn) % len(ready)]

    async def auxiliary(self, request: web.Request, body: RequestBody) -> web.StreamResponse:
        """An auxiliary request: forwarded at once, with no session, no queue and no accounting."""
        replica = self._auxiliary_replica(body.key)
        if replica is None:
            return error_response(503, "No replica is ready.", headers={"Retry-After": str(self.config.retry_after_s)})
        if self._pool is None:
            raise RuntimeError("the proxy serves only between startup and cleanup")
        data = body.body if body.body or request.method not in {"GET", "HEAD"} else None
        upstream: UpstreamResponse | None = None
        try:
            upstream = await self._pool.request(
                self.manager.runtime[replica].spec.url,
                request.method,
                request.raw_path,
                forward_headers(request),
                data,
            )
            headers = response_headers(upstream, replica)
            if not upstream.header("Content-Type").startswith("text/event-stream"):
                return web.Response(body=await upstream.read(), status=upstream.status, headers=headers)
            response = web.StreamResponse(status=upstream.status, headers=headers)
            await response.prepare(request)
            while chunk := await upstream.next_chunk():
                await response.write(chunk)
            await response.write_eof()
            return response
        except TimeoutError:
            return error_response(504, f"Replica {replica} did not answer within the timeout.")
        except UpstreamError as exc:
            self.metrics.upstream_errors.labels(replica, exc.kind).inc()
            return error_response(502, f"Replica {replica} failed: {exc.kind}.")
        finally:
            if upstream is not None:
                upstream.release()

    async def _forward(
        self,
        request: web.Request,
        session: Session,
        path: str,
        body: RequestBody,
        renewer: Renewer | None,
        *,
        implicit: Resolved | None = None,
    ) -> web.StreamResponse:
        replica = session.replica
        if self._pool is None:
            raise RuntimeError("the proxy serves only between startup and cleanup")
        data = body.body if body.body or request.method not in {"GET", "HEAD"} else None
        headers = forward_headers(request)
        if (body.key is not None or implicit is not None) and self.config.session_header not in request.headers:
            headers.append((self.config.session_header, session.session_id))  # vLLM stamps KV events with it
        try:
            upstream = await self._pool.request(
                self.manager.runtime[replica].spec.url, request.method, request.raw_path, headers, data
            )
        except TimeoutError:
            return self._failed(session, "timeout", 504, f"Replica {replica} did not answer within the timeout.")
        except UpstreamError as exc:
            return self._failed(session, exc.kind, 502, f"Replica {replica} failed: {exc.kind}.")
        try:
            ctype = upstream.header("Content-Type")
            if upstream.status == 200 and ctype.startswith("text/event-stream"):
                collect = renewer is not None or (implicit is not None and path in OPENAI_PATHS)
                collector = TextCollector(path) if collect else None
                response = await self._relay(
                    request, upstream, session, path, drop_usage_chunk=body.injected, collector=collector
                )
                if implicit is not None and self.implicit is not None and collector is not None and collector.finished:
                    self.implicit.streamed(implicit, collector.text())
                if renewer is not None and collector is not None and collector.finished:
                    sent = orjson.loads(body.body)
                    renewer.turn_answered(session, path=path, body=sent, text=collector.text(), headers=request.headers)
                return response
            try:
                payload = await upstream.read()
            except TimeoutError:
                return self._failed(session, "timeout", 504, f"Replica {replica} did not answer within the timeout.")
            except UpstreamError as exc:
                return self._failed(session, exc.kind, 502, f"Replica {replica} failed: {exc.kind}.")
        finally:
            upstream.release()
        if upstream.status == 200:
            if implicit is not None and self.implicit is not None:
                self.implicit.answered(implicit, payload)
            self._answered(
                session=session, path=path, body=body, payload=payload, ctype=ctype, renewer=renewer, request=request
            )
        return web.Response(body=payload, status=upstream.status, headers=response_headers(upstream, replica))

    def _answered(
        self,
        *,
        session: Session,
        path: str,
        body: RequestBody,
        payload: bytes,
        ctype: str,
        renewer: Renewer | None,
        request: web.Request,
    ) -> None:
        """A 200 answer: its usage (if it carries one) is the turn's; other answers leave the session's context."""
        usage = response_usage(payload) if "json" in ctype else None
        if usage is not None or path in OPENAI_PATHS:
            self.manager.finish_turn(session, usage=usage)
        if renewer is not None:
            try:
                obj, sent = orjson.loads(payload), orjson.loads(body.body)
            except orjson.JSONDecodeError:
                return
            text = response_text(path, obj)
            renewer.turn_answered(session, path=path, body=sent, text=text, headers=request.headers)

    def _failed(self, session: Session, kind: str, status: int, message: str) -> web.Response:
        self.metrics.upstream_errors.labels(session.replica, kind).inc()
        _log.warning("Failed upstream request replica=%s kind=%s status=%d", session.replica, kind, status)
        self.manager.upstream_failed(session, replica_down=status == 502)
        return error_response(status, message)

    async def _relay(
        self,
        request: web.Request,
        upstream: UpstreamResponse,
        session: Session,
        path: str,
        *,
        drop_usage_chunk: bool,
        collector: TextCollector | None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=response_headers(upstream, session.replica))
        relay = EventRelay(drop_usage_chunk=drop_usage_chunk, collector=collector)
        try:
            await response.prepare(request)
            while True:
                try:
                    chunk = await upstream.next_chunk()
                except TimeoutError:
                    return await self._end_stream(response, session, "timeout", "did not answer within the timeout")
                except UpstreamError as exc:
                    return await self._end_stream(response, session, exc.kind, "failed mid-stream")
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
        if relay.usage is not None or path in OPENAI_PATHS:
            self.manager.finish_turn(session, usage=relay.usage)
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
        event = b"data: " + orjson.dumps(error_body(status, message)) + b"\n\n"
        try:
            await response.write(event)
            await response.write_eof()
        except ConnectionError:
            pass
        return response
