"""The demo's side-by-side figures: rates, re-prefill so far, totals, the headline, the table and the picture."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from rolloutpool.dev.demo import summary_table
from rolloutpool.dev.demo.figures import (
    EngineTotals,
    Point,
    RouterGauges,
    Side,
    cumulative,
    headline,
    ratio_text,
    summarize,
    throughput,
)
from rolloutpool.dev.demo.picture import draw


def _ours() -> Side:
    side = Side("rolloutpool", "RolloutPool", completed=7, errors=0)
    for i, (gen, held, quarantined) in enumerate([(0, 0, 0), (4000, 3, 0), (9000, 5, 1), (15000, 1, 1), (20000, 0, 0)]):
        engines = EngineTotals(generated=gen, prompt=3 * gen, cached=2 * gen, preemptions=i // 3, lag_s=0.5 * i)
        side.points.append(Point(2.0 * i, engines, RouterGauges(held=held, quarantined=quarantined, held_total=4 * i)))
    side.turns = [(1.0, 0), (3.0, 100), (5.0, 0)]
    return side


def _peer() -> Side:
    side = Side("vllm-sticky-least-loaded", "sticky least-loaded", completed=5, errors=1)
    for i, gen in enumerate([0, 3000, 6000, 8000, 10000]):
        engines = EngineTotals(generated=gen, prompt=4 * gen, cached=2 * gen, preemptions=5 * i)
        side.points.append(Point(2.0 * i, engines))
    side.turns = [(2.0, 500), (4.0, 1500), (7.0, 2000)]
    return side


def test_throughput_is_tokens_per_simulated_second_between_samples() -> None:
    ts, rates = throughput(_ours().points, time_scale=10.0)
    assert ts == [2.0, 4.0, 6.0, 8.0]
    assert rates == [200.0, 250.0, 300.0, 250.0]


def test_reprefill_so_far_is_a_step_series_up_to_the_end() -> None:
    assert cumulative(_peer().turns, until=6.0) == ([0.0, 2.0, 4.0, 6.0], [0, 500, 2000, 2000])


def test_summary_takes_engine_deltas_router_totals_and_client_turns() -> None:
    ours = summarize(_ours(), time_scale=10.0, replicas=3)
    assert ours.generated == 20000
    assert ours.tokens_per_s == 250.0
    assert ours.reprefilled == 100
    assert ours.prefilled == 20000
    assert ours.preemptions == 1
    assert (ours.held_total, ours.held_peak, ours.quarantine_s) == (16, 5, 4.0)
    assert ours.lag_pct == 100.0 * 2.0 / (80.0 * 3)
    peer = summarize(_peer(), time_scale=10.0, replicas=3)
    assert (peer.generated, peer.reprefilled, peer.preemptions, peer.errors) == (10000, 4000, 20, 1)
    assert peer.held_total is None
    assert peer.quarantine_s is None
    line = headline(ours, peer)
    assert "generated 20,000 tokens (2x of sticky least-loaded's 10,000)" in line
    assert "re-prefilled 100 tokens (vs 4,000: 0.025x)" in line


def test_ratio_text_never_divides_by_zero() -> None:
    assert ratio_text(0, 0) == "-"
    assert ratio_text(5, 0) == "all of it"
    assert ratio_text(30, 2) == "15x"


def test_summary_table_and_picture_show_both_sides(tmp_path: Path) -> None:
    ours, peer = (summarize(s, time_scale=10.0, replicas=3) for s in (_ours(), _peer()))
    console = Console(record=True, width=200)
    console.print(summary_table(ours, peer))
    rows = {line.split("  ")[0].strip(): line for line in console.export_text().splitlines()}
    assert rows["tokens generated"].split()[-3:] == ["10,000", "20,000", "2x"]
    assert rows["tokens re-prefilled (evicted prefixes)"].split()[-3:] == ["4,000", "100", "0.025x"]
    assert rows["turns held for room (paused)"].split()[-2:] == ["-", "16"]
    out = draw(_ours(), _peer(), (ours, peer), time_scale=10.0, replicas=3, out=tmp_path / "demo.png")
    assert out.stat().st_size > 20_000
