"""``rolloutpool simulate`` for any workload: defaults (loads 0.5-4x, the adaptive policy), presets, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rolloutpool.cli import main
from rolloutpool.sim.config import ADAPTIVE
from rolloutpool.sim.simulate_run import DEFAULT_LOADS, DEFAULT_POLICIES
from rolloutpool.sim.workload_file import load_workload

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "workloads" / "swe-agent.yaml"
TINY = ["--replicas", "1", "--duration", "20", "--workers", "1", "--no-plots", "--kv-capacity-tokens", "65536"]


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["simulate", *args])
    return result.exit_code, result.output


def test_the_example_workload_loads() -> None:
    s = load_workload(EXAMPLE)
    assert (s.name, s.group_size, s.max_model_len, s.long_share, s.drift_growth) == ("swe-agent", 8, 32768, 0.1, 0.3)


def test_defaults_cover_half_to_four_times_the_floor_and_the_adaptive_policy(tmp_path: Path) -> None:
    assert DEFAULT_LOADS == (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
    assert ADAPTIVE in DEFAULT_POLICIES
    assert "sticky-least-loaded" in DEFAULT_POLICIES
    # every default load and the adaptive policy beside one peer (the whole default set runs in `rolloutpool simulate`)
    code, output = _run(*TINY, "--workload", str(EXAMPLE), "--policy", "sticky-least-loaded", "--policy", ADAPTIVE,
                        "--out", str(tmp_path))  # fmt: skip
    assert code == 0, output
    data = json.loads((tmp_path / "results.json").read_text())
    assert sorted({r["load"] for r in data["runs"]}) == list(DEFAULT_LOADS)
    assert {r["policy"] for r in data["runs"]} == {"sticky-least-loaded", ADAPTIVE}
    assert set(data["meta"]["adaptive_ratios"]) == {str(x) for x in DEFAULT_LOADS}
    assert data["meta"]["replica"]["kv_capacity_tokens"] == 65536
    assert data["meta"]["replica"]["kv_capacity_source"] == "explicit"
    assert f"load 4x: {ADAPTIVE} / sticky-least-loaded" in output


def test_default_policies_are_every_peer_and_the_adaptive_one(tmp_path: Path) -> None:
    code, output = _run(*TINY, "--scenario", "tool-chat", "--load", "1", "--out", str(tmp_path))
    assert code == 0, output
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["policy"] for r in data["runs"]] == list(DEFAULT_POLICIES)


def test_model_and_gpu_presets_size_the_replica(tmp_path: Path) -> None:
    args = ["--replicas", "1", "--duration", "20", "--workers", "1", "--no-plots", "--scenario", "tool-chat",
            "--load", "0.1", "--policy", "rolloutpool"]  # fmt: skip
    sizes = {}
    for model, gpu, gpus in (("qwen3-8b", "h100-80gb", "1"), ("llama-3.1-8b", "h200-141gb", "2")):
        out = tmp_path / f"{model}-{gpu}"
        code, output = _run(*args, "--model", model, "--gpu", gpu, "--gpus-per-replica", gpus, "--out", str(out))
        assert code == 0, output
        meta = json.loads((out / "results.json").read_text())["meta"]
        assert (meta["replica"]["model"], meta["replica"]["gpu"], meta["hardware"]) == (model, gpu, gpu)
        sizes[model] = meta["replica"]["kv_capacity_tokens"]
    assert sizes["llama-3.1-8b"] > 4 * sizes["qwen3-8b"]  # 2 x 141 GB and 128 KiB per token vs 80 GB and 144 KiB
    code, output = _run(*args, "--hardware", "h200-141gb", "--out", str(tmp_path / "alias"))
    assert code == 0, output
    assert json.loads((tmp_path / "alias" / "results.json").read_text())["meta"]["replica"]["gpu"] == "h200-141gb"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-5"], "Invalid value for '--model'"),
        (["--gpu", "h100-80gb", "--hardware", "h200-141gb"], "--hardware is an alias of --gpu"),
        (["--kv-capacity-tokens", "100000", "--gpu-memory-utilization", "0.8"], "give it or --kv-capacity-tokens"),
        (["--kv-capacity-tokens", "1000"], "does not hold one maxModelLen context"),
        (["--workload", "missing.yaml"], "missing.yaml: cannot read"),
    ],
)
def test_bad_options_are_usage_errors_that_run_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    code, output = _run(*args, "--out", str(tmp_path / "out"))
    assert code == 2, output
    assert message in " ".join(output.split())
    assert not (tmp_path / "out").exists()


def test_a_bad_workload_file_names_the_field_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("groupSize: 8", "groupSize: -1").replace("turns:", "turnz:"))
    code, output = _run("--workload", str(bad), "--out", str(tmp_path / "out"))
    assert code == 2
    text = " ".join(output.split())
    assert "groupSize: Input should be greater than or equal to 1 (line 5)" in text
    assert "turnz: Extra inputs are not permitted (line 11)" in text
    assert "turns: Field required" in text
