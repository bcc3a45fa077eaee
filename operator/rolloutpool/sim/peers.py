"""The peers' turn schedulers in the fleet simulator: names, placement, engines (pure).

``rolloutpool simulate --policy NAME`` and ``simulate-compare --variant NAME`` take:

- ``thunderagent``: ThunderAgent's program scheduler (Dynamo port's defaults), placing new programs on the
  smallest working set (:mod:`rolloutpool.routing.peers.thunderagent`);
- ``progress-ttl``: vllm-router's Progress-TTL program scheduling, ``least_program_count`` binding
  (:mod:`rolloutpool.routing.peers.progress_ttl`);
- ``continuum``: Continuum's TTL pinning in every engine, the paper's TTL, behind vllm-router's sticky
  least-loaded (:mod:`rolloutpool.engine.model.pins`); ``continuum-fixed``: the released code's 2 s.

They are not in the default lists: each costs a simulation. Sources and choices: ``docs/peers.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rolloutpool.engine.model.pins import PinConfig
from rolloutpool.routing.peers.programs import ProgramScheduler
from rolloutpool.routing.peers.registry import SCHEDULERS, make_scheduler, placement_for
from rolloutpool.routing.policies import Policy, StickyLeastLoaded

__all__ = ["PEERS", "PeerSetup", "peer_setup"]

CONTINUUM = {"continuum": "paper", "continuum-fixed": "fixed"}
PEERS: tuple[str, ...] = (*SCHEDULERS, *CONTINUUM)
"""The peers' policy names."""


@dataclass
class PeerSetup:
    """What a simulated fleet runs for one peer."""

    policy: Policy
    scheduler: ProgramScheduler | None = None
    """The per-turn scheduler in place of our working set (the ledger's), or None."""
    pins: PinConfig | None = None
    """Continuum's pinning in every engine, or None."""


def peer_setup(name: str) -> PeerSetup | None:
    """A fresh setup for a peer's policy name; None for a name that is not a peer's."""
    if name in SCHEDULERS:
        scheduler = make_scheduler(name)
        return PeerSetup(placement_for(scheduler), scheduler=scheduler)
    if name in CONTINUUM:
        policy = StickyLeastLoaded()
        policy.name = name
        return PeerSetup(policy, pins=PinConfig(rule=CONTINUUM[name]))
    return None
