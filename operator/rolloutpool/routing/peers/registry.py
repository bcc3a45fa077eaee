"""The peers' turn schedulers by name, and the placement each uses for new programs (pure)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rolloutpool.routing.peers.programs import ProgramScheduler
from rolloutpool.routing.peers.progress_ttl import ProgressTTL, ProgressTTLConfig
from rolloutpool.routing.peers.thunderagent import LeastWorkingSet, ThunderAgent, ThunderAgentConfig
from rolloutpool.routing.policies import Placement, Policy
from rolloutpool.routing.table import SessionTable

__all__ = ["SCHEDULERS", "LeastPrograms", "make_scheduler", "placement_for"]

SCHEDULERS: dict[str, Callable[..., ProgramScheduler]] = {
    "thunderagent": lambda **kw: ThunderAgent(ThunderAgentConfig(**kw)),
    "progress-ttl": lambda **kw: ProgressTTL(ProgressTTLConfig(**kw)),
}
"""Name -> factory taking the scheduler's config fields as keywords."""


def make_scheduler(name: str, config: dict[str, Any] | None = None) -> ProgramScheduler:
    """A fresh scheduler by name with these config fields; ValueError names what is wrong."""
    try:
        factory = SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown turn scheduler {name!r}; choose from {', '.join(SCHEDULERS)}") from None
    try:
        return factory(**(config or {}))
    except TypeError as exc:
        raise ValueError(f"turn scheduler {name!r}: {exc}") from None


class LeastPrograms:
    """``least_program_count``: the fewest live programs among ranks with room (Progress-TTL's binding)."""

    sticky = True
    capped = True

    def __init__(self, name: str) -> None:
        self.name = name

    def choose(self, request: Placement, table: SessionTable) -> str | None:
        least = table.least_eligible()
        return None if least is None else least.name


def placement_for(scheduler: ProgramScheduler) -> Policy:
    """The placement policy the peer uses for new programs."""
    if isinstance(scheduler, ThunderAgent):
        return LeastWorkingSet(scheduler)
    return LeastPrograms(scheduler.name)
