"""The scale harness measures the state it claims to (small sizes; the real run is 100k / 1,000)."""

from __future__ import annotations

from rolloutpool.dev.bench.scale import operator_pass, router_scale, router_scrape


def test_router_scale_holds_the_sessions_it_reports() -> None:
    result = router_scale(replicas=20, sessions=400, samples=200)
    assert result["sessions"] == 400
    assert result["cap"] * 20 >= 400
    for key in ("placement_router", "placement_ledger", "placement_router_cpu", "returning_turn_router"):
        figures = result[key]
        assert 0 < figures["p50_us"] <= figures["p99_us"] <= figures["max_us"]
    assert result["rss_full_mb"] > 0


def test_operator_pass_times_every_pure_decision() -> None:
    result = operator_pass(replicas=5, passes=3)
    assert result["replicas"] == 5
    assert set(result["steps_cpu_ms_median"]) == {
        "parse_spec",
        "router_objects",
        "desired_engine_pods",
        "plan_engines",
        "plan_controls",
        "build_status",
        "events_between",
        "status_compare",
    }
    assert result["pass_cpu_ms_median"] > 0


def test_router_scrape_renders_a_router_with_its_working_sets() -> None:
    result = router_scrape(replicas=10, sessions=300)
    assert result["sessions"] == 300
    figures = result["metrics_render_cpu_ms"]
    assert 0 <= figures["p50"] <= figures["max"]
