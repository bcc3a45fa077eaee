"""Settings shared by the unit tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# Speed is measured in benchmarks, not in tests: on a shared, loaded machine hypothesis's
# generation-time health check and per-example deadline fail tests whose behaviour is fine.
settings.register_profile("shared-machine", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("shared-machine")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to test a compiled module (rolloutpool.sim.compiled) older than its source: Python would import the
    extension and the tests would run old code."""
    from rolloutpool.sim.compiled import stale, stale_message  # noqa: PLC0415

    if old := stale():
        pytest.exit(stale_message(old), returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture(scope="session", autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Routers started by tests keep their default snapshots here, never in the user's ~/.local/state."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state-home")))
    yield
    patch.undo()
