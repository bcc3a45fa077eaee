"""The admin API, behind a bearer token: replica state and draining.

- ``GET /admin/replicas``: per replica its URL, live sessions, cap, working-set target, held turns and kept
  sessions, quarantine and reason, readiness, draining, in-flight requests and the last scraped signals.
- ``POST /admin/replicas/{name}/drain`` (``?undo=true`` to undo): no new sessions,
  existing ones stay until released.
- ``PUT /admin/limits``: the operator's caps and quarantine without Kubernetes. The body is a
  RolloutPool ``status`` (``{"replicaStatus": [{"name", "index", "target", "quarantined", "reason"}]}``),
  applied as a whole exactly as the router applies the pool's status when it watches the pool
  (``--pool``): what the benchmark's in-process control loop writes. A body that does not parse
  is a 400 and changes nothing.
- ``/admin/rl/{call}`` (any method; ``call`` one of vLLM's engine control calls,
  :data:`~rolloutpool.routing.paths.CONTROL_PATHS`: ``pause``, ``resume``, ``update_weights``,
  ``update_weight_version``, ``reset_prefix_cache``, ``sleep``, ``collective_rpc``,
  ``v1/load_lora_adapter``, ...): one URL for the fleet's weight-sync and engine control calls, the only
  way to reach them (the data port refuses them). The call, its query (``mode``, ``clear_cache``, ...)
  and its body go to every ready replica in parallel, each with its own timeout
  (``?timeout_s=``, default :data:`FAN_OUT_TIMEOUT_S`; the router keeps that parameter).
  The answer lists every replica: ``status`` (the engine's HTTP status, or null),
  ``ok`` (a 2xx), ``error`` (``timeout``, ``unreachable: ...``), ``elapsed_s`` and
  the engine's ``body``. Its status: 200 when every replica answered 2xx, 207 when
  some did and some did not (partial failure: retry the failed ones), 502 when none
  did, 503 when no replica is ready. Unready replicas are listed in ``skipped``. A
  flushing call that succeeded on a replica tells the router of the flush, so the
  re-prefill that follows is not taken for eviction (:mod:`rolloutpool.routing.weights`).

Without ``admin_token`` configured the admin API is disabled (403). The token is
compared in constant time and never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from rolloutpool.api.status import RolloutPoolStatus
from rolloutpool.router.errors import error_response
from rolloutpool.router.sessions import SessionManager
from rolloutpool.routing.discovery import operator_limits
from rolloutpool.routing.paths import CONTROL_PATHS, control_call
from rolloutpool.routing.weights import call_flushes

__all__ = ["FAN_OUT_TIMEOUT_S", "AdminAPI", "fan_out_status"]

_log = logging.getLogger(__name__)

FAN_OUT_TIMEOUT_S = 300.0
"""Default per-replica timeout of a fanned-out weight-sync call (a real weight load takes minutes)."""


def fan_out_status(*, ok: int, failed: int) -> int:
    """HTTP status of a fan-out answer (pure): 200 all ok, 207 partial, 502 none ok, 503 nobody to ask."""
    if ok + failed == 0:
        return 503
    if failed == 0:
        return 200
    return 207 if ok else 502


class AdminAPI:
    """Handlers of ``/admin``."""

    def __init__(
        self,
        manager: SessionManager,
        token: str | None,
        *,
        client: Callable[[], aiohttp.ClientSession] | None = None,
        engine_key: str | None = None,
    ) -> None:
        self.manager = manager
        self._token = token
        self._engine_key = engine_key
        """The data port's API key, sent to the engines as a bearer token (engines run with the same key)."""
        self._client = client
        """The upstream HTTP client (the proxy's), for the fan-out."""

    def _denied(self, request: web.Request) -> web.Response | None:
        if not self._token:  # None or empty: disabled (an empty token would match "Bearer ")
            return error_response(403, "The admin API is disabled: the router has no admin token configured.")
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token.encode()):
            return error_response(
                401, "A valid admin bearer token is required.", headers={"WWW-Authenticate": "Bearer"}
            )
        return None

    async def replicas(self, request: web.Request) -> web.Response:
        """``GET /admin/replicas``."""
        if (denied := self._denied(request)) is not None:
            return denied
        rows = []
        work = self.manager.ledger.work
        for replica in self.manager.table.replicas.values():
            runtime = self.manager.runtime[replica.name]
            scheduled = work if work is not None and replica.name in work.replicas else None
            rows.append(
                {
                    "name": replica.name,
                    "url": runtime.spec.url,
                    "live_sessions": replica.live,
                    "cap": replica.cap,
                    "target": scheduled.target_of(replica.name) if scheduled else None,
                    "held_turns": scheduled.held(replica.name) if scheduled else 0,
                    "kept_sessions": len(scheduled.replicas[replica.name].idle) if scheduled else 0,
                    "quarantined": replica.quarantined,
                    "quarantine_reason": None if runtime.limits.pressure is None else runtime.limits.pressure.reason,
                    "ready": replica.ready,
                    "unready_reason": runtime.unready_reason,
                    "draining": replica.draining,
                    "inflight": replica.inflight,
                    "capacity_tokens": runtime.capacity_tokens,
                    "block_size": runtime.block_size,
                    "last_scrape": runtime.last_scrape,
                    "scrape_failures": runtime.scrape_failures,
                    "signals": runtime.signals,
                }
            )
        body = {"replicas": rows, "sessions": len(self.manager.table.sessions), "queue_depth": self.manager.queue_depth}
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def drain(self, request: web.Request) -> web.Response:
        """``POST /admin/replicas/{name}/drain``."""
        if (denied := self._denied(request)) is not None:
            return denied
        name = request.match_info["name"]
        if name not in self.manager.table.replicas:
            return error_response(404, f"Replica {name!r} is not known to this router.", param="name")
        draining = request.query.get("undo", "").lower() not in {"1", "true", "yes"}
        self.manager.set_draining(name, draining)
        replica = self.manager.replica(name)
        body = {"name": name, "draining": replica.draining, "live_sessions": replica.live}
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def limits(self, request: web.Request) -> web.Response:
        """``PUT /admin/limits``: the operator's per-replica caps and quarantine, from a pool status document."""
        if (denied := self._denied(request)) is not None:
            return denied
        try:
            document = json.loads(await request.read())
            RolloutPoolStatus.model_validate(document)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return error_response(400, "The body must be a JSON RolloutPool status.")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "body"
            return error_response(400, f"Not a RolloutPool status: {where}: {first['msg']}.", param=where)
        limits = operator_limits({"status": document})
        unknown = sorted(set(limits) - set(self.manager.table.replicas))
        self.manager.set_operator_limits(limits)
        body = {"applied": len(limits), "unknown": unknown}
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def fan_out(self, request: web.Request) -> web.Response:
        """``/admin/rl/{call}``: one weight-sync call to every ready replica, answered per replica."""
        if (denied := self._denied(request)) is not None:
            return denied
        call = request.match_info["call"].strip("/")
        if control_call(call) is None:
            known = ", ".join(sorted(p.lstrip("/") for p in CONTROL_PATHS))
            return error_response(404, f"Unknown engine control call {call!r}; known: {known}.", param="call")
        query = {k: v for k, v in request.query.items() if k != "timeout_s"}
        try:
            timeout_s = float(request.query.get("timeout_s", FAN_OUT_TIMEOUT_S))
            if not 0 < timeout_s < math.inf:
                raise ValueError
        except ValueError:
            return error_response(400, "`timeout_s` must be a positive, finite number of seconds.", param="timeout_s")
        if self._client is None:  # pragma: no cover - wired by the application
            return error_response(503, "The fan-out has no upstream client.")
        body = await request.read() if request.body_exists else b""  # read already, from memory
        ready = [r.name for r in self.manager.table.replicas.values() if r.ready]
        skipped = sorted(r.name for r in self.manager.table.replicas.values() if not r.ready)
        client = self._client()
        started = time.perf_counter()
        rows = await asyncio.gather(
            *(
                self._call_one(
                    client, name, method=request.method, call=call, query=query, body=body, timeout_s=timeout_s
                )
                for name in ready
            )
        )
        ok = sum(1 for row in rows if row["ok"])
        if call_flushes(call, query):
            for row in rows:
                if row["ok"]:
                    self.manager.weights.flushed(row["name"], now=self.manager.clock())
        status = fan_out_status(ok=ok, failed=len(rows) - ok)
        _log.info(
            "Fanned out weight-sync call call=%s query=%s ok=%d failed=%d skipped=%d elapsed_s=%.3f",
            call,
            query,
            ok,
            len(rows) - ok,
            len(skipped),
            time.perf_counter() - started,
        )
        answer = {"call": call, "query": query, "ok": ok, "failed": len(rows) - ok, "replicas": rows}
        answer["skipped"] = skipped
        return web.Response(text=json.dumps(answer), status=status, content_type="application/json")

    async def _call_one(
        self,
        client: aiohttp.ClientSession,
        name: str,
        *,
        method: str,
        call: str,
        query: dict[str, str],
        body: bytes,
        timeout_s: float,
    ) -> dict[str, Any]:
        runtime = self.manager.runtime.get(name)
        row: dict[str, Any] = {"name": name, "url": None, "status": None, "ok": False, "error": None, "body": None}
        if runtime is None:
            row["error"] = "removed"
            return row
        row["url"] = runtime.spec.url
        started = time.perf_counter()
        headers = {"Content-Type": "application/json"} if body else {}
        if self._engine_key is not None:
            headers["Authorization"] = f"Bearer {self._engine_key}"
        try:
            async with client.request(
                method,
                f"{runtime.spec.url}/{call}",
                params=query,
                data=body or None,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                raw = await resp.read()
                row["status"] = resp.status
                row["ok"] = 200 <= resp.status < 300
                try:
                    row["body"] = json.loads(raw) if raw else None
                except (UnicodeDecodeError, json.JSONDecodeError):
                    row["body"] = raw.decode(errors="replace")[:2000]
        except TimeoutError:
            row["error"] = f"timeout after {timeout_s:g} s"
        except aiohttp.ClientError as exc:
            row["error"] = f"unreachable: {type(exc).__name__}"
        row["elapsed_s"] = round(time.perf_counter() - started, 3)
        if not row["ok"]:
            _log.warning(
                "Failed weight-sync call replica=%s call=%s status=%s error=%s", name, call, row["status"], row["error"]
            )
        return row
