"""Signals of a pool's replicas from Prometheus, over prometheus-api-client (synchronous I/O).

The operator's slow control loop calls :meth:`PrometheusSignals.read` with
``asyncio.to_thread`` every ``autoscaling.intervalSeconds``; the law in
:mod:`rolloutpool.autoscale` turns the answer into caps and quarantine. The queries and
the parsing live in :mod:`rolloutpool.metrics.promql` (pure); this module only sends them.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from rolloutpool.autoscale import ReplicaSignals
from rolloutpool.metrics.promql import QUERY_NAMES, assemble_signals, build_queries

__all__ = ["PrometheusSignals", "PrometheusUnreachable", "redact_url", "scrub"]

_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")]+")
_MAX_DETAIL = 300


class PrometheusUnreachable(RuntimeError):  # noqa: N818 - the agreed name, also the condition's reason
    """Prometheus did not answer a query: down, an HTTP error, a timeout, or not Prometheus.

    The message names the server without credentials and never carries a secret.
    """


def redact_url(url: str) -> str:
    """``url`` fit for a message: scheme, host, port and path; no credentials, query or fragment (pure)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparsable URL>"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}{parts.path}".rstrip("/")


def scrub(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every non-empty secret replaced by ``***`` (pure)."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _detail(err: BaseException, *, timeout: float) -> str:
    """What went wrong, in a few words, without the request URL."""
    if isinstance(err, requests.Timeout):
        return f"did not answer within {timeout:.3g}s"
    if isinstance(err, requests.ConnectionError):
        found = _ERRNO.search(str(err))
        return f"refused the connection or is unreachable ({found.group(0).strip() if found else type(err).__name__})"
    if isinstance(err, PrometheusApiClientException):
        return f"answered with an error: {str(err)[:_MAX_DETAIL]}"
    if isinstance(err, ValueError | KeyError | TypeError):  # requests' JSONDecodeError is also a ValueError
        return f"answered with something that is not a query result ({type(err).__name__})"
    return f"could not be queried ({type(err).__name__})"


class PrometheusSignals:
    """Reads every replica's :class:`ReplicaSignals` of a pool in a fixed number of queries.

    ``url`` may carry ``user:password@`` (sent as basic auth, never shown). One HTTP session
    is kept for the reader's life; :meth:`close` (or ``with``) releases it. A read fails as a
    whole with :class:`PrometheusUnreachable`; ``timeout_seconds`` bounds the whole read.
    Reads from several threads (``asyncio.to_thread`` per pool) take turns on the session.
    """

    def __init__(self, url: str, *, timeout_seconds: float = 5.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"Prometheus URL must be http(s)://host[:port][/path], got {redact_url(url)!r}")
        self.url = redact_url(url)
        """The server, safe to show (no credentials)."""
        self.timeout_seconds = timeout_seconds
        user = unquote(parts.username) if parts.username else ""
        password = unquote(parts.password) if parts.password else ""
        self._secrets = [s for s in (parts.username, parts.password, user, password) if s]
        netloc = parts.netloc.rpartition("@")[2]
        base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        extra: dict[str, Any] = {"auth": (user, password)} if user or password else {}
        # no retries (read=False lets a read timeout surface as one): a failed read is reported at
        # once, and the control loop tries again next interval
        self._client = PrometheusConnect(url=base, retry=Retry(total=0, read=False, raise_on_status=False), **extra)
        self._query: Callable[..., Any] = self._client.custom_query
        self._lock = threading.Lock()

    def close(self) -> None:
        """Release the HTTP session."""
        self._client.close()

    def __enter__(self) -> PrometheusSignals:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def query(self, promql: str, *, timeout_seconds: float | None = None) -> list[Mapping[str, Any]]:
        """One instant query's result vector; :class:`PrometheusUnreachable` if it fails."""
        timeout = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        try:
            result = self._query(promql, timeout=timeout)
            if not isinstance(result, list) or not all(isinstance(s, dict) for s in result):
                raise TypeError("result is not a list of samples")
        except (requests.RequestException, PrometheusApiClientException, ValueError, KeyError, TypeError) as err:
            message = f"Prometheus at {self.url} {_detail(err, timeout=timeout)}"
            raise PrometheusUnreachable(scrub(message, self._secrets)) from None
        return result

    def read(
        self, *, namespace: str, replicas: Sequence[str], window_seconds: float
    ) -> dict[str, ReplicaSignals | None]:
        """Each replica's signals over the last ``window_seconds`` (None: no series at all).

        Sends one query per signal for all replicas (see :func:`build_queries`); raises
        :class:`PrometheusUnreachable` when any of them fails or the read runs out of time.
        """
        if not replicas:
            return {}
        queries = build_queries(namespace=namespace, replicas=replicas, window_seconds=window_seconds)
        with self._lock:
            deadline = time.monotonic() + self.timeout_seconds
            results: dict[str, list[Mapping[str, Any]]] = {}
            for name in QUERY_NAMES:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PrometheusUnreachable(
                        f"Prometheus at {self.url} did not answer every query within {self.timeout_seconds:g}s"
                    )
                results[name] = self.query(queries[name], timeout_seconds=remaining)
        return assemble_signals(results, replicas=replicas)
