"""``rolloutpool plan --simulate``: which cap and how many replicas for a workload file, with its PNG and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rolloutpool.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "workloads" / "swe-agent.yaml"
SMALL = ["plan", "--simulate", "--workload", str(EXAMPLE), "--in-flight", "24", "--kv-capacity-tokens", "131072",
         "--duration", "60", "--workers", "1", "--cap-points", "3"]  # fmt: skip


def test_plan_simulate_writes_the_curve_and_the_answer(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [*SMALL, "--max-replicas", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "plan.json").read_text())
    assert [f["replicas"] for f in data["fleets"]] == [1, 2]
    for fleet in data["fleets"]:
        assert fleet["floor"] == 4  # 131,072 KV tokens // 32,768
        caps = [int(c) for c in fleet["fixed"]]
        assert min(caps) == 4
        assert max(caps) == 24 // fleet["replicas"] + 2
        assert fleet["tokens_per_s"] == max(fleet["fixed"].values())
        assert fleet["adaptive_tokens_per_s"] > 0
        assert fleet["uncapped_tokens_per_s"] > 0
    choice = data["choice"]
    best = max(f["tokens_per_s"] for f in data["fleets"])
    assert choice["target_tokens_per_s"] == pytest.approx(0.9 * best)
    assert choice["met"] is True
    chosen = next(f for f in data["fleets"] if f["replicas"] == choice["replicas"])
    assert choice["cap"] == chosen["best_cap"]
    assert all(
        f["tokens_per_s"] < choice["target_tokens_per_s"] for f in data["fleets"] if f["replicas"] < chosen["replicas"]
    )
    assert data["spec"]["replicas"] == choice["replicas"]
    assert data["spec"]["concurrency"]["maxSessionsPerReplica"] == choice["cap"]
    assert data["meta"]["replica"]["kv_capacity_source"] == "explicit"
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "plan.png").stat().st_size > 10_000
    text = " ".join(result.output.split())
    assert f"{choice['replicas']} replica(s) with cap {choice['cap']} per replica" in text
    assert f"spec.concurrency.maxSessionsPerReplica: {choice['cap']}" in text


def test_plan_simulate_with_replicas_and_a_target_answers_for_that_fleet(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, [*SMALL, "--replicas", "3", "--target-tokens-per-s", "1e9", "--json", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [f["replicas"] for f in data["fleets"]] == [3]
    assert data["choice"]["met"] is False  # a billion tokens/s: missed, and said so
    assert data["choice"]["target"] == "--target-tokens-per-s 1e+09"
    assert json.loads((tmp_path / "plan.json").read_text()) == data


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--in-flight", "24"], "--in-flight needs --simulate"),
        (["--workload", str(EXAMPLE)], "--workload needs --simulate"),
        (["--simulate", "--in-flight", "24"], "--simulate needs --workload FILE"),
        (["--simulate", "--workload", str(EXAMPLE)], "--simulate needs --in-flight N"),
        (["--simulate", "--workload", "nope.yaml", "--in-flight", "8"], "nope.yaml: cannot read"),
        (["--simulate", "--workload", str(EXAMPLE), "--in-flight", "8", "--max-model-len", "8192"],
         "--max-model-len 8192 differs from the workload's maxModelLen 32768"),
        (["--simulate", "--workload", str(EXAMPLE), "--in-flight", "8", "--residency", "0.5"],
         "--residency does not apply to --simulate"),
        (["--simulate", "--workload", str(EXAMPLE), "--in-flight", "8", "--kv-capacity-tokens", "4096"],
         "does not hold one maxModelLen context"),
        (["--simulate", "--workload", str(EXAMPLE), "--in-flight", "8", "--kv-capacity-tokens", "65536",
          "--gpu-memory-utilization", "0.8"], "give it or --kv-capacity-tokens"),
        (["--simulate", "--workload", str(EXAMPLE), "--in-flight", "8", "--model", "gpt-5"],
         "Invalid value for '--model'"),
    ],
)  # fmt: skip
def test_plan_simulate_errors_are_usage_errors_that_write_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(main, ["plan", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()


def test_a_bad_workload_file_is_named_with_its_field(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text(EXAMPLE.read_text().replace("maxModelLen: 32768", "maxModelLen: 100"))
    result = CliRunner().invoke(main, ["plan", "--simulate", "--workload", str(bad), "--in-flight", "8"])
    assert result.exit_code == 2
    assert "maxModelLen: Input should be greater than or equal to 256 (line 6)" in " ".join(result.output.split())


def test_plan_without_simulate_is_unchanged() -> None:
    result = CliRunner().invoke(main, ["plan", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rows"][0]["floor"] == 11
