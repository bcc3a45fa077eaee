"""Settings shared by the unit tier."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# Speed is measured in benchmarks, not in tests: on a shared, loaded machine hypothesis's
# generation-time health check and per-example deadline fail tests whose behaviour is fine.
settings.register_profile("shared-machine", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("shared-machine")
