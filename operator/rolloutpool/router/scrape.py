"""The fast control loop: scrape every replica's ``/metrics`` about once a second.

Each scrape feeds the replica's quarantine state (preemptions, waiting queue),
refreshes its KV capacity and block size (``vllm:cache_config_info``, for derived
caps and for the expected cached tokens of returning sessions), and decides
readiness: ``unready_after_failures`` failed scrapes in a row mark it not ready,
one good scrape makes it ready again. The replicas that answer in one round are marked ready
together, after the round, so sessions queued while they were down are spread over all of them.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from rolloutpool.api import vllm_metrics as vm
from rolloutpool.router.engine_reports import observe_prefix_caching
from rolloutpool.router.sessions import SessionManager
from rolloutpool.routing.weights import flush_operations_total

__all__ = ["ScrapedSignals", "Scraper", "parse_signals", "scrape_timeout"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScrapedSignals:
    """KV-pressure signals of one scrape (summed over a replica's engines)."""

    waiting: float = 0.0
    running: float = 0.0
    preemptions_total: float = 0.0
    kv_cache_usage: float | None = None
    prefix_cache_queries_total: float = 0.0
    prefix_cache_hits_total: float = 0.0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    prefix_caching: bool | None = None
    """``enable_prefix_caching`` of ``vllm:cache_config_info`` (None: not reported)."""

    @property
    def capacity_tokens(self) -> int | None:
        """KV capacity in tokens (``num_gpu_blocks * block_size``), when reported."""
        if self.block_size is None or self.num_gpu_blocks is None:
            return None
        return self.num_gpu_blocks * self.block_size

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON-friendly view (admin API)."""
        return {
            "waiting": self.waiting,
            "running": self.running,
            "preemptions_total": self.preemptions_total,
            "kv_cache_usage": self.kv_cache_usage,
            "prefix_cache_queries_total": self.prefix_cache_queries_total,
            "prefix_cache_hits_total": self.prefix_cache_hits_total,
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "capacity_tokens": self.capacity_tokens,
            "prefix_caching": None if self.prefix_caching is None else float(self.prefix_caching),
        }


_SUMMED = {
    vm.NUM_REQUESTS_WAITING: "waiting",
    vm.NUM_REQUESTS_RUNNING: "running",
    vm.NUM_PREEMPTIONS_SAMPLES[0]: "preemptions_total",
    vm.PREFIX_CACHE_QUERIES_SAMPLES[0]: "prefix_cache_queries_total",
    vm.PREFIX_CACHE_HITS_SAMPLES[0]: "prefix_cache_hits_total",
}
_LEGACY = {
    # older vLLM releases: the V1 engine's first names, and counters exposed without ``_total``
    **dict.fromkeys(vm.PREFIX_CACHE_QUERIES_SAMPLES[1:], "prefix_cache_queries_total"),
    **dict.fromkeys(vm.PREFIX_CACHE_HITS_SAMPLES[1:], "prefix_cache_hits_total"),
    **dict.fromkeys(vm.NUM_PREEMPTIONS_SAMPLES[1:], "preemptions_total"),
}
"""Read only when the current name of the same signal is absent from the scrape."""


def _int_label(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


_WANTED = frozenset((*_SUMMED, *_LEGACY, vm.KV_CACHE_USAGE, vm.GPU_CACHE_USAGE, vm.CACHE_CONFIG_INFO))


def scrape_timeout(*, interval_s: float, configured_s: float) -> float:
    """A scrape's timeout: the configured one, but never under three intervals (pure).

    A real vLLM on a saturated host answered ``/metrics`` in 2.4 s; rounds never overlap,
    so a slow engine only stretches its round instead of failing it.
    """
    return max(configured_s, 3.0 * interval_s)


def _flag_label(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.strip().lower() in ("true", "1")


def _wanted_lines(text: str) -> str:
    """Only the samples we read: a real engine exposes hundreds of histogram buckets, parsing them all is slow."""
    keep = []
    for line in text.splitlines():
        if line.startswith(vm.PREFIX):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in _WANTED:
                keep.append(line)
    return "\n".join(keep) + "\n"


def parse_signals(text: str) -> ScrapedSignals:
    """The signals in a vLLM ``/metrics`` text (pure). Raises ``ValueError`` on unparsable text."""
    text = _wanted_lines(text)
    sums = dict.fromkeys(_SUMMED.values(), 0.0)
    seen: set[str] = set()
    legacy = dict.fromkeys(_SUMMED.values(), 0.0)
    legacy_seen: set[str] = set()
    usage: float | None = None
    legacy_usage: float | None = None
    block_size = num_blocks = None
    prefix_caching: bool | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, value = sample.name, sample.value
            if math.isnan(value):
                continue
            if name in _SUMMED:
                sums[_SUMMED[name]] += value
                seen.add(_SUMMED[name])
            elif name in _LEGACY:
                legacy[_LEGACY[name]] += value
                legacy_seen.add(_LEGACY[name])
            elif name == vm.KV_CACHE_USAGE:
                usage = value if usage is None else max(usage, value)
            elif name == vm.GPU_CACHE_USAGE:
                legacy_usage = value if legacy_usage is None else max(legacy_usage, value)
            elif name == vm.CACHE_CONFIG_INFO:
                block_size = _int_label(sample.labels.get("block_size"))
                blocks = _int_label(sample.labels.get("num_gpu_blocks"))
                if blocks is not None:
                    num_blocks = blocks + (num_blocks or 0)
                flag = _flag_label(sample.labels.get("enable_prefix_caching"))
                prefix_caching = flag if prefix_caching is None else (prefix_caching or bool(flag))
    for key, value in legacy.items():
        if key not in seen:
            sums[key] = value
    return ScrapedSignals(
        kv_cache_usage=usage if usage is not None else legacy_usage,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        prefix_caching=prefix_caching,
        **sums,
    )


class Scraper:
    """Scrapes all replicas concurrently and applies what it sees to the session manager."""

    def __init__(self, manager: SessionManager, client: aiohttp.ClientSession) -> None:
        self.manager = manager
        self.client = client
        self.config = manager.config

    async def scrape_all(self) -> None:
        """One round over every replica."""
        names = list(self.manager.runtime)
        answered = await asyncio.gather(*(self.scrape(name) for name in names))
        # replicas back in this round become ready together, so the queue is spread over all of them
        self.manager.set_ready_together([name for name, ok in zip(names, answered, strict=True) if ok])
        self.manager.tick()

    async def scrape(self, name: str) -> bool:
        """Scrape one replica and apply the result; whether it answered (the caller marks it ready)."""
        runtime = self.manager.runtime.get(name)
        if runtime is None:
            return False
        timeout = aiohttp.ClientTimeout(
            total=scrape_timeout(interval_s=self.config.scrape_interval_s, configured_s=self.config.scrape_timeout_s)
        )
        try:
            async with self.client.get(f"{runtime.spec.url}/metrics", timeout=timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"status {resp.status}")
                text = await resp.text()
                signals = parse_signals(text)
        except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError) as exc:
            if self.manager.runtime.get(name) is not runtime:
                return False  # removed (or replaced) while we scraped
            runtime.scrape_failures += 1
            self.manager.metrics.scrape_failures.labels(name).inc()
            if runtime.scrape_failures == self.config.unready_after_failures:
                _log.warning(
                    "Failed to scrape replica=%s failures=%d error=%s",
                    name,
                    runtime.scrape_failures,
                    type(exc).__name__,
                )
            if runtime.scrape_failures >= self.config.unready_after_failures:
                self.manager.set_ready(name, False, reason="ScrapeFailed")
            return False
        if self.manager.runtime.get(name) is not runtime:
            return False
        runtime.scrape_failures = 0
        runtime.last_scrape = self.manager.clock()
        runtime.signals = {k: v for k, v in signals.as_dict().items() if v is not None}
        observe_prefix_caching(
            self.manager.metrics, replica=name, before=runtime.prefix_caching, now=signals.prefix_caching
        )
        runtime.prefix_caching = signals.prefix_caching
        runtime.signals["reports_cached_tokens"] = 0.0 if runtime.cached_watch.never_reports else 1.0
        self.manager.set_capacity(name, signals.capacity_tokens, signals.block_size)
        self.manager.weights.observe_engine_ops(name, flush_operations_total(text), now=self.manager.clock())
        self.manager.observe_scrape(
            name,
            preemptions_total=signals.preemptions_total,
            waiting=signals.waiting,
            kv_usage=signals.kv_cache_usage,
        )
        return True

    async def run(self) -> None:
        """Scrape forever, every ``scrape_interval_s`` (cancelled on shutdown)."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self.scrape_all()
            except Exception:  # a bug must not stop the loop
                _log.exception("Failed scrape round")
            await asyncio.sleep(max(0.0, self.config.scrape_interval_s - (loop.time() - started)))
