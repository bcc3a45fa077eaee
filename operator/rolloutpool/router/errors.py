"""Error answers in the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

__all__ = ["error_body", "error_response"]

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
