"""vllm-router's command-line flags, translated into the router's own settings (pure).

RL frameworks launch vllm-router as a binary (prime-rl: ``--worker-urls ... --policy
sticky_least_loaded --request-id-headers x-session-id --intra-node-data-parallel-size
N``) or through its Python API (SkyRL). ``rolloutpool router`` accepts the same
flags so the launch line only swaps the program name. Every vllm-router flag falls in
one of three groups:

- honoured: translated into a :class:`~rolloutpool.router.config.RouterConfig` field
  (``--worker-urls``, ``--request-id-headers``, ``--request-timeout-secs``,
  ``--max-payload-size``, ``--queue-size``, ``--queue-timeout-secs``,
  ``--kv-aware-session-affinity-ttl-secs``, ``--log-level``, ``--api-key``: clients must send it as a
  bearer token, and the router's own engine calls carry it);
- accepted: nothing changes for us (another router's tuning, e.g. ``--policy``, whose
  place our session-aware placement takes; ``--cache-threshold``; retries and circuit
  breakers, which our readiness and quarantine replace). Each is named once in a log line;
- refused: something we cannot do (prefill/decode disaggregation, ZMQ KV events,
  WASM middleware, ``--intra-node-data-parallel-size`` above 1, ...). The launch stops
  with an error naming the flag and what to do instead.

``--host`` and ``--port`` are ``rolloutpool router``'s own options with the same meaning.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import urlsplit

__all__ = ["ACCEPTED", "REFUSED", "CompatError", "Translation", "replica_name", "translate"]


class CompatError(ValueError):
    """A vllm-router flag we cannot honour, or a malformed one; the message names the flag."""


ACCEPTED: dict[str, str] = {
    "--policy": "session-aware least-loaded placement under KV-derived caps replaces every vllm-router policy",
    "--router-temperature": "a kv_aware knob; our placement has no temperature",
    "--kv-penalty-host": "a kv_aware knob",
    "--kv-penalty-external": "a kv_aware knob",
    "--kv-penalty-disk": "a kv_aware knob",
    "--kv-event-block-size": "block sizes are read from each engine's vllm:cache_config_info",
    "--kv-event-model": "a kv_aware knob",
    "--enable-program-scheduling": "session-aware placement replaces program scheduling",
    "--program-scheduling-config-json": "session-aware placement replaces program scheduling",
    "--cache-threshold": "a cache_aware knob",
    "--balance-abs-threshold": "a cache_aware knob",
    "--balance-rel-threshold": "a cache_aware knob",
    "--eviction-interval-secs": "a cache_aware knob",
    "--max-tree-size": "a cache_aware knob",
    "--worker-startup-timeout-secs": "replicas join placement at their first good scrape",
    "--worker-startup-check-interval": "replicas join placement at their first good scrape",
    "--log-dir": "logs go to standard error",
    "--prometheus-port": "metrics are served at /metrics on the router's own port",
    "--prometheus-host": "metrics are served at /metrics on the router's own port",
    "--max-concurrent-requests": "admission is per session (caps and the queue), not per request",
    "--rate-limit-tokens-per-second": "admission is per session (caps and the queue), not per request",
    "--retry-max-retries": "generation is never retried (a retried turn would run twice on the engine)",
    "--retry-initial-backoff-ms": "generation is never retried",
    "--retry-max-backoff-ms": "generation is never retried",
    "--retry-backoff-multiplier": "generation is never retried",
    "--retry-jitter-factor": "generation is never retried",
    "--disable-retries": "generation is never retried",
    "--cb-failure-threshold": "scrape readiness and quarantine take the circuit breaker's place",
    "--cb-success-threshold": "scrape readiness and quarantine take the circuit breaker's place",
    "--cb-timeout-duration-secs": "scrape readiness and quarantine take the circuit breaker's place",
    "--cb-window-duration-secs": "scrape readiness and quarantine take the circuit breaker's place",
    "--disable-circuit-breaker": "scrape readiness and quarantine take the circuit breaker's place",
    "--health-failure-threshold": "readiness follows the /metrics scrape (--scrape-interval)",
    "--health-success-threshold": "readiness follows the /metrics scrape (--scrape-interval)",
    "--health-check-timeout-secs": "readiness follows the /metrics scrape (--scrape-interval)",
    "--health-check-interval-secs": "readiness follows the /metrics scrape (--scrape-interval)",
    "--health-check-endpoint": "readiness follows the /metrics scrape (--scrape-interval)",
}
"""Flags that change nothing for us, with the reason logged once at start."""

REFUSED: dict[str, str] = {
    "--vllm-pd-disaggregation": "prefill/decode disaggregation is not supported",
    "--prefill": "prefill/decode disaggregation is not supported",
    "--decode": "prefill/decode disaggregation is not supported",
    "--prefill-policy": "prefill/decode disaggregation is not supported",
    "--decode-policy": "prefill/decode disaggregation is not supported",
    "--pd-kv-events": "prefill/decode disaggregation is not supported",
    "--kv-connector": "prefill/decode disaggregation is not supported",
    "--mini-lb": "prefill/decode disaggregation is not supported",
    "--vllm-discovery-address": "prefill/decode disaggregation is not supported",
    "--prefill-selector": "prefill/decode disaggregation is not supported",
    "--decode-selector": "prefill/decode disaggregation is not supported",
    "--kv-event-source": "ZMQ KV events are not consumed; give --worker-urls only",
    "--kv-event-replay-source": "ZMQ KV events are not consumed; give --worker-urls only",
    "--wasm-middleware": "WASM middleware is not supported",
    "--wasm-middleware-sha256": "WASM middleware is not supported",
    "--wasm-middleware-route": "WASM middleware is not supported",
    "--enable-igw": "one router serves one model; run one router per model",
    "--cors-allowed-origins": "the router sends no CORS headers",
    "--service-discovery": "use --discover-namespace and --discover-selector (Kubernetes pods)",
    "--selector": "use --discover-namespace and --discover-selector (Kubernetes pods)",
    "--service-discovery-port": "use --discover-namespace and --discover-selector (Kubernetes pods)",
    "--service-discovery-namespace": "use --discover-namespace and --discover-selector (Kubernetes pods)",
}
"""Flags we cannot honour, with what to do instead (the error names the flag)."""

_SWITCHES = frozenset(
    {
        "--enable-program-scheduling",
        "--disable-retries",
        "--disable-circuit-breaker",
        "--vllm-pd-disaggregation",
        "--mini-lb",
        "--enable-igw",
        "--service-discovery",
    }
)
_MANY = frozenset(
    {"--prefill", "--selector", "--prefill-selector", "--decode-selector", "--cors-allowed-origins"}
    | {"--kv-event-source", "--kv-event-replay-source", "--pd-kv-events", "--wasm-middleware-route"}
)
_POLICIES: tuple[str, ...] = ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two")
_POLICIES += ("consistent_hash", "sticky_least_loaded")
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class Translation:
    """What vllm-router's flags mean for ``rolloutpool router``."""

    worker_urls: tuple[str, ...] = ()
    """``--worker-urls``, in order (replicas named by :func:`replica_name`)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """:class:`~rolloutpool.router.config.RouterConfig` fields set by honoured flags."""
    log_level: str | None = None
    accepted: tuple[tuple[str, str], ...] = ()
    """(flag, reason) of each given flag that changes nothing, to log once."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CompatError(f"vllm-router flags: {message}")


def _parser() -> _Parser:
    parser = _Parser(prog="rolloutpool router", add_help=False, allow_abbrev=False)
    parser.add_argument("--worker-urls", nargs="*", default=None)
    parser.add_argument("--request-id-headers", nargs="*", default=None)
    parser.add_argument("--intra-node-data-parallel-size", type=int, default=None)
    parser.add_argument("--request-timeout-secs", type=float, default=None)
    parser.add_argument("--max-payload-size", type=int, default=None)
    parser.add_argument("--queue-size", type=int, default=None)
    parser.add_argument("--queue-timeout-secs", type=float, default=None)
    parser.add_argument("--kv-aware-session-affinity-ttl-secs", type=float, default=None)
    parser.add_argument("--log-level", choices=_LOG_LEVELS, default=None)
    parser.add_argument("--api-key", default=None)
    for flag in (*ACCEPTED, *REFUSED):
        dest = "x_" + flag.lstrip("-").replace("-", "_")
        if flag == "--policy":
            parser.add_argument(flag, dest=dest, choices=_POLICIES, default=None)
        elif flag in _SWITCHES:
            parser.add_argument(flag, dest=dest, action="store_true", default=None)
        else:
            parser.add_argument(flag, dest=dest, nargs="+" if flag in _MANY else None, default=None)
    return parser


def replica_name(url: str) -> str:
    """The replica name of a worker URL: its ``host:port`` (what vllm-router identifies a worker by)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise CompatError(f"--worker-urls: {url!r} is not an http(s)://host[:port] URL")
    return parts.netloc


def _api_key(given: dict[str, Any]) -> dict[str, str]:
    """``--api-key``: the data port's bearer token (an empty key is refused)."""
    if "api_key" not in given:
        return {}
    if not given["api_key"].strip():
        raise CompatError("--api-key: must not be empty")
    return {"api_key": given["api_key"].strip()}


def translate(args: list[str]) -> Translation:
    """Translate vllm-router flags (the arguments ``rolloutpool router`` did not know itself).

    Pure: returns the translation or raises :class:`CompatError` naming the first
    flag that cannot be honoured, is malformed or is not a vllm-router flag at all.
    """
    if not args:
        return Translation()
    ns, unknown = _parser().parse_known_args(args)
    if unknown:
        raise CompatError(f"{unknown[0]}: not an option of rolloutpool router nor of vllm-router")
    given = {k: v for k, v in vars(ns).items() if v is not None}
    for flag, reason in REFUSED.items():
        if "x_" + flag.lstrip("-").replace("-", "_") in given:
            raise CompatError(f"{flag}: cannot be honoured by rolloutpool router: {reason}")
    overrides: dict[str, Any] = {}
    dp = given.get("intra_node_data_parallel_size")
    if dp is not None and dp != 1:
        raise CompatError(
            f"--intra-node-data-parallel-size {dp}: cannot be honoured by rolloutpool router: it places "
            "sessions on engine URLs, not on data-parallel ranks behind one URL; run vLLM with one API "
            "server per rank (external load balancing) and give each rank's URL to --worker-urls"
        )
    headers = given.get("request_id_headers")
    if headers is not None:
        if len(headers) != 1 or not headers[0].strip():
            raise CompatError(
                f"--request-id-headers: give exactly one header (the session id, matched case-insensitively); "
                f"got {headers}"
            )
        overrides["session_header"] = headers[0].strip()
    overrides.update(_api_key(given))
    urls = tuple(u.strip() for u in given.get("worker_urls", []))
    names = [replica_name(u) for u in urls]
    if len(set(names)) != len(names):
        raise CompatError(f"--worker-urls: the same worker is given twice in {list(urls)}")
    for dest, name, check in (
        ("request_timeout_secs", "upstream_timeout_s", "positive"),
        ("max_payload_size", "max_body_bytes", "positive"),
        ("queue_size", "queue_max", "non-negative"),
        ("queue_timeout_secs", "queue_timeout_s", "positive"),
        ("kv_aware_session_affinity_ttl_secs", "idle_timeout_s", "positive"),
    ):
        if dest in given:
            value = given[dest]
            if value < 0 or (check == "positive" and value == 0):
                raise CompatError(f"--{dest.replace('_', '-')}: must be {check}, got {value}")
            overrides[name] = value
    accepted = tuple(
        (flag, reason) for flag, reason in ACCEPTED.items() if "x_" + flag.lstrip("-").replace("-", "_") in given
    )
    return Translation(worker_urls=urls, overrides=overrides, log_level=given.get("log_level"), accepted=accepted)
