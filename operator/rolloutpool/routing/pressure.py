"""Why a replica is under KV pressure: one name per reason for the router, the control law and the status (pure).

The router's fast loop (``routing.quarantine``), its ``rolloutpool_router_replica_pressure{reason}``
metric, the operator's control law (``autoscale.law``) and the pool's ``replicaStatus`` reasons all
use these values.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["LEGACY_SPELLINGS", "PressureReason", "pressure_reason_named"]


class PressureReason(StrEnum):
    """A kind of KV pressure, most telling first."""

    EVICTING = "Evicting"
    """Live sessions' prefixes were evicted: returning sessions re-prefill what they had."""
    PREEMPTING = "Preempting"
    """The engine preempts running requests (it ran out of KV blocks mid-decode)."""
    QUEUEING = "Queueing"
    """Requests wait in the engine's queue: the symptom that follows the two above."""


LEGACY_SPELLINGS: dict[str, PressureReason] = {"LivePrefixEviction": PressureReason.EVICTING}
"""Other spellings of a reason a stored status may carry (the control law's ``reason``), read as the reason named."""


def pressure_reason_named(text: str | None) -> PressureReason | None:
    """The pressure reason ``text`` names (canonical or in :data:`LEGACY_SPELLINGS`), None for any other text (pure)."""
    if text is None:
        return None
    legacy = LEGACY_SPELLINGS.get(text)
    if legacy is not None:
        return legacy
    try:
        return PressureReason(text)
    except ValueError:
        return None
