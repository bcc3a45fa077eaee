"""Settings shared by the unit tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from rolloutpool.native import prefer_sources

# The tests import the simulator's pure Python, the reference, even where it is compiled (rolloutpool.native; the
# processes they start run the build while it is current, and tests/test_sim_compiled.py compares the two).
prefer_sources()

# Speed is measured in benchmarks, not in tests: on a shared, loaded machine hypothesis's
# generation-time health check and per-example deadline fail tests whose behaviour is fine.
settings.register_profile("shared-machine", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("shared-machine")


@pytest.fixture(scope="session", autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Routers started by tests keep their default snapshots here, never in the user's ~/.local/state."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state-home")))
    yield
    patch.undo()
