"""The bench's operator loop (pure parts), the multi-point report and ``PUT /admin/limits``."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import replace
from pathlib import Path

from rolloutpool.autoscale import RATE_WINDOW_SECONDS, ReplicaControl
from rolloutpool.dev.bench.adaptive import (
    AdaptiveLaw,
    EngineScrape,
    RouterScrape,
    bench_pool_spec,
    parse_engine_scrape,
    parse_router_scrape,
    rate_over,
    status_document,
)
from rolloutpool.dev.bench.client import ClientResult, TrajectoryRecord, TurnRecord, queued_mean, write_turns
from rolloutpool.dev.bench.config import BenchResult, RouterRun
from rolloutpool.dev.bench.peers import ADAPTIVE, RouterLaunch, our_router_argv
from rolloutpool.dev.bench.sweep import BASELINE, SweepPoint, SweepResult, median_rows, ratio_rows, sweep_json
from rolloutpool.dev.bench.sweep_report import (
    median_markdown,
    sweep_markdown,
    write_combined_outputs,
    write_sweep_outputs,
)
from rolloutpool.reconcile.caps import law_params
from rolloutpool.reconcile.control import spec_window_seconds
from rolloutpool.routing.workingset import WorkingSetConfig
from rolloutpool.sim.adaptive import AdaptiveTargets
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.workload import scenario
from routerkit import engines, router

TOKEN = "bench-admin-token"  # noqa: S105 - a test fixture, not a credential

ENGINE_TEXT = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage.
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 7.0
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e+09
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 900.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="4096"} 1.0
"""

ROUTER_TEXT = """\
rolloutpool_router_live_sessions{replica="r0"} 14.0
rolloutpool_router_live_sessions{replica="r1"} 13.0
rolloutpool_router_reprefilled_tokens_total{replica="r0"} 5000.0
rolloutpool_router_reprefilled_tokens_created{replica="r0"} 1.7e+09
rolloutpool_router_queue_depth 9.0
rolloutpool_router_held_turns{replica="r0"} 3.0
"""


KV, MAX_LEN = 65536, 8192
"""The bench's default fleet."""


def _spec(time_scale: float = 10.0) -> object:
    return bench_pool_spec(replicas=2, max_model_len=MAX_LEN, kv_capacity_tokens=KV, time_scale=time_scale)


def _engine(*, usage: float, capacity: int = KV) -> EngineScrape:
    return EngineScrape(
        kv_usage=usage,
        waiting=0.0,
        preemptions_total=0.0,
        prefix_hits_total=0.0,
        prefix_queries_total=0.0,
        kv_capacity_tokens=capacity,
    )


def test_engine_scrape_reads_the_series_the_operator_queries() -> None:
    scrape = parse_engine_scrape(ENGINE_TEXT)
    assert scrape == EngineScrape(
        kv_usage=0.25,
        waiting=2.0,  # not the by-reason breakdown
        preemptions_total=3.0,
        prefix_hits_total=900.0,
        prefix_queries_total=1000.0,
        kv_capacity_tokens=65536,
    )
    assert parse_engine_scrape("") == EngineScrape(None, None, 0.0, 0.0, 0.0, None)


def test_router_scrape_reads_live_sessions_kept_reprefill_held_turns_and_the_queue() -> None:
    scrape = parse_router_scrape(ROUTER_TEXT)
    assert scrape.live_sessions == {"r0": 14, "r1": 13}
    assert scrape.reprefilled_tokens_total == {"r0": 5000.0}  # not the _created sample
    assert scrape.queue_depth == 9
    assert scrape.held_turns == {"r0": 3}


def test_rate_over_needs_two_points_and_survives_a_counter_reset() -> None:
    assert rate_over(deque([(0.0, 5.0)])) is None
    assert rate_over(deque([(0.0, 5.0), (10.0, 25.0)])) == 2.0
    assert rate_over(deque([(0.0, 50.0), (10.0, 20.0)])) == 2.0  # restarted: counts from zero
    assert rate_over(deque([(3.0, 1.0), (3.0, 2.0)])) is None


def test_the_bench_pool_is_the_operators_law_starting_at_the_routers_target() -> None:
    spec = _spec()
    params = law_params(spec=spec)  # type: ignore[arg-type]
    assert params.initial == 0.9 == WorkingSetConfig().target
    law = AdaptiveLaw(spec=spec, names=["r0", "r1"])  # type: ignore[arg-type]
    assert law.interval_s == 15.0
    assert law.window_s == 120.0  # the law's two minutes of engine time: the simulated seconds the bench steps in
    start = law.start(now=0.0)
    assert {c.target for c in start.values()} == {None}  # no signal yet: the routers keep their own target


def test_the_simulator_the_bench_and_the_operator_take_one_rate_window() -> None:
    """The law's thresholds were tuned on the simulator's window: the operator and the bench must take the same one."""
    spec = _spec(time_scale=10.0)
    bench = AdaptiveLaw(spec=spec, names=["r0"])  # type: ignore[arg-type]
    fleet = FleetConfig(scenario=scenario("agentic-grpo"), in_flight=8, replicas=1, num_gpu_blocks=4096)
    simulated = AdaptiveTargets.for_fleet(fleet, ["r0"], capacity_tokens=65536)
    engine_seconds = {bench.window_s, simulated.params.rate_window_seconds}
    assert engine_seconds == {RATE_WINDOW_SECONDS}
    real = spec.model_copy(update={"engine": spec.engine.model_copy(update={"simulator": None})})  # type: ignore[attr-defined]
    assert spec_window_seconds(real) == RATE_WINDOW_SECONDS  # real engines: the same seconds on the wall clock
    assert spec_window_seconds(_spec(time_scale=2.0)) == RATE_WINDOW_SECONDS / 2.0  # engines twice as fast


def test_the_law_raises_the_target_while_turns_wait_and_cuts_it_on_kept_prefixes_lost() -> None:
    engines = {"r0": _engine(usage=0.5), "r1": _engine(usage=0.5)}
    waiting = RouterScrape(
        live_sessions={"r0": 10, "r1": 10}, reprefilled_tokens_total={}, queue_depth=0, held_turns={"r0": 2, "r1": 0}
    )
    default = AdaptiveLaw(spec=_spec(), names=["r0", "r1"])  # type: ignore[arg-type]
    default.start(now=0.0)
    assert default.step(now=15.0, engines=engines, router=waiting)["r0"].target == 0.9  # maxTarget unset: the pool's
    spec = _spec()
    spec = spec.model_copy(update={"autoscaling": spec.autoscaling.model_copy(update={"max_target": 1.0})})  # type: ignore[attr-defined]
    law = AdaptiveLaw(spec=spec, names=["r0", "r1"])  # type: ignore[arg-type]
    law.start(now=0.0)
    controls = law.step(now=15.0, engines=engines, router=waiting)
    assert controls["r0"].target == 0.92  # turns held, nothing presses: raised from the initial target
    assert controls["r1"].target == 0.9  # nothing waits there: held
    assert law.step(now=30.0, engines=engines, router=waiting)["r0"].target == 0.92  # the cooldown
    assert law.step(now=90.0, engines=engines, router=waiting)["r0"].target == 0.94
    assert law.raises == 1  # a move from the routers' own target (None) is no raise
    # kept prefixes lost fast on r0: far over the law's 2,000 tokens/s, a cut and a quarantine on r0 only
    law.step(now=180.0, engines=engines, router=RouterScrape({"r0": 10, "r1": 10}, {"r0": 0.0, "r1": 0.0}, 0))
    storm = {"r0": 30 * 20_000.0, "r1": 0.0}
    after = law.step(now=210.0, engines=engines, router=RouterScrape({"r0": 10, "r1": 10}, storm, 0))
    assert after["r0"].target is not None
    assert after["r0"].target < 0.94
    assert (after["r0"].reason, after["r0"].quarantined) == ("Evicting", True)
    assert after["r1"].target == 0.9
    assert law.cuts == 1
    summary = law.summary()
    assert summary["steps"] == 5
    assert summary["cuts"] == 1


def test_a_replica_without_a_scrape_is_unobserved_not_blind() -> None:
    law = AdaptiveLaw(spec=_spec(), names=["r0", "r1"])  # type: ignore[arg-type]
    law.start(now=0.0)
    router_scrape = RouterScrape(live_sessions={"r0": 0, "r1": 0}, reprefilled_tokens_total={}, queue_depth=0)
    signals = law.signals(now=15.0, engines={"r0": _engine(usage=0.5)}, router=router_scrape)
    assert signals["r1"] is None
    first = signals["r0"]
    assert first is not None
    assert first.kv_usage == 0.5
    assert first.reprefill_tokens_per_s is None  # the router has no counter for r0 yet


def test_status_document_is_what_the_operator_writes() -> None:
    controls = {
        "r0": ReplicaControl(target=0.81, quarantined=True, reason="Evicting"),
        "r1": ReplicaControl(target=0.92, reason="Raised"),
    }
    assert status_document(["r0", "r1", "r2"], controls) == {
        "replicaStatus": [
            {"name": "r0", "index": 0, "target": 0.81, "quarantined": True, "reason": "Evicting"},
            {"name": "r1", "index": 1, "target": 0.92, "quarantined": False, "reason": None},
        ]
    }


def test_adaptive_router_gets_the_admin_token_file() -> None:
    launch = RouterLaunch(
        replica_urls=("http://127.0.0.1:1",),
        port=2,
        kv_capacity_tokens=65536,
        max_model_len=8192,
        time_scale=10.0,
        scrape_interval_s=0.5,
        queue_timeout_s=60.0,
        admin_token_file="/run/token",  # noqa: S106 - a path on a command line, not a credential
    )
    argv = our_router_argv(launch, prefix=["rolloutpool"])
    assert argv[argv.index("--admin-token-file") + 1] == "/run/token"
    assert argv[argv.index("--time-scale") + 1] == "10"  # the hold limit, lease prior and fairness wait follow
    overhead = our_router_argv(replace(launch, max_model_len=None), prefix=["rolloutpool"])
    assert "--no-turn-scheduling" in overhead  # the overhead measurement: placement only


def test_queued_mean_integrates_the_wait_for_a_first_response_inside_the_window() -> None:
    records = [
        TrajectoryRecord(index=0, group=0, planned_turns=3, started=0.0, first_turn_at=2.0),
        TrajectoryRecord(index=1, group=0, planned_turns=3, started=5.0, first_turn_at=None),  # waits to the end
        TrajectoryRecord(index=2, group=0, planned_turns=3, started=-4.0, first_turn_at=1.0),  # started before
    ]
    assert queued_mean(records, window_start=0.0, window_end=10.0) == (2.0 + 5.0 + 1.0) / 10.0
    assert queued_mean(records, window_start=3.0, window_end=3.0) == 0.0


def test_a_runs_turns_are_kept_as_json_lines_relative_to_the_window(tmp_path: Path) -> None:
    result = ClientResult(window_start=100.0)
    result.turns += [
        TurnRecord(trajectory=3, turn=0, prompt_tokens=500, cached_tokens=0, completion_tokens=80,
                   reprefilled_tokens=0, at=101.5, sent=100.25),
        TurnRecord(trajectory=3, turn=1, prompt_tokens=900, cached_tokens=576, completion_tokens=60,
                   reprefilled_tokens=16, at=104.0, sent=103.0),
    ]  # fmt: skip
    path = tmp_path / "point" / "turns-rolloutpool.jsonl"
    write_turns(path, result)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["trajectory"], r["turn"], r["sent"], r["at"]) for r in rows] == [(3, 0, 0.25, 1.5), (3, 1, 3.0, 4.0)]
    assert rows[1]["reprefilled_tokens"] == 16


def _run(router_name: str, tokens_per_s: float, **extra: object) -> RouterRun:
    return RouterRun(
        router=router_name, in_flight=8, window_wall_s=1.0, generated_tokens=1, tokens_per_s=tokens_per_s,
        started=1, completed=1, completed_per_hour=1.0, turns=1, reprefilled_tokens=0, prompt_tokens=1,
        cached_tokens=0, preemptions=0, prefix_hit_ratio=0.5, p50_trajectory_s=1.0, p90_trajectory_s=2.0,
        retries=0, errors=0, finish_failures=0, pids=[], leftover_pids=[], **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def _config(scenario_name: str) -> dict[str, object]:
    return {
        "scenario": scenario_name, "context_scale": 1.0, "replicas": 2, "kv_capacity_tokens": 65536,
        "max_model_len": 8192, "in_flight": 8, "fleet_floor": 16, "time_scale": 10.0, "duration_s": 1.0,
    }  # fmt: skip


def test_ratios_are_over_sticky_least_loaded_at_the_same_point(tmp_path: Path) -> None:
    law = {"cuts": 2, "raises": 5, "quarantines": 1, "mean_final_target": 0.88}
    short, grpo = _config("short-burst"), _config("agentic-grpo")
    points = [
        SweepPoint("short-burst", 1.0, BenchResult(short, [_run(BASELINE, 100.0), _run(ADAPTIVE, 90.0, law=law)], [])),
        SweepPoint("short-burst", 3.0, BenchResult(short, [_run("rolloutpool", 50.0)], [])),
        SweepPoint("agentic-grpo", 1.0, BenchResult(grpo, [_run(BASELINE, 0.0)], [])),
    ]
    rows = ratio_rows(points)
    assert [(r["router"], r["ratio"]) for r in rows] == [
        ("vllm-sticky-least-loaded", 1.0),
        (ADAPTIVE, 0.9),
        ("rolloutpool", None),  # no baseline at that point
        ("vllm-sticky-least-loaded", None),  # the baseline generated nothing
    ]
    assert rows[1]["law_cuts"] == 2
    sweep = SweepResult(points=points, overhead=[], command="rolloutpool bench --load 1 --load 3")
    data = json.loads(json.dumps(sweep_json(sweep)))
    assert len(data["points"]) == 3
    assert data["ratios"][1]["ratio"] == 0.9
    text = sweep_markdown(sweep)
    assert "| short-burst | 1x | 8 | rolloutpool-adaptive | 90 | 0.900 |" in text
    assert "## agentic-grpo@1x" in text
    paths = write_sweep_outputs(sweep, tmp_path)
    assert [p.name for p in paths] == ["bench.json", "bench.md", "bench.png"]
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_put_admin_limits_applies_a_pool_status_and_rejects_anything_else() -> None:
    async with engines(2) as urls, router(urls, admin_token=TOKEN) as rt:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        document = {
            "replicaStatus": [
                {"name": "e0", "index": 0, "target": 0.7, "quarantined": False},
                {"name": "e1", "index": 1, "target": 0.8, "quarantined": True, "reason": "Evicting"},
                {"name": "ghost", "index": 2, "target": 0.9},
            ]
        }
        status, body = await rt.request("PUT", "/admin/limits", json=document)
        assert status == 401
        status, body = await rt.request("PUT", "/admin/limits", json=document, headers=auth)
        assert status == 200
        assert body == {"applied": 3, "unknown": ["ghost"]}
        replicas = {r.name: r for r in rt.manager.table.replicas.values()}
        work = rt.manager.ledger.work
        assert (work.replicas["e0"].target, replicas["e0"].quarantined) == (0.7, False)
        assert (work.replicas["e1"].target, replicas["e1"].quarantined) == (0.8, True)
        for bad in (b"not json", b'{"replicaStatus": [{"name": "e0", "target": -1}]}'):
            status, body = await rt.request("PUT", "/admin/limits", data=bad, headers=auth)
            assert status == 400
            assert "error" in body
        assert work.replicas["e0"].target == 0.7  # a rejected body changed nothing


def test_median_rows_take_each_runs_own_ratio_then_the_median(tmp_path: Path) -> None:
    def row(router_name: str, tokens: float, ratio: float | None, **extra: object) -> dict[str, object]:
        base: dict[str, object] = {
            "scenario": "short-burst", "load": 3.0, "router": router_name, "in_flight": 96, "tokens_per_s": tokens,
            "ratio": ratio, "evicted_pct": 1.0, "preemptions": 0, "completed": 10, "first_turn_p50_s": 1.0,
            "first_turn_p90_s": 2.0, "queued_mean": 3.0, "law_cuts": None, "law_raises": None,
            "law_quarantines": None, "law_mean_final_cap": None, "errors": 0,
        }  # fmt: skip
        return base | extra

    runs = [
        [row(BASELINE, 100.0, 1.0), row(ADAPTIVE, 95.0, 0.95, law_cuts=1, law_raises=4, law_mean_final_cap=20.0)],
        [row(BASELINE, 80.0, 1.0), row(ADAPTIVE, 84.0, 1.05, law_cuts=3, law_raises=6, law_mean_final_cap=22.0)],
        [row(BASELINE, 90.0, 1.0), row(ADAPTIVE, 99.0, 1.10, law_cuts=2, law_raises=5, law_mean_final_cap=21.0)],
    ]
    rows = median_rows(runs)
    assert [(r["router"], r["runs"]) for r in rows] == [(BASELINE, 3), (ADAPTIVE, 3)]
    adaptive = rows[1]
    assert adaptive["ratio"] == 1.05  # the median of the per-run ratios, not a ratio of medians (95/90)
    assert adaptive["ratios"] == [0.95, 1.05, 1.10]
    assert adaptive["tokens_per_s"] == 95.0
    assert adaptive["law_cuts"] == 2
    assert rows[0]["law_cuts"] is None
    text = "\n".join(median_markdown(rows))
    assert "| short-burst | 3x | 96 | rolloutpool-adaptive | 95 | 1.050 | 0.950 / 1.050 / 1.100 |" in text
    paths = write_combined_outputs(rows, ["a.json", "b.json", "c.json"], tmp_path)
    assert [p.name for p in paths] == ["combined.json", "combined.md", "combined.png"]
