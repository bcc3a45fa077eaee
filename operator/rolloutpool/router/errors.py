"""Error answers in the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from rolloutpool.router.admission import AdmissionError, QueueFullError

if TYPE_CHECKING:
    from rolloutpool.router.config import RouterConfig

__all__ = ["admission_response", "error_body", "error_response"]

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def error_body(status: int, message: str, *, param: str | None = None) -> dict[str, dict[str, object]]:
    """The JSON error object vLLM and OpenAI send (pure)."""
    kind = _TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(
    status: int, message: str, *, param: str | None = None, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A JSON error response."""
    return web.Response(
        text=json.dumps(error_body(status, message, param=param)),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def admission_response(exc: AdmissionError, config: RouterConfig) -> web.Response:
    """429 when the queue is full, 503 when the wait timed out or the router stops; both with Retry-After."""
    status = 429 if isinstance(exc, QueueFullError) else 503
    return error_response(status, str(exc), headers={"Retry-After": str(config.retry_after_s)})
