"""The `rolloutpool` command: plan, crd, validate."""

from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from poolcases import EXAMPLES, invalid_cases
from rolloutpool.api.crd import render_crd
from rolloutpool.cli import main


def test_plan_json_for_qwen3_on_h200() -> None:
    result = CliRunner().invoke(
        main,
        [
            "plan",
            "--model",
            "qwen3-8b",
            "--gpu",
            "h200-141gb",
            "--max-model-len",
            "32768",
            "--residency",
            "1.0",
            "--residency",
            "0.5",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    assert [r["residency"] for r in rows] == [1.0, 0.5]
    assert rows[0]["kv_bytes_per_token"] == 144 * 1024
    assert rows[0]["cap"] == rows[0]["floor"] == rows[0]["kv_capacity_tokens"] // 32768
    assert rows[1]["cap"] > rows[0]["cap"]


def test_plan_table_mentions_floor() -> None:
    result = CliRunner().invoke(main, ["plan"])
    assert result.exit_code == 0
    assert "floor" in result.output


def test_plan_rejects_ceiling_below_floor() -> None:
    result = CliRunner().invoke(main, ["plan", "--gpu", "h200-141gb", "--max-sessions-per-replica", "2"])
    assert result.exit_code == 2
    assert "maxSessionsPerReplica" in result.output


def test_plan_rejects_unknown_preset() -> None:
    result = CliRunner().invoke(main, ["plan", "--model", "gpt-5"])
    assert result.exit_code == 2
    assert "gpt-5" in result.output


def test_crd_command_prints_generated_crd() -> None:
    result = CliRunner().invoke(main, ["crd"])
    assert result.exit_code == 0
    assert result.output == render_crd()


def test_validate_accepts_examples_and_rejects_invalid(tmp_path) -> None:
    ok = CliRunner().invoke(main, ["validate", str(EXAMPLES / "vllm-pool.yaml")])
    assert ok.exit_code == 0
    assert "qwen3-8b-grpo: valid" in ok.output
    case = invalid_cases()[0]
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text(yaml.safe_dump(case.manifest))
    bad = CliRunner().invoke(main, ["validate", str(bad_file)])
    assert bad.exit_code == 1
    assert "spec.replicas" in bad.output
