"""When a returning session's ``cached_tokens`` shortfall counts as re-prefill (pure).

The rule, measured on a real vLLM 0.32 (DESIGN section 5):

- **Up to one block short is not re-prefill.** With text prompts and chat, the next
  turn re-tokenizes the previous answer, which can differ from the sampled ids near
  the end, so vLLM reports one block fewer cached on a few percent of turns with
  nothing evicted. A shortfall of at most ``block_size`` tokens is that tolerance;
  anything beyond is counted in full. (Token-id prompts match exactly; eviction of a
  live session's prefix almost always costs more than one block.)
- **An engine with prefix caching off never re-prefills** in this sense: it caches
  nothing, so every returning turn misses, and that is no sign of KV pressure
  (``vllm:cache_config_info{enable_prefix_caching="False"}``). Such an engine is never
  quarantined for misses; the router reports it instead.
- **An engine that never reports** ``cached_tokens`` (started without
  ``--enable-prompt-tokens-details``: ``usage.prompt_tokens_details`` is null) gives
  no signal at all: the router warns once, counts it and reports it, see
  :class:`CachedTokensWatch`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CachedTokensWatch", "reprefill_tokens", "tolerated_shortfall"]


def tolerated_shortfall(*, block_size: int) -> int:
    """Cached tokens a returning turn may lack with nothing evicted: one block (pure)."""
    return max(0, block_size)


def reprefill_tokens(*, expected_cached: int, cached: int, block_size: int, prefix_caching: bool | None) -> int:
    """Tokens of a returning turn that count as re-prefilled (evicted), by the rule above (pure).

    ``prefix_caching`` is the engine's ``enable_prefix_caching`` label (None: not reported yet,
    taken as on, vLLM's default).
    """
    if prefix_caching is False:
        return 0
    shortfall = expected_cached - cached
    if shortfall <= tolerated_shortfall(block_size=block_size):
        return 0
    return shortfall


@dataclass
class CachedTokensWatch:
    """Whether one replica reports ``cached_tokens`` (pure state, fed with each response's usage)."""

    reported: int = 0
    """Responses that carried ``prompt_tokens_details.cached_tokens``."""
    missing: int = 0
    """Responses whose ``prompt_tokens_details`` was null or lacked ``cached_tokens``."""
    warned: bool = False

    def observe(self, *, cached_tokens: int | None) -> bool:
        """Count one response; True exactly once: the first time a replica that never reported is seen missing."""
        if cached_tokens is not None:
            self.reported += 1
            return False
        self.missing += 1
        if self.reported or self.warned:
            return False
        self.warned = True
        return True

    @property
    def never_reports(self) -> bool:
        """Responses seen, none with ``cached_tokens``: re-prefill cannot be detected on this replica."""
        return self.missing > 0 and self.reported == 0
