"""Session endpoints: direct placement and the three explicit releases.

- ``POST /v1/sessions`` ``{session_id?, group?}`` -> ``{session_id, replica: {name, url}, created}``,
  for clients that talk to the engines themselves; same caps and admission queue.
- ``GET /v1/sessions/{id}``: where a live session is.
- ``DELETE /v1/sessions/{id}``: the strict release. It releases at once (a request
  still in flight finishes, unmeasured), and an unknown id is a 404 that changes
  nothing, so a double release is a 404 too.
- ``POST /finish_session?session_id=ID`` (the vllm-router spelling; the id may also be
  in a JSON body): the forgiving release RL clients call on every exit path. Always
  200 for a given id, as vllm-router answers (``{"status": "ok", "session_id": ID}``),
  plus ``released`` (a live session was found and is released) and ``deferred``
  (it had a turn in flight: it is released when that turn ends, after its usage is
  measured; the call never waits). Idempotent: a repeated or unknown id answers
  ``released: false`` and changes nothing. The next request with the same id after
  the release is a new session. A missing id is a 400, as vllm-router answers.
- ``GET /health``: what RL frameworks and probes poll. 200 whenever the router serves and at least
  one replica is ready, a full fleet included (new sessions then wait in the admission queue, and
  auxiliary requests are served at once); 503 only with no ready replica. The body says whether a
  new session could be placed now (``placeable``). Liveness alone is ``/healthz`` (always 200 while
  the process serves), readiness ``/readyz`` (the same rule as ``/health``).
"""

from __future__ import annotations

import json
import uuid

from aiohttp import web

from rolloutpool.router.bodyread import read_json_object
from rolloutpool.router.errors import admission_response, error_response
from rolloutpool.router.sessions import AdmissionError, SessionManager
from rolloutpool.routing.table import Session

__all__ = ["SessionAPI"]


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type="application/json")


class SessionAPI:
    """Handlers of the session endpoints."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager

    def _describe(self, session: Session) -> dict[str, object]:
        spec = self.manager.runtime[session.replica].spec
        return {
            "session_id": session.session_id,
            "replica": {"name": spec.name, "url": spec.url},
            "group": session.group,
        }

    async def place(self, request: web.Request) -> web.Response:
        """``POST /v1/sessions``."""
        body = await read_json_object(request, max_bytes=self.manager.config.max_body_bytes, allow_empty=True)
        if isinstance(body, web.Response):
            return body
        sid, group = body.get("session_id"), body.get("group")
        if sid is None:
            sid = request.headers.get(self.manager.config.session_header) or f"session-{uuid.uuid4().hex}"
        if not isinstance(sid, str) or not sid:
            return error_response(400, "`session_id` must be a non-empty string.", param="session_id")
        if group is None:
            group = request.headers.get(self.manager.config.group_header)
        if group is not None and not isinstance(group, str):
            return error_response(400, "`group` must be a string.", param="group")
        try:
            session, created = await self.manager.acquire(sid, group=group or None, turns=False)
        except AdmissionError as exc:
            return admission_response(exc, self.manager.config)
        return _json({**self._describe(session), "created": created}, status=201 if created else 200)

    async def get(self, request: web.Request) -> web.Response:
        """``GET /v1/sessions/{session_id}``."""
        sid = request.match_info["session_id"]
        session = self.manager.lookup(sid)
        if session is None:
            return error_response(404, f"Session {sid!r} is not live on this router.", param="session_id")
        return _json({**self._describe(session), "last_seen": session.last_seen})

    async def delete(self, request: web.Request) -> web.Response:
        """``DELETE /v1/sessions/{session_id}``."""
        return self._release(request.match_info["session_id"], how="delete")

    async def finish(self, request: web.Request) -> web.Response:
        """``POST /finish_session?session_id=ID``."""
        sid: object = request.query.get("session_id")
        if not sid and request.body_exists:  # read already (router/bodyread.py): it exists
            body = await read_json_object(request, max_bytes=self.manager.config.max_body_bytes, allow_empty=True)
            if isinstance(body, web.Response):
                return body
            sid = body.get("session_id")
        if not isinstance(sid, str) or not sid:
            return error_response(400, "Give the session to finish as ?session_id=ID.", param="session_id")
        session, deferred = self.manager.release_when_idle(sid, how="finish_session")
        answer = {
            "status": "ok",
            "session_id": sid,
            "released": session is not None,
            "deferred": deferred,
            "replica": None if session is None else session.replica,
        }
        return _json(answer)

    async def health(self, _: web.Request) -> web.Response:
        """``GET /health``: 200 while a replica is ready (a full fleet too), 503 with none."""
        replicas = self.manager.table.replicas.values()
        placeable = any(r.accepts_new() for r in replicas)
        ready = sum(r.ready for r in replicas)
        body = {
            "status": "ok" if ready else "unavailable",
            "placeable": placeable,
            "ready_replicas": ready,
            "queued_sessions": self.manager.queue_depth,
        }
        return _json(body, status=200 if ready else 503)

    def _release(self, sid: str, *, how: str) -> web.Response:
        session = self.manager.release(sid, how=how)
        if session is None:
            return error_response(
                404,
                f"Session {sid!r} is not live on this router (never placed, already released, or expired).",
                param="session_id",
            )
        return _json({"session_id": sid, "released": True, "replica": session.replica})
