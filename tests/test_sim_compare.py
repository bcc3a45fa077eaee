"""The compare table: rows to JSON and back, the best fixed cap in hindsight, the summary and its quarantine check."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rolloutpool.sim.compare import (
    NO_EVICTION,
    CompareRow,
    best_fixed,
    compare_jobs,
    every_session_resident,
    load_rows,
    rows_json,
    summary_markdown,
    variant,
)
from rolloutpool.sim.compare import _main as compare_main
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.workload import scenario


def _row(variant: str, tokens: float, *, quarantines: int = 0, evicted: int = 0, vs: float = math.nan) -> CompareRow:
    return CompareRow(
        scenario="bimodal", load=3.0, seed=0, variant=variant, in_flight=132, tokens_per_s=tokens, vs_baseline=vs,
        baseline_evicted_share=0.5, evicted_share=0.1, fast_quarantines=quarantines, evicted_reprefill_tokens=evicted,
        law_cuts=2 if variant == "adaptive" else None, law_quarantines=None, preemptions=0,
    )  # fmt: skip


def test_rows_survive_json_with_unknown_ratios() -> None:
    rows = [_row("sticky-least-loaded", 1000.0, vs=1.0), _row("adaptive", 1250.0)]
    back = load_rows(rows_json(rows, {"replicas": 4}))
    assert back[0] == rows[0]
    assert math.isnan(back[1].vs_baseline)
    assert back[1].tokens_per_s == 1250.0


def test_best_fixed_ignores_adaptive_runs_and_keeps_the_best_cap_per_point() -> None:
    runs = [("bimodal", 3.0, 0, 24, 1200.0), ("bimodal", 3.0, 0, 26, 1300.0), ("bimodal", 3.0, 0, None, 9999.0)]
    runs.append(("bimodal", 3.0, 1, 22, 1100.0))
    assert best_fixed(runs) == {("bimodal", 3.0, 0): (26, 1300.0), ("bimodal", 3.0, 1): (22, 1100.0)}


def test_summary_gives_the_ratios_and_names_quarantines_without_measured_eviction() -> None:
    rows = [
        _row("sticky-least-loaded", 1000.0, vs=1.0),
        _row("rolloutpool", 1200.0, vs=1.2, quarantines=3, evicted=5000),
        _row("fixed-cap:26", 1100.0, vs=1.1, quarantines=2),
        _row("adaptive", 1250.0, vs=1.25, quarantines=4, evicted=2_000_000),
        _row(NO_EVICTION, 1400.0, vs=1.4),
    ]
    table = summary_markdown(rows, {("bimodal", 3.0, 0): (26, 1300.0)})
    line = next(x for x in table.splitlines() if x.startswith("| bimodal"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:] == ["1,000", "10.0", "1.200", "10.0", "1.250", "2", "26 (1,300)", "1.300", "1.400",
                         "0.857", "0.923"]  # fmt: skip
    assert "1 of 5 runs; bimodal 3x seed 0 fixed-cap:26 (2)" in table
    assert "(1,300)" not in summary_markdown(rows)  # no sweep: no best fixed cap


def test_the_table_of_files_split_by_variant_counts_their_shared_baseline_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _row("sticky-least-loaded", 1000.0, vs=1.0)
    first, second = tmp_path / "router.json", tmp_path / "adaptive.json"
    first.write_text(rows_json([base, _row("rolloutpool", 1010.0, vs=1.01)], {}))
    second.write_text(rows_json([base, _row("adaptive", 1250.0, vs=1.25, quarantines=1)], {}))
    compare_main([str(first), str(second)])
    table = capsys.readouterr().out
    line = next(x for x in table.splitlines() if x.startswith("| bimodal"))
    assert [c.strip() for c in line.strip("|").split("|")][5:8] == ["1.010", "10.0", "1.250"]
    assert "1 of 3 runs; bimodal 3x seed 0 adaptive (1)" in table


def test_the_no_eviction_bound_is_sticky_least_loaded_on_a_pool_that_holds_every_session() -> None:
    base = FleetConfig(scenario=scenario("bimodal"), in_flight=1, replicas=4, num_gpu_blocks=16_384)
    variants = ["sticky-least-loaded", NO_EVICTION]
    jobs = dict(compare_jobs(base, scenarios=["bimodal"], loads=[3.0], seeds=[0], variants=variants))
    sticky, bound = jobs["sticky-least-loaded"], jobs[NO_EVICTION]
    assert bound.policy == sticky.policy == "sticky-least-loaded"
    assert bound.config.in_flight == sticky.config.in_flight == 3 * 4 * (16_384 * 16 // 32_768)  # 3x the floor
    assert bound.config == every_session_resident(sticky.config)
    assert (bound.config.num_gpu_blocks - 1) * 16 >= (sticky.config.in_flight + 1) * 32_768  # all on one replica
    assert sticky.config.num_gpu_blocks == 16_384


def test_fixed_cap_and_turns_variants() -> None:
    assert variant("fixed-cap:26") == ("rolloutpool", {"fixed_cap": 26})
    policy, changes = variant("turns:target=0.95:keep_quantile=0.8")
    assert policy == "rolloutpool"
    assert (changes["working_set"].target, changes["working_set"].keep_quantile) == (0.95, 0.8)
    policy, changes = variant("law:maximum=0.9:preemptions_per_s=0.1")  # the operator's law with other knobs
    assert policy == "rolloutpool-adaptive"
    assert (changes["law"].maximum, changes["law"].preemptions_per_s) == (0.9, 0.1)
    assert variant("free-restore") == ("sticky-least-loaded", {"free_restore": True})
    assert variant("rolloutpool+free-restore") == ("rolloutpool", {"free_restore": True})
    policy, changes = variant("turns:target=0.8+free-restore")
    assert (policy, changes["working_set"].target, changes["free_restore"]) == ("rolloutpool", 0.8, True)
    no_groups = {"infer_groups": False, "group_hint": False}
    assert variant("rolloutpool+no-groups") == ("rolloutpool", no_groups)
    assert variant("rolloutpool+no-groups+free-restore") == ("rolloutpool", {**no_groups, "free_restore": True})
    assert variant("turns:target=0.8+known-tools")[1]["known_tools"] is True
    base = FleetConfig(scenario=scenario("bimodal"), in_flight=1, replicas=4)
    ((label, job),) = compare_jobs(base, scenarios=["bimodal"], loads=[3.0], seeds=[1], variants=["fixed-cap:12"])
    assert label == "fixed-cap:12"
    assert job.config.fixed_cap == 12


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("kv-budget:0:0.1", "unknown variant"),
        ("fixed-cap:0", "positive whole number"),
        ("fixed-cap:a", "fixed-cap:a"),
        ("turns:target=2.5", "target"),
        ("turns:nope=1", "nope"),
        ("law:maximum=3", "maximum"),
        ("law:nope=1", "nope"),
        ("+free-restore", "unknown variant"),
        ("nope+free-restore", "unknown variant"),
        ("+no-groups", "unknown variant"),
    ],
)
def test_malformed_variants_are_refused_with_what_is_wrong(label: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        variant(label)


def test_the_command_compares_a_workload_file_and_refuses_nothing_to_run() -> None:
    from pathlib import Path  # noqa: PLC0415

    from click.testing import CliRunner  # noqa: PLC0415

    from rolloutpool.cli import main  # noqa: PLC0415

    workload = Path(__file__).parent.parent / "examples" / "workloads" / "swe-agent.yaml"
    args = ["simulate-compare", "--workload", str(workload), "--load", "1", "--duration", "60", "--replicas", "2",
            "--variant", "rolloutpool", "--workers", "1"]  # fmt: skip
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    assert "| swe-agent | 1x | 0 | rolloutpool |" in done.output
    nothing = CliRunner().invoke(main, ["simulate-compare", "--load", "1"])
    assert nothing.exit_code == 2
    assert "name a --scenario or a --workload file" in nothing.output


@pytest.mark.parametrize("label", ["rolloutpool", "rolloutpool+known-tools", "thunderagent+known-tools"])
def test_known_tools_tells_only_our_scheduler_each_gap_it_then_sees(
    label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rolloutpool.routing.workingset import WorkingSet  # noqa: PLC0415 -- patched below
    from rolloutpool.sim.fleet import simulate_policy  # noqa: PLC0415

    told: list[float | None] = []
    ended: dict[str, tuple[float, float | None]] = {}
    gaps: list[tuple[float, float | None]] = []
    finished, arrive = WorkingSet.turn_finished, WorkingSet.arrive

    def on_finished(self: WorkingSet, sid: str, *, now: float, tool_s: float | None = None, **kw: object) -> None:
        told.append(tool_s)
        ended[sid] = (now, tool_s)
        finished(self, sid, now=now, tool_s=tool_s, **kw)  # type: ignore[arg-type]

    def on_arrive(self: WorkingSet, sid: str, *, now: float, resident: int | None = None) -> bool:
        if sid in ended:  # our scheduler's (a peer's has its own arrive)
            at, tool_s = ended.pop(sid)
            gaps.append((now - at, tool_s))
        return arrive(self, sid, now=now, resident=resident)

    monkeypatch.setattr(WorkingSet, "turn_finished", on_finished)
    monkeypatch.setattr(WorkingSet, "arrive", on_arrive)
    base = FleetConfig(scenario=scenario("bimodal"), in_flight=1, replicas=2, duration_s=120.0, num_gpu_blocks=2_048)
    ((_, job),) = compare_jobs(base, scenarios=["bimodal"], loads=[2.0], seeds=[0], variants=[label])
    simulate_policy(job.config, job.policy)
    assert len(told) > 20
    if label == "rolloutpool+known-tools":
        assert len(gaps) > 20
        assert all(tool_s == pytest.approx(gap) for gap, tool_s in gaps)  # told the gap it then saw
    else:
        assert all(tool_s is None for tool_s in told)  # a router, or a peer: nobody is told
