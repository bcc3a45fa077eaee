"""vLLM's Prometheus metric names, written once: the engine simulator exports them, the router's
scrape, the operator's PromQL and the benchmarks read them (pure).

Names are metric FAMILY names as vLLM V1 (0.32) registers them. A counter's samples carry the
``_total`` suffix (:func:`total`), a histogram's ``_bucket``/``_sum``/``_count`` (:func:`count`).
Older releases used other names for some signals; the ``*_SAMPLES`` tuples list a signal's sample
name in each release, newest first.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CACHE_CONFIG_INFO",
    "E2E_REQUEST_LATENCY",
    "ENGINE_FAMILIES",
    "GENERATION_TOKENS",
    "GPU_CACHE_USAGE",
    "INTER_TOKEN_LATENCY",
    "INTER_TOKEN_LATENCY_SAMPLES",
    "KV_CACHE_USAGE",
    "NUM_PREEMPTIONS",
    "NUM_PREEMPTIONS_SAMPLES",
    "NUM_REQUESTS_RUNNING",
    "NUM_REQUESTS_WAITING",
    "NUM_REQUESTS_WAITING_BY_REASON",
    "PREFIX",
    "PREFIX_CACHE_HITS",
    "PREFIX_CACHE_HITS_SAMPLES",
    "PREFIX_CACHE_QUERIES",
    "PREFIX_CACHE_QUERIES_SAMPLES",
    "PROMPT_TOKENS",
    "PROMPT_TOKENS_CACHED",
    "REQUEST_NUM_PREEMPTIONS",
    "REQUEST_SUCCESS",
    "RL_WEIGHT_UPDATE_DURATION",
    "RL_WEIGHT_UPDATE_IN_FLIGHT",
    "RL_WEIGHT_UPDATE_OPS_COUNT",
    "TIME_PER_OUTPUT_TOKEN",
    "TIME_TO_FIRST_TOKEN",
    "count",
    "histogram_sum",
    "total",
]

PREFIX: Final = "vllm:"
"""Every vLLM metric name starts with this."""

# gauges
NUM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
NUM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
"""Includes preempted requests."""
NUM_REQUESTS_WAITING_BY_REASON: Final = "vllm:num_requests_waiting_by_reason"
KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
"""0..1; idle cached prefixes count as free."""
GPU_CACHE_USAGE: Final = "vllm:gpu_cache_usage_perc"
"""The older name of :data:`KV_CACHE_USAGE`."""
CACHE_CONFIG_INFO: Final = "vllm:cache_config_info"
"""A gauge fixed at 1 whose labels carry ``block_size``, ``num_gpu_blocks``, ``enable_prefix_caching``..."""

# counters (samples: ``total(name)``)
PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits"
NUM_PREEMPTIONS: Final = "vllm:num_preemptions"
PROMPT_TOKENS: Final = "vllm:prompt_tokens"
PROMPT_TOKENS_CACHED: Final = "vllm:prompt_tokens_cached"
GENERATION_TOKENS: Final = "vllm:generation_tokens"
REQUEST_SUCCESS: Final = "vllm:request_success"
"""By ``finished_reason``."""

# histograms
TIME_TO_FIRST_TOKEN: Final = "vllm:time_to_first_token_seconds"  # noqa: S105 - a metric name
INTER_TOKEN_LATENCY: Final = "vllm:inter_token_latency_seconds"  # noqa: S105 - a metric name
E2E_REQUEST_LATENCY: Final = "vllm:e2e_request_latency_seconds"
REQUEST_NUM_PREEMPTIONS: Final = "vllm:request_num_preemptions"
RL_WEIGHT_UPDATE_DURATION: Final = "vllm:rl_weight_update_operation_duration_seconds"
"""RL weight-sync operations, by ``operation`` (a histogram, seconds)."""
RL_WEIGHT_UPDATE_IN_FLIGHT: Final = "vllm:rl_weight_update_operations_in_flight"
"""RL weight-sync operations in flight, by ``operation`` (a gauge)."""


def total(counter: str) -> str:
    """The sample name of counter family ``counter`` (pure)."""
    return f"{counter}_total"


def count(histogram: str) -> str:
    """The sample name of the observation count of histogram family ``histogram`` (pure)."""
    return f"{histogram}_count"


def histogram_sum(histogram: str) -> str:
    """The sample name of the observations' sum of histogram family ``histogram`` (pure)."""
    return f"{histogram}_sum"


TIME_PER_OUTPUT_TOKEN: Final = "vllm:time_per_output_token_seconds"  # noqa: S105 - a metric name
"""Older releases' name of the inter-token latency histogram."""
INTER_TOKEN_LATENCY_SAMPLES: Final = (
    (histogram_sum(INTER_TOKEN_LATENCY), count(INTER_TOKEN_LATENCY)),
    (histogram_sum(TIME_PER_OUTPUT_TOKEN), count(TIME_PER_OUTPUT_TOKEN)),
)
"""The inter-token latency histogram's ``(sum, count)`` samples under each name, newest first (read by the router's
scrape: the engines' token-weighted mean step)."""

RL_WEIGHT_UPDATE_OPS_COUNT: Final = count(RL_WEIGHT_UPDATE_DURATION)
"""How many RL weight-sync operations ran, by ``operation`` (read by the router's scrape and the law)."""

PREFIX_CACHE_HITS_SAMPLES: Final = (
    total(PREFIX_CACHE_HITS),
    "vllm:gpu_prefix_cache_hits_total",  # older V1 releases
    PREFIX_CACHE_HITS,  # counters exposed without the _total suffix
    "vllm:gpu_prefix_cache_hits",
)
"""The prefix-cache hit counter's sample under each name vLLM releases exported, newest first."""
PREFIX_CACHE_QUERIES_SAMPLES: Final = (
    total(PREFIX_CACHE_QUERIES),
    "vllm:gpu_prefix_cache_queries_total",
    PREFIX_CACHE_QUERIES,
    "vllm:gpu_prefix_cache_queries",
)
"""The prefix-cache query counter's sample under each name, newest first."""
NUM_PREEMPTIONS_SAMPLES: Final = (total(NUM_PREEMPTIONS), NUM_PREEMPTIONS)
"""The preemption counter's sample with and without the ``_total`` suffix, newest first."""

ENGINE_FAMILIES: Final = (
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    KV_CACHE_USAGE,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    NUM_PREEMPTIONS,
    PROMPT_TOKENS,
    PROMPT_TOKENS_CACHED,
    GENERATION_TOKENS,
    REQUEST_SUCCESS,
    TIME_TO_FIRST_TOKEN,
    E2E_REQUEST_LATENCY,
    INTER_TOKEN_LATENCY,
    REQUEST_NUM_PREEMPTIONS,
    NUM_REQUESTS_WAITING_BY_REASON,
    CACHE_CONFIG_INFO,
)
"""Families the router (``router/scrape.py``), the operator (``metrics/promql.py``) or the dashboards read."""
