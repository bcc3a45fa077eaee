"""PromQL of the slow control loop and the parsing of its answers (pure: no I/O, no clock).

One query per signal covers every replica of a pool (``pod=~"a|b|c"``), so a read costs a
fixed number of queries whatever the pool size. Engine series are selected by the
``namespace`` and ``pod`` labels our Prometheus attaches; the router's series by its pod's
``namespace`` and ``replica`` (the engine pod name), summed over router pods.

Instant-query answers carry the evaluation time, not the sample time, so the time of the
newest sample is asked for explicitly with ``timestamp()``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from rolloutpool.api import vllm_metrics as vm
from rolloutpool.autoscale import ReplicaSignals
from rolloutpool.routing.weights import FLUSHING_OPERATIONS

__all__ = [
    "QUERY_NAMES",
    "assemble_signals",
    "build_queries",
    "promql_duration",
    "promql_string",
    "regex_alternation",
    "sample_values",
]

_RE2_SPECIAL = re.compile(r"[\\.+*?()|\[\]{}^$]")

QUERY_NAMES: Final = (
    "kv_usage",
    "preemptions_per_s",
    "waiting",
    "prefix_hit_ratio",
    "cache_config",
    "engine_sampled_at",
    "reprefill_tokens_per_s",
    "live_sessions",
    "held_turns",
    "router_sampled_at",
    "weight_updates",
)
"""Keys of :func:`build_queries`, in the order a read sends them."""


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal (pure)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def regex_alternation(values: Iterable[str]) -> str:
    """An RE2 alternation matching exactly these values (pure; sorted, deduplicated, escaped).

    Prometheus anchors ``=~`` matchers, so ``a|b`` matches ``a`` and ``b`` and nothing longer.
    The result still needs :func:`promql_string` to become a literal.
    """
    return "|".join(_RE2_SPECIAL.sub(lambda m: "\\" + m.group(0), v) for v in sorted(set(values)))


def promql_duration(seconds: float) -> str:
    """A range-vector duration: whole seconds as ``30s``, otherwise milliseconds (pure)."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"window must be a positive number of seconds, got {seconds!r}")
    millis = max(1, round(seconds * 1000))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def _engine_sum(expr: str) -> str:
    # one value per engine (the same pod scraped by two jobs counts once), summed over the pod's engines
    return f"sum by (pod) (max by (pod, engine) ({expr}))"


def _engine_sum_or_old(names: tuple[str, ...], selector_range: str) -> str:
    """The per-pod rate of the first of ``names`` a pod exports (current name first, older ones after)."""
    return " or ".join(_engine_sum(f"rate({name}{selector_range})") for name in names)


def _router_sum(expr: str) -> str:
    # one value per router pod (deduplicated across jobs), summed over router pods
    return f"sum by (replica) (max by (replica, pod) ({expr}))"


def build_queries(*, namespace: str, replicas: Sequence[str], window_seconds: float) -> dict[str, str]:
    """The PromQL of one read, keyed by :data:`QUERY_NAMES` (pure).

    Engine queries aggregate ``by (pod)`` (summed over a pod's engines), router queries
    ``by (replica)`` (summed over router pods); series scraped twice by different jobs count
    once. ``kv_usage`` falls back per pod to vLLM's older ``gpu_cache_usage_perc`` when
    ``kv_cache_usage_perc`` is absent.
    """
    if not replicas:
        raise ValueError("at least one replica is needed")
    ns = promql_string(namespace)
    pods = promql_string(regex_alternation(replicas))
    engine = f"namespace={ns}, pod=~{pods}"
    router = f"namespace={ns}, replica=~{pods}"
    w = promql_duration(window_seconds)
    flushing = promql_string(regex_alternation(sorted(FLUSHING_OPERATIONS)))
    return {
        "kv_usage": (
            f"max by (pod) ({vm.KV_CACHE_USAGE}{{{engine}}}) or max by (pod) ({vm.GPU_CACHE_USAGE}{{{engine}}})"
        ),
        "preemptions_per_s": _engine_sum(f"rate({vm.total(vm.NUM_PREEMPTIONS)}{{{engine}}}[{w}])"),
        "waiting": _engine_sum(f"{vm.NUM_REQUESTS_WAITING}{{{engine}}}"),
        "prefix_hit_ratio": (
            "("
            + _engine_sum_or_old(vm.PREFIX_CACHE_HITS_SAMPLES, f"{{{engine}}}[{w}]")
            + ") / ("
            + _engine_sum_or_old(vm.PREFIX_CACHE_QUERIES_SAMPLES, f"{{{engine}}}[{w}]")
            + ")"
        ),
        "cache_config": f"{vm.CACHE_CONFIG_INFO}{{{engine}}}",
        "engine_sampled_at": f"max by (pod) (timestamp({vm.NUM_REQUESTS_WAITING}{{{engine}}}))",
        "reprefill_tokens_per_s": _router_sum(f"rate(rolloutpool_router_reprefilled_tokens_total{{{router}}}[{w}])"),
        "live_sessions": _router_sum(f"rolloutpool_router_live_sessions{{{router}}}"),
        "held_turns": _router_sum(f"rolloutpool_router_held_turns{{{router}}}"),
        "router_sampled_at": f"max by (replica) (timestamp(rolloutpool_router_live_sessions{{{router}}}))",
        "weight_updates": _engine_sum(
            f"increase({vm.RL_WEIGHT_UPDATE_OPS_COUNT}{{{engine}, operation=~{flushing}}}[{w}])"
        ),
    }


def _value(sample: Mapping[str, Any]) -> float | None:
    try:
        return float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def sample_values(result: Iterable[Mapping[str, Any]], *, label: str) -> dict[str, float]:
    """``label`` value -> sample value of an instant vector (pure).

    NaN and infinities are kept (a series that exists but has no usable value); samples
    without the label or with an unreadable value are dropped. Duplicate keys keep the last.
    """
    values: dict[str, float] = {}
    for sample in result:
        key = sample.get("metric", {}).get(label)
        value = _value(sample)
        if isinstance(key, str) and value is not None:
            values[key] = value
    return values


def _capacities(result: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Pod -> KV tokens from ``vllm:cache_config_info`` labels, summed over a pod's engines."""
    per_engine: dict[tuple[str, str], int] = {}
    for sample in result:
        labels = sample.get("metric", {})
        pod = labels.get("pod")
        try:
            tokens = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, TypeError, ValueError):
            continue
        if isinstance(pod, str) and tokens > 0:
            per_engine[(pod, str(labels.get("engine", "")))] = tokens
    capacities: dict[str, int] = {}
    for (pod, _engine), tokens in per_engine.items():
        capacities[pod] = capacities.get(pod, 0) + tokens
    return capacities


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def assemble_signals(
    results: Mapping[str, Sequence[Mapping[str, Any]]], *, replicas: Sequence[str]
) -> dict[str, ReplicaSignals | None]:
    """Each replica's signals from the answers to :func:`build_queries` (pure).

    A replica that appears in no answer at all is None. Within a replica, a signal without a
    series, or whose value is NaN/infinite (a 0/0 hit ratio of an idle engine), is None.
    ``sampled_at`` is the newest sample time of the replica's engine and router gauges.
    """
    by_pod = {
        name: sample_values(results.get(name, ()), label="pod")
        for name in (
            "kv_usage",
            "preemptions_per_s",
            "waiting",
            "prefix_hit_ratio",
            "engine_sampled_at",
            "weight_updates",
        )
    }
    by_replica = {
        name: sample_values(results.get(name, ()), label="replica")
        for name in ("reprefill_tokens_per_s", "live_sessions", "held_turns", "router_sampled_at")
    }
    capacity = _capacities(results.get("cache_config", ()))
    signals: dict[str, ReplicaSignals | None] = {}
    for replica in replicas:
        seen = replica in capacity or any(replica in v for v in (*by_pod.values(), *by_replica.values()))
        if not seen:
            signals[replica] = None
            continue
        times = [
            t
            for t in (by_pod["engine_sampled_at"].get(replica), by_replica["router_sampled_at"].get(replica))
            if t is not None and math.isfinite(t)
        ]
        live = _finite(by_replica["live_sessions"].get(replica))
        signals[replica] = ReplicaSignals(
            kv_usage=_finite(by_pod["kv_usage"].get(replica)),
            preemptions_per_s=_finite(by_pod["preemptions_per_s"].get(replica)),
            waiting=_finite(by_pod["waiting"].get(replica)),
            prefix_hit_ratio=_finite(by_pod["prefix_hit_ratio"].get(replica)),
            reprefill_tokens_per_s=_finite(by_replica["reprefill_tokens_per_s"].get(replica)),
            kv_capacity_tokens=capacity.get(replica),
            live_sessions=None if live is None else round(live),
            held_turns=_finite(by_replica["held_turns"].get(replica)),
            sampled_at=max(times) if times else None,
            weight_updates=_finite(by_pod["weight_updates"].get(replica)),
        )
    return signals
