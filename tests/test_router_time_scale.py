"""``rolloutpool router --time-scale``: every engine-time constant of the router follows the engines' clock."""

from __future__ import annotations

import pytest

from rolloutpool.routing.quarantine import QuarantineConfig
from rolloutpool.routing.workingset_state import WorkingSetConfig
from routerkit import captured_router_config


def test_engine_time_constants_are_divided_by_the_time_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    plain, scaled = (
        captured_router_config(monkeypatch, "--no-state"),
        captured_router_config(monkeypatch, "--no-state", "--time-scale", "4"),
    )
    default, turns = QuarantineConfig(), WorkingSetConfig()
    assert plain.quarantine == default
    # the fast quarantine's window and hold are engine seconds, as in the simulator (scale 1)
    assert scaled.quarantine.window_seconds == default.window_seconds / 4
    assert scaled.quarantine.hold_seconds == default.hold_seconds / 4
    assert scaled.quarantine.min_window_tokens == default.min_window_tokens  # tokens are not time
    assert scaled.turns.hold_limit_s == turns.hold_limit_s / 4
    assert scaled.turns.fair_after_s == turns.fair_after_s / 4
    assert scaled.turns.prefill_tokens_per_s == pytest.approx(turns.prefill_tokens_per_s * 4)
