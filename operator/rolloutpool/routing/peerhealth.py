"""Which routers of a static fleet are up, and how the engines are split among them (pure).

A static fleet (``--peer-urls``, no Kubernetes) has no pod readiness to tell a dead router, so each
router probes its peers. :func:`observe` turns one probe's outcome into the peer's new state, with
hysteresis: ``down_after`` failures in a row take a peer off the ring, ``up_after`` answers in a
row put it back, so one slow answer neither drops a peer nor lets a flapping one bounce the ring.

:func:`failover_split` is the engine split over the routers that are up. It is a function of the
set of routers up alone (every router computes the same split from the same set): with everyone
up it is the fleet's full split; a router that is down has its engines handed to the survivors by
the operator's own :func:`~rolloutpool.routing.fleetsplit.assign_engines`, which moves nothing else,
so only the down router's sessions change owner (each is placed once by its new owner); when it
is up again it gets its engines back.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from rolloutpool.routing.fleetsplit import assign_engines

__all__ = ["PeerHealthConfig", "PeerState", "failover_split", "observe"]


@dataclass(frozen=True)
class PeerHealthConfig:
    """When a peer is taken off the ring and put back."""

    down_after: int = 2
    """Failed probes in a row after which a peer is down."""
    up_after: int = 2
    """Answered probes in a row after which a down peer is up again."""

    def __post_init__(self) -> None:
        if self.down_after < 1 or self.up_after < 1:
            raise ValueError("down_after and up_after must be >= 1")


@dataclass(frozen=True)
class PeerState:
    """One peer as a router sees it."""

    up: bool = True
    """On the ring (a peer is assumed up until probes say otherwise)."""
    streak: int = 0
    """Probes in a row that disagree with ``up`` (failures while up, answers while down)."""


def observe(state: PeerState, *, answered: bool, config: PeerHealthConfig) -> PeerState:
    """The peer's state after one probe (pure): consecutive failures take it down, answers bring it back."""
    if answered == state.up:
        return PeerState(up=state.up)
    streak = state.streak + 1
    if streak >= (config.down_after if state.up else config.up_after):
        return PeerState(up=not state.up)
    return PeerState(up=state.up, streak=streak)


def failover_split(*, engines: Iterable[str], peers: Collection[str], up: Collection[str]) -> dict[str, str]:
    """Engine -> router over the routers ``up`` (pure): the full split, less what a down router held, handed on.

    The same set ``up`` gives the same split on every router, whatever it saw before.
    """
    engine_list = list(engines)
    full = assign_engines(engines=engine_list, routers=peers, previous={})
    alive = [p for p in peers if p in up]
    kept = {engine: router for engine, router in full.items() if router in up}
    return assign_engines(engines=engine_list, routers=alive, previous=kept)
