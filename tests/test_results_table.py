"""The generated results table of docs/benchmarks.md (pure)."""

from __future__ import annotations

import pytest

from rolloutpool.dev.bench.results_table import bench_table, replace_block, sim_table


def _row(variant: str, ratio: float, *, load: float = 3.0, seed: int = 0, evicted: float = 0.4) -> dict[str, object]:
    return {"scenario": "agentic-grpo", "load": load, "seed": seed, "variant": variant, "vs_baseline": ratio,
            "baseline_evicted_share": evicted}  # fmt: skip


def test_the_sim_table_names_the_best_peer_and_our_ratio_to_it_and_the_other_scales() -> None:
    rows = [_row("sticky-least-loaded", 1.0), _row("rolloutpool", 1.2), _row("adaptive", 1.1),
            _row("thunderagent", 1.1), _row("continuum", 1.05), _row("no-eviction", 1.3),
            _row("sticky-least-loaded", 1.0, seed=1), _row("rolloutpool", 1.4, seed=1)]  # fmt: skip
    table = sim_table({1.0: rows, 0.5: [_row("rolloutpool", 1.05)], 2.0: [_row("rolloutpool", 1.5)]})
    head, rule, line = table.splitlines()
    assert head.split(" | ")[-2:] == ["ours, prefill x0.5", "ours, prefill x2 |"]
    cells = [c.strip() for c in line.strip("|").split("|")]
    # scenario, load, seeds, evicted, ours (mean of the seeds), ours + operator, continuum, thunderagent, best ...
    assert cells[:6] == ["agentic-grpo", "3x", "2", "40", "1.300", "1.100"]
    assert cells[6:9] == ["1.050", "1.100", "thunderagent"]
    assert cells[9:] == [f"{1.3 / 1.1:.3f}", "1.300", "1.050", "1.500"]
    assert rule.startswith("|---|--:|")


def test_the_bench_table_reads_a_sweeps_ratio_rows() -> None:
    document = {"ratios": [{"scenario": "agentic-grpo", "load": 3.0, "router": "rolloutpool", "tokens_per_s": 1482.4,
                            "ratio": 1.01, "evicted_pct": 12.3}]}  # fmt: skip
    assert "| agentic-grpo | 3x | rolloutpool | 1,482 | 1.010 | 12 |" in bench_table([document])


def test_the_block_between_the_markers_is_replaced_and_a_file_without_them_is_refused() -> None:
    text = "intro\n<!-- results:begin -->\nold\n<!-- results:end -->\nnotes\n"
    assert replace_block(text, "new\n") == "intro\n<!-- results:begin -->\nnew\n<!-- results:end -->\nnotes\n"
    with pytest.raises(ValueError, match="no <!-- results:begin -->"):
        replace_block("no markers", "new\n")
