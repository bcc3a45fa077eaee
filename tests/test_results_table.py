"""The generated results table of docs/benchmarks.md (pure), and the medians of repeated bench runs it reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rolloutpool.cli.bench import bench_command
from rolloutpool.dev.bench.results_table import (
    bench_commands,
    bench_table,
    first_rows,
    glance_table,
    misses,
    replace_block,
    sim_table,
)


def _row(variant: str, ratio: float, *, load: float = 3.0, seed: int = 0, evicted: float = 0.4) -> dict[str, object]:
    return {"scenario": "agentic-grpo", "load": load, "seed": seed, "variant": variant, "vs_baseline": ratio,
            "baseline_evicted_share": evicted}  # fmt: skip


def test_the_sim_table_names_the_best_peer_and_our_ratio_to_it_per_prefill_scale() -> None:
    rows = [
        _row("sticky-least-loaded", 1.0),
        _row("rolloutpool", 1.2),
        _row("adaptive", 1.1),
        _row("thunderagent", 1.1),
        _row("continuum", 1.05),
        _row("no-eviction", 1.3),
        _row("clairvoyant", 1.32),
        _row("sticky-least-loaded", 1.0, seed=1),
        _row("rolloutpool", 1.4, seed=1),
    ]
    halved = [_row("sticky-least-loaded", 1.0), _row("rolloutpool", 0.998), _row("thunderagent", 1.0)]
    table = sim_table({0.5: halved, 1.0: rows})  # fmt: skip
    lines = table.splitlines()
    head, rule, line = lines[2:5]
    assert lines[0] == "#### Prefill cost x1"  # x1 first
    assert head.split(" | ")[-4:] == ["ours / best peer", "clairvoyant", "no-eviction bound", "ours misses |"]
    cells = [c.strip() for c in line.strip("|").split("|")]
    # scenario, load, seeds, evicted, ours (mean of the seeds), its worst seed, ours + operator, continuum, ...
    assert cells[:7] == ["agentic-grpo", "3x", "2", "40", "1.300", "1.200", "1.100"]
    assert cells[7:10] == ["1.050", "1.100", "thunderagent"]
    # against the best peer on the seeds both ran (seed 0); seed 0 misses 1.3x and the clairvoyant's 3 %
    assert cells[10:] == [f"{1.2 / 1.1:.3f}", "1.320", "1.300", ">= 1.3x, ~ clairvoyant"]
    assert rule.startswith("|---|--:|")
    x05 = table[table.index("#### Prefill cost x0.5") :].splitlines()
    cells = [c.strip() for c in x05[4].strip("|").split("|")]
    assert cells[4] == "0.998"
    assert cells[-1] == ">= sLL, >= 1.3x"  # no clairvoyant column where none ran; 0.998 of the best peer passes


def test_misses_names_each_criterion_our_router_fails() -> None:
    ok = {"evicted": 0.5, "best_peer": 1.3, "clairvoyant": 1.33, "bound": 1.6}
    assert misses(ours=1.3, **ok) == []
    assert misses(ours=1.25, **ok) == [">= 0.99 peer", ">= 1.3x", "~ clairvoyant"]
    assert misses(ours=1.25, evicted=0.5, best_peer=None, clairvoyant=None, bound=1.28) == []  # within 3 % of it
    assert misses(ours=1.23, evicted=0.5, best_peer=None, clairvoyant=None, bound=1.28) == [">= 1.3x"]
    assert misses(ours=0.999, evicted=0.05, best_peer=None, clairvoyant=None, bound=1.0) == [">= sLL"]  # little evicted
    assert misses(ours=0.9996, evicted=0.05, best_peer=None, clairvoyant=None, bound=1.0) == []  # 1.000 as printed
    assert misses(ours=None, evicted=0.5, best_peer=1.0, clairvoyant=None, bound=None) == []


def test_the_glance_table_gives_ours_per_load_against_the_best_peer_and_at_the_other_prices() -> None:
    rows = [
        _row("sticky-least-loaded", 1.0, load=1.0),
        _row("rolloutpool", 0.999, load=1.0),
        _row("thunderagent", 1.0, load=1.0),
        _row("sticky-least-loaded", 1.0),
        _row("rolloutpool", 1.2),
        _row("thunderagent", 1.1),
        _row("continuum", 1.05),
        _row("sticky-least-loaded", 1.0, seed=1),
        _row("rolloutpool", 1.4, seed=1),
    ]
    halved = [_row("sticky-least-loaded", 1.0), _row("rolloutpool", 1.05)]
    real = {"ratios": [{"scenario": "agentic-grpo", "load": 3.0, "router": "rolloutpool", "ratio": 1.12},
                       {"scenario": "agentic-grpo", "load": 3.0, "router": "vllm-sticky-least-loaded", "ratio": 1.0},
                       {"scenario": "agentic-grpo", "load": 1.0, "router": "rolloutpool", "ratio": 0.9995}],
            "points": [{"scenario": "agentic-grpo", "load": load, "config": {"context_scale": 1.0, "duration_s": 180.0}}
                       for load in (1.0, 3.0)]}  # fmt: skip
    point = {"scenario": "agentic-grpo", "load": 3.0, "config": {"prefill_cost_scale": 2.0}}
    doubled = {"ratios": [{"scenario": "agentic-grpo", "load": 3.0, "router": "rolloutpool", "ratio": 1.5}],
               "points": [point]}  # fmt: skip
    lines = glance_table({1.0: rows, 0.5: halved}, [real, doubled]).splitlines()
    assert lines[0] == "| scenario | ours / sLL, 1x | ours / sLL, 3x | ours / best peer, 3x | 3x, prefill x0.5 |"
    # ours: the mean over its seeds; against the best peer on the seeds both ran (seed 0)
    assert lines[2] == f"| agentic-grpo | 0.999 | 1.300 | {1.2 / 1.1:.3f} | 1.050 |"
    assert lines[4:] == [  # the real runs at the published price only, ours over sticky least-loaded
        "| context scale | window s | ours / vllm-router sLL, 1x | ours / vllm-router sLL, 3x |",
        "|--:|--:|--:|--:|",
        "| 1 | 180 | 1.000 | 1.120 |",
    ]
    assert glance_table({1.0: rows}, []).count("\n") == 3  # no real runs: the simulated table alone
    table = bench_table([real]).splitlines()
    assert [line.split(" | ")[5] for line in table[2:]] == ["1x", "3x", "3x"]  # by load, each point's routers in order


def test_the_bench_table_reads_a_sweeps_ratio_rows() -> None:
    document = {"ratios": [{"scenario": "agentic-grpo", "load": 3.0, "router": "rolloutpool", "tokens_per_s": 1482.4,
                            "ratio": 1.01, "evicted_pct": 12.3}],
                "points": [{"scenario": "agentic-grpo", "load": 3.0, "config": {"context_scale": 0.25}}]}  # fmt: skip
    config = {"context_scale": 1.0, "kv_events": True, "prefill_cost_scale": 2.0, "duration_s": 180.0}
    unscaled = {"ratios": [{**document["ratios"][0], "tokens_per_s": 2000.0}],
                "points": [{"scenario": "agentic-grpo", "load": 3.0, "config": config}]}  # fmt: skip
    table = bench_table([document, unscaled, {"ratios": document["ratios"]}])
    assert "| agentic-grpo | 0.25 | x1 | off | - | 3x | rolloutpool | 1,482 | 1.010 | - | 12 |" in table  # made early
    assert "| agentic-grpo | 1 | x2 | on | 180 | 3x | rolloutpool | 2,000 | 1.010 | - | 12 |" in table
    assert "| agentic-grpo | - | - | - | - | 3x | rolloutpool | 1,482 | 1.010 | - | 12 |" in table  # without its points
    assert bench_commands({"command": "rolloutpool bench --load 3"}) == ["- `rolloutpool bench --load 3`"]


def test_the_bench_table_gives_the_medians_of_repeated_runs_and_each_runs_ratio(tmp_path: Path) -> None:
    def run(ratio: float, tokens: float) -> dict[str, Any]:
        rows = [{"scenario": "agentic-grpo", "load": 2.0, "router": "vllm-sticky-least-loaded", "tokens_per_s": 1000.0,
                 "ratio": 1.0, "evicted_pct": 26.0},
                {"scenario": "agentic-grpo", "load": 2.0, "router": "rolloutpool", "tokens_per_s": tokens,
                 "ratio": ratio, "evicted_pct": 25.0}]  # fmt: skip
        point = {"scenario": "agentic-grpo", "load": 2.0, "config": {"context_scale": 0.25}, "runs": [{"big": 1}]}
        return {"command": f"rolloutpool bench --load 2 --out r{ratio}", "ratios": rows, "points": [point]}

    paths = []
    for i, (ratio, tokens) in enumerate(((0.987, 999.0), (1.004, 1010.0), (0.995, 1001.0))):
        path = tmp_path / f"run{i}" / "bench.json"
        path.parent.mkdir()
        path.write_text(json.dumps(run(ratio, tokens)))
        paths.append(str(path))
    out = tmp_path / "combined"
    result = CliRunner().invoke(bench_command, [arg for p in paths for arg in ("--combine", p)] + ["--out", str(out)])
    assert result.exit_code == 0, result.output
    combined = json.loads((out / "combined.json").read_text())
    assert combined["points"] == [{"scenario": "agentic-grpo", "load": 2.0, "config": {"context_scale": 0.25}}]
    table = bench_table([combined])
    row = "| agentic-grpo | 0.25 | x1 | off | - | 2x | rolloutpool | 1,001 | 0.995 | 0.987 / 1.004 / 0.995 | 25 |"
    assert row in table
    assert bench_commands(combined) == [
        f"- `rolloutpool bench --load 2 --out r{r}` (combined run {i} of 3; the table gives each point's median)"
        for i, r in ((1, 0.987), (2, 1.004), (3, 0.995))
    ]


def test_the_block_between_the_markers_is_replaced_and_a_file_without_them_is_refused() -> None:
    text = "intro\n<!-- results:begin -->\nold\n<!-- results:end -->\nnotes\n"
    assert replace_block(text, "new\n") == "intro\n<!-- results:begin -->\nnew\n<!-- results:end -->\nnotes\n"
    with pytest.raises(ValueError, match="no <!-- results:begin -->"):
        replace_block("no markers", "new\n")


def test_a_seed_without_its_own_bound_is_judged_against_the_points_mean_bound() -> None:
    rows = [
        _row("sticky-least-loaded", 1.0, load=2.0, evicted=0.2),
        _row("no-eviction", 1.02, load=2.0),
        _row("rolloutpool", 1.0, load=2.0),
        _row("sticky-least-loaded", 1.0, load=2.0, seed=1, evicted=0.2),
        _row("rolloutpool", 1.0, load=2.0, seed=1),
    ]
    line = sim_table({1.0: rows}).splitlines()[-1]
    assert line.endswith("| - |")  # seed 1's 1.0 is within 3 % of seed 0's bound of 1.02
    rows[-1] = _row("rolloutpool", 0.985, load=2.0, seed=1)  # 3 % under it
    assert sim_table({1.0: rows}).splitlines()[-1].endswith("| >= sLL, >= 1.3x |")


def test_a_variants_rows_from_an_earlier_file_win_over_a_later_ones() -> None:
    seen: set[tuple[float, str, float, int, str]] = set()
    rerun = [{"scenario": "bimodal", "load": 3.0, "seed": 0, "variant": "rolloutpool", "vs_baseline": 1.25}]
    older = [
        {"scenario": "bimodal", "load": 3.0, "seed": 0, "variant": "rolloutpool", "vs_baseline": 1.20},
        {"scenario": "bimodal", "load": 3.0, "seed": 0, "variant": "thunderagent", "vs_baseline": 1.18},
    ]
    assert first_rows(rerun, scale=1.0, seen=seen) == rerun
    assert first_rows(older, scale=1.0, seen=seen) == older[1:]  # the re-run's row replaced the older one
    assert first_rows(older, scale=2.0, seen=seen) == older  # another prefill price is another point
