"""What a hop changes on the way to an engine and back: headers, the replica's name, timeouts.

A request reaches its engine without the hop-by-hop headers (RFC 9110 7.6.1), without what the client
library sets itself, and without the headers the router and its peers own (``X-RolloutPool-*``, fleet
forwarding); an answer comes back without its hop-by-hop headers and with :data:`REPLICA_HEADER`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
from multidict import CIMultiDict

if TYPE_CHECKING:
    from aiohttp import web

    from rolloutpool.router.config import RouterConfig
    from rolloutpool.router.upstream import UpstreamResponse

__all__ = ["REPLICA_HEADER", "ROUTER_HEADER_PREFIX", "forward_headers", "response_headers", "upstream_timeout"]

REPLICA_HEADER = "X-RolloutPool-Replica"
"""Response header naming the replica that served the request."""
ROUTER_HEADER_PREFIX = "x-rolloutpool-"
"""Request headers the router and its peers own (fleet forwarding): never forwarded to an engine."""

# hop-by-hop (RFC 9110 7.6.1) and what the client library sets itself
# (and Accept-Encoding: the engine answers uncompressed, so that the router can read usage)
_REQUEST_SKIP = frozenset(
    (
        "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "expect",
        "trailer", "proxy-connection", "accept-encoding",
    )
)  # fmt: skip
_RESPONSE_SKIP = frozenset(("content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"))


def upstream_timeout(config: RouterConfig) -> aiohttp.ClientTimeout:
    """Timeouts of a request to a replica: connect, then each read (a stream may run long; no total)."""
    return aiohttp.ClientTimeout(
        total=None,
        connect=config.upstream_connect_timeout_s,
        sock_connect=config.upstream_connect_timeout_s,
        sock_read=config.upstream_timeout_s,
    )


def forward_headers(request: web.Request) -> list[tuple[str, str]]:
    """The client's headers an engine receives: none hop-by-hop, none of the router's own."""
    return [
        (k, v)
        for k, v in request.headers.items()
        if k.lower() not in _REQUEST_SKIP and not k.lower().startswith(ROUTER_HEADER_PREFIX)
    ]


def response_headers(upstream: UpstreamResponse, replica: str) -> CIMultiDict[str]:
    """The upstream's response headers without the hop-by-hop ones, plus the replica's name."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.headers:
        if name.lower() not in _RESPONSE_SKIP:
            out.add(name, value)
    out[REPLICA_HEADER] = replica
    return out
