"""The effective live-session cap of one replica: the one function every caller uses (pure).

Turns are scheduled by each replica's working set (:mod:`rolloutpool.routing.workingset`); a cap on
live sessions is only a ceiling over it, from up to three places combined here and nowhere else:

- a cap fixed on the router (a replica's own ``cap``, else the router's ``--cap``): a hard limit,
  also what a hindsight sweep of fixed caps sets;
- ``ceiling`` (``maxSessionsPerReplica``, ``--cap-ceiling``);
- the operator's cap (the RolloutPool status), for drains.

They combine by taking the tightest. Under them the working set decides: a replica takes a new session
while its working set has room for one (``room``, what :meth:`~rolloutpool.routing.workingset.WorkingSet.room_for_new`
says; None for an engine that reports no KV capacity: the router scrapes every replica before it serves, so a
real vLLM or engine-sim is known by the first request, and an engine that never reports one is placed on by
the ceilings alone).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CapRule", "effective_cap"]


@dataclass(frozen=True)
class CapRule:
    """How a router (or the simulated one) limits live sessions; the same for every replica."""

    fixed: int | None = None
    """Fixed cap per replica (``--cap``); a replica's own cap overrides it."""
    ceiling: int | None = None
    """Hard limit on live sessions per replica (``maxSessionsPerReplica``)."""


def _tighter(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def effective_cap(
    rule: CapRule,
    *,
    replica_cap: int | None = None,
    live: int = 0,
    room: int | None = None,
) -> int | None:
    """The live-session cap a replica gets; None means no limit (pure).

    ``replica_cap`` is the replica's own fixed cap, ``live`` its live sessions and ``room`` how many more its
    working set takes (None: no working set, as the peers' policies in the simulator).
    """
    fixed = replica_cap if replica_cap is not None else rule.fixed
    cap = _tighter(fixed, rule.ceiling)
    return cap if room is None else _tighter(cap, live + room)
