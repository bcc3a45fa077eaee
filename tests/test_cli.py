"""The `rolloutpool` command: plan, crd, validate."""

from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from poolcases import EXAMPLES, invalid_cases
from rolloutpool.api.crd import render_crd
from rolloutpool.cli import main
from rolloutpool.dev.net import free_port


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


def test_engine_sim_command_serves_until_terminated(tmp_path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import time  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rolloutpool.cli", "engine-sim", "--port", str(port), "--kv-capacity-tokens", "65536"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    metrics = resp.read().decode()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "engine-sim did not start"
                time.sleep(0.2)
        assert 'num_gpu_blocks="4096"' in metrics
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_engine_sim_rejects_conflicting_sizes() -> None:
    result = CliRunner().invoke(main, ["engine-sim", "--num-gpu-blocks", "10", "--kv-capacity-tokens", "100"])
    assert result.exit_code == 2
    assert "not both" in result.output


def test_simulate_rejects_unknown_policy_and_scenario() -> None:
    assert "unknown policy" in CliRunner().invoke(main, ["simulate", "--policy", "random"]).output
    assert "unknown scenario" in CliRunner().invoke(main, ["simulate", "--scenario", "x"]).output


def test_simulate_small_run_writes_json_and_plots(tmp_path) -> None:
    out = tmp_path / "sim"
    result = CliRunner().invoke(
        main,
        ["simulate", "--scenario", "tool-chat", "--replicas", "2", "--duration", "120", "--load", "1",
         "--policy", "rolloutpool", "--policy", "consistent-hash", "--workers", "1", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert {r["policy"] for r in data["runs"]} == {"rolloutpool", "consistent-hash"}
    assert "consistent-hash" in data["ratios"]["1.0"]
    assert (out / "throughput_vs_load.png").stat().st_size > 1000
    assert (out / "replicas_over_time.png").stat().st_size > 1000
