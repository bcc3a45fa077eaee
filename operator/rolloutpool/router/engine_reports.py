"""What a replica's engine does not report, surfaced once: no ``cached_tokens``, prefix caching off.

Both blind the re-prefill signal (see :mod:`rolloutpool.routing.reprefill`): the router
logs one warning per replica, counts the responses without ``cached_tokens``
(``rolloutpool_router_responses_without_cached_tokens_total``), sets
``rolloutpool_router_replica_engine_warning{replica, warning}`` to 1 (``NoCachedTokens``,
``PrefixCachingOff``) for the operator's status, and shows both in the admin API's
signals.
"""

from __future__ import annotations

import logging

from rolloutpool.router.instruments import RouterMetrics
from rolloutpool.routing.reprefill import CachedTokensWatch

__all__ = ["NO_CACHED_TOKENS", "PREFIX_CACHING_OFF", "observe_cached_report", "observe_prefix_caching"]

_log = logging.getLogger(__name__)

NO_CACHED_TOKENS = "NoCachedTokens"
PREFIX_CACHING_OFF = "PrefixCachingOff"


def observe_cached_report(
    metrics: RouterMetrics, watch: CachedTokensWatch, *, replica: str, cached_tokens: int | None
) -> None:
    """One response's ``cached_tokens`` (None: not reported)."""
    first = watch.observe(cached_tokens=cached_tokens)
    if cached_tokens is None:
        metrics.missing_cached_tokens.labels(replica).inc()
    if first:
        _log.warning(
            "Observed no cached_tokens replica=%s: re-prefill cannot be detected there "
            "(start vLLM with --enable-prompt-tokens-details)",
            replica,
        )
    metrics.engine_warnings.labels(replica, NO_CACHED_TOKENS).set(1.0 if watch.never_reports else 0.0)


def observe_prefix_caching(metrics: RouterMetrics, *, replica: str, before: bool | None, now: bool | None) -> None:
    """A scrape's ``enable_prefix_caching`` label; logs when it turns off."""
    if now is False and before is not False:
        _log.warning(
            "Observed prefix caching off replica=%s: its cache misses never quarantine it, and it caches no prefix",
            replica,
        )
    metrics.engine_warnings.labels(replica, PREFIX_CACHING_OFF).set(1.0 if now is False else 0.0)
