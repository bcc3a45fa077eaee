"""PromQL builders and the parsing of Prometheus answers (pure, no server)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from rolloutpool.api.vllm_metrics import PREFIX_CACHE_HITS_SAMPLES, PREFIX_CACHE_QUERIES_SAMPLES
from rolloutpool.autoscale import ReplicaSignals, classify_health
from rolloutpool.metrics.promql import (
    QUERY_NAMES,
    assemble_signals,
    build_queries,
    promql_duration,
    promql_string,
    regex_alternation,
    sample_values,
)

NOW = 1_800_000_000.0


def vec(label: str, values: dict[str, Any], *, ts: float = NOW, **extra: str) -> list[dict[str, Any]]:
    """An instant vector as the query API returns it (values as strings)."""
    return [{"metric": {label: key, **extra}, "value": [ts, str(value)]} for key, value in values.items()]


def config_info(pod: str, *, blocks: int, block_size: int = 16, engine: str = "0") -> dict[str, Any]:
    labels = {
        "__name__": "vllm:cache_config_info",
        "pod": pod,
        "engine": engine,
        "num_gpu_blocks": str(blocks),
        "block_size": str(block_size),
    }
    return {"metric": labels, "value": [NOW, "1"]}


def full_answer() -> dict[str, list[dict[str, Any]]]:
    """Answers for two replicas: a pressured a, an idle b (0/0 hit ratio, no router counter)."""
    return {
        "kv_usage": vec("pod", {"a": 0.93, "b": 0.0}),
        "preemptions_per_s": vec("pod", {"a": 0.5, "b": 0}),
        "waiting": vec("pod", {"a": 3, "b": 0}),
        "prefix_hit_ratio": vec("pod", {"a": 0.42, "b": "NaN"}),
        "cache_config": [config_info("a", blocks=256), config_info("b", blocks=512)],
        "engine_sampled_at": vec("pod", {"a": NOW - 1.5, "b": NOW - 2.0}),
        "reprefill_tokens_per_s": vec("replica", {"a": 812.5}),
        "live_sessions": vec("replica", {"a": 6, "b": 0}),
        "router_sampled_at": vec("replica", {"a": NOW - 0.5, "b": NOW - 0.5}),
    }


# -- builders -------------------------------------------------------------------------


def test_promql_string_escapes_quotes_backslashes_and_newlines() -> None:
    assert promql_string('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    assert promql_string("plain") == '"plain"'


def test_regex_alternation_is_sorted_deduplicated_and_escaped() -> None:
    assert regex_alternation(["b", "a", "b"]) == "a|b"
    alternation = regex_alternation(["pool.engine-0", "x+y", "(z)"])
    assert alternation == "\\(z\\)|pool\\.engine-0|x\\+y"
    # the alternation, anchored as Prometheus anchors it, matches exactly the names given
    anchored = re.compile(f"^(?:{alternation})$")
    assert anchored.match("pool.engine-0")
    assert not anchored.match("poolXengine-0")
    assert not anchored.match("pool.engine-01")


@pytest.mark.parametrize(
    ("seconds", "expected"), [(30, "30s"), (30.0, "30s"), (1.5, "1500ms"), (0.0004, "1ms"), (120, "120s")]
)
def test_promql_duration(seconds: float, expected: str) -> None:
    assert promql_duration(seconds) == expected


@pytest.mark.parametrize("seconds", [0, -1, math.nan, math.inf])
def test_promql_duration_rejects_non_positive(seconds: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        promql_duration(seconds)


def test_build_queries_batches_every_replica_into_one_query_per_signal() -> None:
    replicas = [f"pool-engine-{i}" for i in range(50)]
    queries = build_queries(namespace="team-a", replicas=replicas, window_seconds=60)
    assert tuple(queries) == QUERY_NAMES
    alternation = "|".join(sorted(replicas))
    for name, query in queries.items():
        assert 'namespace="team-a"' in query, name
        assert alternation in query, name
        assert query.count("(") == query.count(")"), name
    engine = f'namespace="team-a", pod=~"{alternation}"'
    router = f'namespace="team-a", replica=~"{alternation}"'
    assert queries["kv_usage"] == (
        f"max by (pod) (vllm:kv_cache_usage_perc{{{engine}}}) or max by (pod) (vllm:gpu_cache_usage_perc{{{engine}}})"
    )
    assert queries["preemptions_per_s"] == (
        f"sum by (pod) (max by (pod, engine) (rate(vllm:num_preemptions_total{{{engine}}}[60s])))"
    )
    assert queries["waiting"] == f"sum by (pod) (max by (pod, engine) (vllm:num_requests_waiting{{{engine}}}))"

    def first_of(names: tuple[str, ...]) -> str:
        return " or ".join(f"sum by (pod) (max by (pod, engine) (rate({n}{{{engine}}}[60s])))" for n in names)

    assert (
        queries["prefix_hit_ratio"]
        == f"({first_of(PREFIX_CACHE_HITS_SAMPLES)}) / ({first_of(PREFIX_CACHE_QUERIES_SAMPLES)})"
    )
    assert "vllm:gpu_prefix_cache_hits_total" in queries["prefix_hit_ratio"]  # older releases still read
    assert queries["cache_config"] == f"vllm:cache_config_info{{{engine}}}"
    assert queries["engine_sampled_at"] == f"max by (pod) (timestamp(vllm:num_requests_waiting{{{engine}}}))"
    assert queries["reprefill_tokens_per_s"] == (
        f"sum by (replica) (max by (replica, pod) (rate(rolloutpool_router_reprefilled_tokens_total{{{router}}}[60s])))"
    )
    assert queries["live_sessions"] == (
        f"sum by (replica) (max by (replica, pod) (rolloutpool_router_live_sessions{{{router}}}))"
    )
    assert queries["router_sampled_at"] == (
        f"max by (replica) (timestamp(rolloutpool_router_live_sessions{{{router}}}))"
    )
    assert queries["held_turns"] == (
        f"sum by (replica) (max by (replica, pod) (rolloutpool_router_held_turns{{{router}}}))"
    )


def test_the_held_turns_reach_the_signals_and_a_nan_is_unknown() -> None:
    answer = {"held_turns": vec("replica", {"a": 3, "b": "NaN"})}
    signals = assemble_signals(answer, replicas=["a", "b"])
    assert signals["a"] == ReplicaSignals(held_turns=3.0)
    assert signals["b"] == ReplicaSignals()


def test_build_queries_escapes_hostile_names() -> None:
    queries = build_queries(namespace='ns"}or vector(1)', replicas=["a.b"], window_seconds=15)
    assert 'namespace="ns\\"}or vector(1)"' in queries["waiting"]
    assert 'pod=~"a\\\\.b"' in queries["waiting"]  # RE2 "a\.b" inside a PromQL string literal


def test_build_queries_needs_a_replica() -> None:
    with pytest.raises(ValueError, match="replica"):
        build_queries(namespace="ns", replicas=[], window_seconds=15)


# -- parsing ----------------------------------------------------------------------------


def test_sample_values_keeps_nan_and_drops_unreadable_samples() -> None:
    result: list[dict[str, Any]] = [
        {"metric": {"pod": "a"}, "value": [NOW, "0.5"]},
        {"metric": {"pod": "b"}, "value": [NOW, "NaN"]},
        {"metric": {"pod": "c"}, "value": [NOW, "+Inf"]},
        {"metric": {}, "value": [NOW, "1"]},
        {"metric": {"pod": "d"}, "value": [NOW, "not a number"]},
        {"metric": {"pod": "e"}},
    ]
    values = sample_values(result, label="pod")
    assert values["a"] == 0.5
    assert math.isnan(values["b"])
    assert values["c"] == math.inf
    assert set(values) == {"a", "b", "c"}


def test_assemble_signals_of_a_pressured_and_an_idle_replica() -> None:
    signals = assemble_signals(full_answer(), replicas=["a", "b"])
    assert signals["a"] == ReplicaSignals(
        kv_usage=0.93,
        preemptions_per_s=0.5,
        waiting=3.0,
        prefix_hit_ratio=0.42,
        reprefill_tokens_per_s=812.5,
        kv_capacity_tokens=256 * 16,
        live_sessions=6,
        sampled_at=NOW - 0.5,
    )
    idle = signals["b"]
    assert idle is not None
    assert idle.prefix_hit_ratio is None  # 0/0: no queries in the window
    assert idle.reprefill_tokens_per_s is None  # the router never counted any for b
    assert (idle.kv_usage, idle.preemptions_per_s, idle.waiting, idle.live_sessions) == (0.0, 0.0, 0.0, 0)
    assert idle.kv_capacity_tokens == 512 * 16


def test_replica_without_any_series_is_none() -> None:
    signals = assemble_signals(full_answer(), replicas=["a", "b", "gone"])
    assert signals["gone"] is None
    assert assemble_signals({}, replicas=["a"]) == {"a": None}


def test_replica_seen_only_by_the_router_has_router_signals_only() -> None:
    answer = {"reprefill_tokens_per_s": vec("replica", {"a": 10}), "live_sessions": vec("replica", {"a": 2})}
    signals = assemble_signals(answer, replicas=["a"])
    assert signals["a"] == ReplicaSignals(reprefill_tokens_per_s=10.0, live_sessions=2)


def test_nan_and_infinite_values_become_unknown() -> None:
    answer = full_answer()
    answer["kv_usage"] = vec("pod", {"a": "NaN", "b": "+Inf"})
    answer["preemptions_per_s"] = vec("pod", {"a": "-Inf"})
    signals = assemble_signals(answer, replicas=["a", "b"])
    assert signals["a"] is not None
    assert signals["b"] is not None
    assert signals["a"].kv_usage is None
    assert signals["b"].kv_usage is None
    assert signals["a"].preemptions_per_s is None


def test_kv_usage_from_the_older_metric_name() -> None:
    # the query's `or` already returns one value per pod, whichever name it came from; the
    # parser keys by pod, so a pod answered by gpu_cache_usage_perc reads the same way
    answer = {"kv_usage": [{"metric": {"pod": "old"}, "value": [NOW, "0.25"]}]}
    assert assemble_signals(answer, replicas=["old"])["old"] == ReplicaSignals(kv_usage=0.25)


def test_kv_capacity_sums_engines_of_a_pod_and_skips_bad_labels() -> None:
    broken = config_info("a", blocks=1)
    broken["metric"]["num_gpu_blocks"] = "many"
    duplicate = config_info("a", blocks=100)  # the same engine scraped twice (two jobs): counted once
    answer = {
        "cache_config": [
            config_info("a", blocks=100, engine="0"),
            duplicate,
            config_info("a", blocks=300, engine="1"),
            broken,
            config_info("c", blocks=0),
        ]
    }
    signals = assemble_signals(answer, replicas=["a", "c"])
    assert signals["a"] == ReplicaSignals(kv_capacity_tokens=400 * 16)
    assert signals["c"] is None


def test_stale_samples_make_classify_health_report_stale() -> None:
    answer = full_answer()
    answer["engine_sampled_at"] = vec("pod", {"a": NOW - 300, "b": NOW - 2})
    answer["router_sampled_at"] = vec("replica", {"a": NOW - 400, "b": NOW - 1})
    signals = assemble_signals(answer, replicas=["a", "b"])
    assert signals["a"] is not None
    assert signals["a"].sampled_at == NOW - 300
    health = classify_health(enabled=True, reachable=True, signals=signals, now=NOW, stale_after_seconds=60)
    assert (health.available, health.reason) == (False, "MetricsStale")
    assert "a" in health.message
    assert "b" not in health.message.split("for ", 1)[1]


def test_fresh_full_answer_is_available_and_missing_engine_is_reported() -> None:
    signals = assemble_signals(full_answer(), replicas=["a", "b"])
    health = classify_health(enabled=True, reachable=True, signals=signals, now=NOW, stale_after_seconds=60)
    assert (health.available, health.reason) == (True, "MetricsAvailable")
    signals = assemble_signals(full_answer(), replicas=["a", "b", "gone"])
    health = classify_health(enabled=True, reachable=True, signals=signals, now=NOW, stale_after_seconds=60)
    assert (health.reason, health.message) == ("MetricsMissing", "no engine metrics for gone")
