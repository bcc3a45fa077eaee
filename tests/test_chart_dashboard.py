"""The chart's Grafana dashboard: valid JSON, valid PromQL, and only metrics our code exposes.

Metric names are cross-checked against the real expositions: an engine simulator's
``/metrics`` registry (vLLM's names) and the router's registry with its table gauges.
The queries are parsed by Prometheus' own ``promtool``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from poolcases import ROOT
from rolloutpool.engine.model.core import Engine, EngineConfig
from rolloutpool.engine.server.instruments import CacheConfigInfo, EngineMetrics
from rolloutpool.router.instruments import ReplicaGauges, RouterMetrics

DASHBOARD = ROOT / "charts" / "rolloutpool" / "dashboards" / "rolloutpool.json"
METRIC_TOKEN = re.compile(r"vllm:[A-Za-z0-9_:]+|rolloutpool_router_[A-Za-z0-9_]+")
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[a-z_]+)\)$")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
# the panels the dashboard exists for: name -> a metric it must chart
REQUIRED = {
    "live sessions": "rolloutpool_router_live_sessions",
    "caps": "rolloutpool_router_session_cap",
    "KV usage": "vllm:kv_cache_usage_perc",
    "prefix hits": "vllm:prefix_cache_hits_total",
    "prefix queries": "vllm:prefix_cache_queries_total",
    "re-prefilled tokens": "rolloutpool_router_reprefilled_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
    "router queue depth": "rolloutpool_router_queue_depth",
}


def _sample_names(exposition: bytes) -> set[str]:
    """Every series name a scrape of ``exposition`` can produce, labelled children or not."""
    names = set()
    for family in text_string_to_metric_families(exposition.decode()):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


@pytest.fixture(scope="module")
def exposed() -> set[str]:
    engine = Engine(EngineConfig(num_gpu_blocks=64))
    info = CacheConfigInfo(
        block_size=16, num_gpu_blocks=64, max_model_len=1024, gpu_memory_utilization=0.9, override=True
    )
    engine_names = _sample_names(EngineMetrics(engine, model_name="m", cache_info=info).render())
    router = RouterMetrics()
    gauges = ReplicaGauges(name="p-engine-0", live=1, cap=4, quarantined=False, ready=True, draining=False, inflight=0)
    router.watch(lambda: [gauges], lambda: 0)
    router_names = _sample_names(router.render())
    assert "vllm:kv_cache_usage_perc" in engine_names
    assert "rolloutpool_router_live_sessions" in router_names
    return engine_names | router_names


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _queries(dashboard: dict[str, Any]) -> list[str]:
    """PromQL of every panel target and of every query variable (label_values unwrapped)."""
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = LABEL_VALUES.match(variable["query"]["query"])
            assert match, variable
            exprs.append(match["selector"])
    return exprs


def test_dashboard_is_a_grafana_dashboard(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "rolloutpool"
    assert dashboard["title"]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert len({(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels}) == len(panels)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "pool"} <= set(variables)
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            # every series is filtered to the chosen namespaces and pools
            assert 'namespace=~"$namespace"' in target["expr"]
            assert 'rolloutpool_io_pool=~"$pool"' in target["expr"]


def test_dashboard_charts_the_pool_health_signals(dashboard: dict[str, Any]) -> None:
    text = " ".join(_queries(dashboard))
    missing = {panel: metric for panel, metric in REQUIRED.items() if metric not in METRIC_TOKEN.findall(text)}
    assert not missing


def test_dashboard_names_only_metrics_our_code_exposes(dashboard: dict[str, Any], exposed: set[str]) -> None:
    used = {token for query in _queries(dashboard) for token in METRIC_TOKEN.findall(query)}
    assert used
    assert used - exposed == set()


def test_rendered_configmap_carries_the_dashboard(dashboard: dict[str, Any]) -> None:
    template = (ROOT / "charts" / "rolloutpool" / "templates" / "dashboard-configmap.yaml").read_text()
    assert 'grafana_dashboard: "1"' in template
    assert '.Files.Get "dashboards/rolloutpool.json"' in template


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool comes with Debian's prometheus package")
def test_every_query_parses_as_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    substitutions = {"$__rate_interval": "1m", "$namespace": ".*", "$pool": ".*"}
    rules = []
    for i, query in enumerate(_queries(dashboard)):
        expr = query
        for var, value in substitutions.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"rolloutpool:dashboard_check_{i}", "expr": expr})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
