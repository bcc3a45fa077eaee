"""A user's workload file for ``rolloutpool simulate --workload``: validation with clear errors, then a run."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rolloutpool.cli import main
from rolloutpool.sim.workload import TrajectorySource
from rolloutpool.sim.workload_file import WorkloadFileError, load_workload

GOOD = """
groupSize: 4
maxModelLen: 8192
promptTokens: {median: 500, p90: 800}
actionTokens: {median: 100, p90: 300}
observationTokens: {median: 200, p90: 600}
toolLatencySeconds: {median: 1.0, p90: 4.0}
turns: {median: 3, p90: 6}
longShare: 0.25
longTurns: {median: 20, p90: 30}
drift: {growth: 0.5, startSeconds: 60, durationSeconds: 120}
"""


def _file(tmp_path: Path, text: str, name: str = "mine.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_file_becomes_a_scenario_named_after_the_file(tmp_path: Path) -> None:
    s = load_workload(_file(tmp_path, GOOD))
    assert (s.name, s.group_size, s.max_model_len, s.long_share) == ("mine", 4, 8192, 0.25)
    assert s.long_turns is not None
    assert (s.prompt_tokens.median, s.prompt_tokens.p90) == (500, 800)
    assert (s.drift_growth, s.drift_start_s, s.drift_duration_s) == (0.5, 60, 120)
    trajectory = TrajectorySource(s, 0).next()
    assert trajectory.prompt_tokens > 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (GOOD + "turnz: {median: 3, p90: 6}\n", "turnz: Extra inputs are not permitted"),
        (GOOD.replace("turns: {median: 3, p90: 6}", "turns: {median: 6, p90: 3}"), "turns: Value error, p90 (3)"),
        (GOOD.replace("groupSize: 4", "groupSize: 0"), "groupSize: Input should be greater than or equal to 1"),
        (GOOD.replace("longTurns: {median: 20, p90: 30}", ""), "longShare needs longTurns"),
        (GOOD.replace("promptTokens: {median: 500, p90: 800}", "promptTokens: {median: 9000, p90: 9000}"),
         "must be under maxModelLen"),
        (GOOD.replace("actionTokens: {median: 100, p90: 300}\n", ""), "actionTokens: Field required"),
        ("- just\n- a list\n", "expected a mapping"),
        ("groupSize: [unclosed\n", "cannot read"),
    ],
)  # fmt: skip
def test_bad_files_name_the_field(tmp_path: Path, change: str, message: str) -> None:
    with pytest.raises(WorkloadFileError, match=r"mine\.yaml: ") as err:
        load_workload(_file(tmp_path, change))
    assert message in str(err.value)


def test_simulate_runs_a_workload_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(main, ["simulate", "--workload", str(_file(tmp_path, "groupSize: 4\n", "bad.yaml"))])
    assert bad.exit_code == 2
    assert "maxModelLen: Field required" in bad.output
    out = tmp_path / "out"
    good = runner.invoke(
        main,
        ["simulate", "--workload", str(_file(tmp_path, GOOD)), "--replicas", "1", "--duration", "120",
         "--policy", "sticky-least-loaded", "--policy", "rolloutpool", "--workers", "1", "--no-plots",
         "--out", str(out)],
    )  # fmt: skip
    assert good.exit_code == 0, good.output
    assert '"scenario": "mine"' in (out / "results.json").read_text()
    assert "ours / sticky-least-loaded" in (out / "results.md").read_text()
