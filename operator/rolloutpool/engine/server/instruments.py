"""Prometheus metrics of the engine simulator in vLLM V1's names, types and labels.

Each server gets its own :class:`prometheus_client.CollectorRegistry` (never the
global one, so several simulators live in one process). Gauges and counters are read
from the engine at scrape time by a custom collector; histograms and the
``request_success`` counter are fed by the server as requests finish. Counters expose
``*_created`` samples exactly as ``prometheus_client`` counters do. Every time is in
SIMULATED seconds (DESIGN section 5 lists the names this module copies).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rolloutpool.api import vllm_metrics as vm
from rolloutpool.engine.model.core import Engine

__all__ = [
    "E2E_BUCKETS",
    "FINISH_REASONS",
    "ITL_BUCKETS",
    "LAG_SECONDS",
    "PREEMPTION_BUCKETS",
    "TTFT_BUCKETS",
    "CacheConfigInfo",
    "EngineMetrics",
]

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
FINISH_REASONS = ("stop", "length", "abort", "error")
"""``finished_reason`` label values of ``vllm:request_success_total`` (vLLM's FinishReason)."""
LAG_SECONDS = "rolloutpool_engine_lag_seconds"
"""Counter (engine-sim only): simulated seconds lost because the process fell behind its time scale."""

_LABELS = ("model_name", "engine")


class CacheConfigInfo:
    """Labels of ``vllm:cache_config_info`` (a gauge fixed at 1, without ``model_name``)."""

    def __init__(
        self,
        *,
        block_size: int,
        num_gpu_blocks: int,
        max_model_len: int,
        gpu_memory_utilization: float,
        override: bool,
        enable_prefix_caching: bool = True,
    ) -> None:
        size_tokens = num_gpu_blocks * block_size
        self.labels: dict[str, str] = {
            "block_size": str(block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(enable_prefix_caching),
            "engine": "0",
            "gpu_memory_utilization": str(gpu_memory_utilization),
            "kv_cache_max_concurrency": str(round(size_tokens / max_model_len, 2)),
            "kv_cache_size_tokens": str(size_tokens),
            "num_gpu_blocks": str(num_gpu_blocks),
            "num_gpu_blocks_override": str(num_gpu_blocks) if override else "None",
        }


class _EngineCollector(Collector):
    """Gauges and counters read from the engine at scrape time."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterable[Metric]:
        m = self._m
        engine, labels, created = m.engine, m.label_values, m.created
        waiting = float(len(engine.waiting))
        yield _gauge(
            vm.NUM_REQUESTS_RUNNING,
            "Number of requests in model execution batches.",
            labels,
            float(len(engine.running)),
        )
        yield _gauge(vm.NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.", labels, waiting)
        by_reason = GaugeMetricFamily(
            vm.NUM_REQUESTS_WAITING_BY_REASON,
            "Number of requests waiting to be processed, by the reason they wait.",
            labels=[*_LABELS, "reason"],
        )
        by_reason.add_metric([*labels, "capacity"], waiting)
        by_reason.add_metric([*labels, "deferred"], 0.0)
        yield by_reason
        usage = engine.pool.usage
        yield _gauge(vm.KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.", labels, usage)
        yield _gauge(vm.GPU_CACHE_USAGE, "GPU KV-cache usage (older name). 1 means 100 percent usage.", labels, usage)
        c = engine.counters
        counters = (
            (
                vm.PREFIX_CACHE_QUERIES,
                "Prefix cache queries, in terms of number of queried tokens.",
                c.prefix_queries,
            ),
            (vm.PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens.", c.prefix_hits),
            (vm.NUM_PREEMPTIONS, "Cumulative number of preemption from the engine.", c.preemptions),
            (vm.PROMPT_TOKENS, "Number of prefill tokens processed.", c.prompt_tokens),
            (
                vm.PROMPT_TOKENS_CACHED,
                "Number of cached prompt tokens (local + external).",
                c.prompt_tokens_cached,
            ),
            (vm.GENERATION_TOKENS, "Number of generation tokens processed.", c.generation_tokens),
        )
        for name, doc, value in counters:
            family = CounterMetricFamily(name, doc, labels=_LABELS)
            family.add_metric(labels, float(value), created=created)
            yield family
        success = CounterMetricFamily(
            vm.REQUEST_SUCCESS, "Count of successfully processed requests.", labels=[*_LABELS, "finished_reason"]
        )
        for reason in FINISH_REASONS:
            success.add_metric([*labels, reason], float(m.finished[reason]), created=created)
        yield success
        lag = CounterMetricFamily(
            LAG_SECONDS,
            "Simulated seconds lost behind the time scale (Python slower than the wall target; engine-sim only).",
            labels=_LABELS,
        )
        lag.add_metric(labels, m.lag_seconds, created=created)
        yield lag
        info = GaugeMetricFamily(
            vm.CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig", labels=list(m.cache_info.labels)
        )
        info.add_metric(list(m.cache_info.labels.values()), 1.0)
        yield info


def _gauge(name: str, doc: str, labels: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=_LABELS)
    family.add_metric(labels, value)
    return family


class EngineMetrics:
    """The registry of one simulator: scrape-time engine state plus request histograms."""

    def __init__(self, engine: Engine, *, model_name: str, cache_info: CacheConfigInfo) -> None:
        self.engine = engine
        self.cache_info = cache_info
        self.label_values = [model_name, "0"]
        self.created = time.time()
        self.finished: dict[str, int] = dict.fromkeys(FINISH_REASONS, 0)
        self.lag_seconds = 0.0
        """Simulated seconds lost behind the wall target (the runner re-anchors instead of catching up)."""
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(self))

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            metric = Histogram(name, doc, labelnames=_LABELS, buckets=buckets, registry=self.registry)
            return metric.labels(*self.label_values)

        self.ttft = histogram(vm.TIME_TO_FIRST_TOKEN, "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram(vm.INTER_TOKEN_LATENCY, "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = histogram(vm.E2E_REQUEST_LATENCY, "Histogram of e2e request latency in seconds.", E2E_BUCKETS)
        self.preemptions = histogram(
            vm.REQUEST_NUM_PREEMPTIONS, "Number of preemptions per finished request.", PREEMPTION_BUCKETS
        )

    def observe_itl(self, seconds: float, count: int) -> None:
        """``count`` inter-token gaps of ``seconds`` each (one decode run)."""
        for _ in range(count):
            self.itl.observe(seconds)

    def record_finished(self, *, reason: str, e2e_seconds: float, preemptions: int) -> None:
        """A request ended with ``reason`` (one of :data:`FINISH_REASONS`)."""
        self.finished[reason] += 1
        self.e2e.observe(e2e_seconds)
        self.preemptions.observe(preemptions)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
