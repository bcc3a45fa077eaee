"""Placement policies: ours and faithful re-implementations of the peers' (pure).

A policy answers one question: which replica serves this request? Sticky policies
are asked only for a session's first turn (or after its replica vanished); the
caller then keeps the session on that replica. ``None`` means "no replica may take
it now": the caller queues the new session (admission) and asks again when a slot
frees. Only capped policies ever return ``None``.

The same code runs in ``rolloutpool simulate`` and in the router, so what we
simulate is what we ship.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass
from typing import Protocol

from rolloutpool.routing.table import ReplicaState, SessionTable

__all__ = [
    "POLICIES",
    "Clairvoyant",
    "ConsistentHash",
    "LeastInflightSticky",
    "Placement",
    "Policy",
    "RoundRobin",
    "SessionAware",
    "StickyLeastLoaded",
    "make_policy",
]


@dataclass(frozen=True)
class Placement:
    """The facts a policy may use about the request being placed."""

    session_id: str
    group: str | None = None
    projected_tokens: int = 0
    """Largest context the session will reach (only the clairvoyant reference knows it)."""
    prompt_tokens: int = 0
    """Prompt tokens of the first turn."""
    resident_tokens: int | None = None
    """A returning session's context still cached on its replica (KV events; the simulator's engine); None: unknown."""
    turns: bool = True
    """The router sees this session's turns; False for direct placement (``POST /v1/sessions``: the client talks to
    the engine itself), which the working set cannot account for and leaves out."""


class Policy(Protocol):
    """A placement policy."""

    name: str
    sticky: bool
    """Whether a session stays on the replica chosen for its first turn."""
    capped: bool
    """Whether it may refuse (queue) a new session."""

    def choose(self, request: Placement, table: SessionTable) -> str | None:
        """The replica for this request, or None to queue it."""
        ...


def _ready(table: SessionTable) -> list[ReplicaState]:
    return [r for r in table.replicas.values() if r.ready and not r.draining]


def _h64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class ConsistentHash:
    """A hash ring with virtual nodes per replica, keyed by session id (vllm-router ``consistent_hash``)."""

    sticky = False  # stable by construction: the ring gives the same replica every turn
    capped = False

    def __init__(self, virtual_nodes: int = 160) -> None:
        self.name = "consistent-hash"
        self.virtual_nodes = virtual_nodes
        self._ring_key: tuple[str, ...] = ()
        self._points: list[int] = []
        self._owners: list[str] = []

    def _ring(self, names: tuple[str, ...]) -> None:
        if names == self._ring_key:
            return
        pairs = sorted((_h64(f"{name}#{v}"), name) for name in names for v in range(self.virtual_nodes))
        self._points = [p for p, _ in pairs]
        self._owners = [n for _, n in pairs]
        self._ring_key = names

    def choose(self, request: Placement, table: SessionTable) -> str | None:
        names = tuple(r.name for r in _ready(table))
        if not names:
            return None
        self._ring(names)
        i = bisect.bisect(self._points, _h64(request.session_id)) % len(self._points)
        return self._owners[i]


class RoundRobin:
    """Every request to the next replica in turn, sessions ignored (vllm-router ``round_robin``)."""

    sticky = False
    capped = False

    def __init__(self) -> None:
        self.name = "round-robin"
        self._next = 0

    def choose(self, request: Placement, table: SessionTable) -> str | None:
        ready = _ready(table)
        if not ready:
            return None
        replica = ready[self._next % len(ready)]
        self._next += 1
        return replica.name


class LeastInflightSticky:
    """New sessions to the replica with the fewest in-flight requests, then sticky (verl's balancer)."""

    sticky = True
    capped = False

    def __init__(self) -> None:
        self.name = "least-inflight"

    def choose(self, request: Placement, table: SessionTable) -> str | None:
        ready = _ready(table)
        if not ready:
            return None
        return min(ready, key=lambda r: r.inflight).name


class StickyLeastLoaded:
    """New sessions to the fewest live sessions, no caps (vllm-router ``sticky_least_loaded``)."""

    sticky = True
    capped = False

    def __init__(self) -> None:
        self.name = "sticky-least-loaded"

    def choose(self, request: Placement, table: SessionTable) -> str | None:
        ready = _ready(table)
        if not ready:
            return None
        return min(ready, key=lambda r: r.live).name


class SessionAware:
    """Ours: fewest live sessions among replicas under their cap and not quarantined.

    With a group hint, a replica already holding members of the group is preferred
    while it is eligible (a GRPO group shares its prompt's cached blocks) and holds at
    most ``balance_slack`` live sessions more than the least loaded eligible replica:
    packing a whole group onto one replica of an underloaded fleet unbalances the decode
    batches, which costs more than prefilling the shared prompt once more elsewhere
    (``None``: no limit). The default, 0, makes the group a tie-break among the least loaded:
    in the simulator a slack of 2 cost 6 % against sticky least-loaded on 128k contexts at 1x
    (0.942, groups of 8 packed three to a replica) and 0.4 % on high-pressure at 1x, and gained
    nothing at 3x and 4x (agentic-grpo 1.181 / 1.368 with 2, 1.179 / 1.378 with 0). When no
    replica is eligible the session queues.
    """

    sticky = True
    capped = True

    def __init__(self, *, co_locate_groups: bool = True, balance_slack: int | None = 0) -> None:
        self.name = "rolloutpool"
        self.co_locate_groups = co_locate_groups
        self.balance_slack = balance_slack

    def choose(self, request: Placement, table: SessionTable) -> str | None:
        least = table.least_eligible()
        if least is None:
            return None
        if self.co_locate_groups and request.group is not None:
            members = table.group_members(request.group)
            slack = self.balance_slack
            best: tuple[int, int, int] | None = None
            choice = None
            for name, count in members.items():  # a group's replicas, not the fleet: O(group)
                r = table.replicas.get(name)
                if r is None or not r.accepts_new() or (slack is not None and r.live > least.live + slack):
                    continue
                key = (r.live, -count, table.order(name))  # fewest live, most members, then table order
                if best is None or key < best:
                    best, choice = key, name
            if choice is not None:
                return choice
        return least.name


class Clairvoyant:
    """Reference that knows each session's largest context: packs by projected KV tokens.

    A session's context grows from its prompt to its final length, so over its life it
    holds about the midpoint of the two; with sessions at every age a replica holds
    about the sum of their midpoints. A session goes to the replica with the most
    projected free KV, and only where that sum stays under the capacity less
    ``headroom``; otherwise it queues. This is our policy with each session's exact
    residency, which only a clairvoyant can know.
    """

    sticky = True
    capped = True

    def __init__(self, *, headroom: float = 0.1) -> None:
        self.name = "clairvoyant"
        self.headroom = headroom

    def choose(self, request: Placement, table: SessionTable) -> str | None:
        best: tuple[float, str] | None = None
        need = (request.prompt_tokens + request.projected_tokens) / 2
        for replica in _ready(table):
            if replica.kv_capacity_tokens is None or replica.quarantined:
                continue
            used = 0.0
            for sid in replica.sessions:
                s = table.sessions[sid]
                used += (s.prompt_tokens + s.projected_tokens) / 2
            free = replica.kv_capacity_tokens * (1 - self.headroom) - used
            if need <= free and (best is None or free > best[0]):
                best = (free, replica.name)
        return None if best is None else best[1]


POLICIES = ("consistent-hash", "round-robin", "least-inflight", "sticky-least-loaded", "rolloutpool", "clairvoyant")


def make_policy(name: str) -> Policy:
    """A fresh policy by name."""
    factories: dict[str, type] = {
        "consistent-hash": ConsistentHash,
        "round-robin": RoundRobin,
        "least-inflight": LeastInflightSticky,
        "sticky-least-loaded": StickyLeastLoaded,
        "rolloutpool": SessionAware,
        "clairvoyant": Clairvoyant,
    }
    try:
        policy: Policy = factories[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {list(POLICIES)}") from None
    return policy
