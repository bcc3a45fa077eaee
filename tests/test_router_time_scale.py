"""``rolloutpool router --time-scale``: every engine-time constant of the router follows the engines' clock."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from rolloutpool.cli import main
from rolloutpool.routing.quarantine import QuarantineConfig
from rolloutpool.routing.workingset_state import WorkingSetConfig


def _config(monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    import rolloutpool.router as router_pkg  # noqa: PLC0415

    seen: dict[str, Any] = {}
    monkeypatch.setattr(router_pkg, "run_router", lambda config, **_: seen.setdefault("config", config))
    result = CliRunner().invoke(main, ["router", "--replica", "e0=http://10.0.0.7:8000", "--no-state", *args])
    assert result.exit_code == 0, result.output
    return seen["config"]


def test_engine_time_constants_are_divided_by_the_time_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    plain, scaled = _config(monkeypatch), _config(monkeypatch, "--time-scale", "4")
    default, turns = QuarantineConfig(), WorkingSetConfig()
    assert plain.quarantine == default
    # the fast quarantine's window and hold are engine seconds, as in the simulator (scale 1)
    assert scaled.quarantine.window_seconds == default.window_seconds / 4
    assert scaled.quarantine.hold_seconds == default.hold_seconds / 4
    assert scaled.quarantine.min_window_tokens == default.min_window_tokens  # tokens are not time
    assert scaled.turns.hold_limit_s == turns.hold_limit_s / 4
    assert scaled.turns.fair_after_s == turns.fair_after_s / 4
    assert scaled.turns.prefill_tokens_per_s == pytest.approx(turns.prefill_tokens_per_s * 4)
