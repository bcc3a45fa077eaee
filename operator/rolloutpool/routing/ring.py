"""A weighted consistent-hash ring (pure): which member owns a key.

Every router of a fleet builds the same ring from the same inputs, so every router names the
same owner for a session id without talking to the others (the fleet's ring has one member per
engine, see :mod:`rolloutpool.routing.fleetview`). A member with weight ``w`` puts
``w * points_per_weight`` points on the ring, so its share of keys follows its weight. Adding a
member only takes keys to it, and removing one only moves its own keys: the minimal movement of
consistent hashing.

Points and keys are 64-bit BLAKE2b digests, stable across processes and Python versions
(Python's ``hash`` is salted per process and would give every router another ring).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from collections.abc import Mapping

__all__ = ["POINTS_PER_WEIGHT", "HashRing", "stable_hash"]

POINTS_PER_WEIGHT = 100
"""Ring points per unit of weight (per engine): 100 keep a member's share within ~10 % of its weight's."""


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text``, the same in every process (pure)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=16384)
def _points(member: str, count: int) -> tuple[int, ...]:
    """The ring points of one member (cached: a fleet view is rebuilt on every pod event)."""
    return tuple(stable_hash(f"{member}#{i}") for i in range(count))


class HashRing:
    """An immutable weighted consistent-hash ring over member names (pure).

    ``weights`` maps a member to its weight (its engine count); members of weight 0 or less
    are left out. An empty ring owns nothing (:meth:`owner` returns None).
    """

    def __init__(self, weights: Mapping[str, int], *, points_per_weight: int = POINTS_PER_WEIGHT) -> None:
        if points_per_weight < 1:
            raise ValueError(f"points_per_weight must be >= 1, got {points_per_weight}")
        self.weights: dict[str, int] = {m: int(w) for m, w in sorted(weights.items()) if w > 0}
        points: list[tuple[int, str]] = []
        for member, weight in self.weights.items():
            points += [(h, member) for h in _points(member, weight * points_per_weight)]
        points.sort()
        self._hashes = [h for h, _ in points]
        self._owners = [m for _, m in points]

    def __len__(self) -> int:
        return len(self.weights)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashRing) and self.weights == other.weights and self._hashes == other._hashes

    def __hash__(self) -> int:
        return hash(tuple(self.weights.items()))

    def __repr__(self) -> str:
        return f"HashRing({self.weights!r})"

    @property
    def members(self) -> list[str]:
        """The members on the ring, sorted."""
        return list(self.weights)

    def owner(self, key: str) -> str | None:
        """The member owning ``key``: the first point at or after the key's hash, wrapping (pure)."""
        if not self._hashes:
            return None
        i = bisect.bisect_left(self._hashes, stable_hash(key))
        return self._owners[i % len(self._owners)]
