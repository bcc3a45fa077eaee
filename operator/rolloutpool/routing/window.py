"""A sum of timed amounts over a sliding window (pure): the evicted re-prefill the fast quarantine and the
eviction budget each measure."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["WindowSum"]


@dataclass
class WindowSum:
    """The amounts added within the last ``seconds`` and their total."""

    seconds: float
    total: int = 0
    _items: deque[tuple[float, int]] = field(default_factory=deque, repr=False)

    def add(self, amount: int, *, now: float) -> int:
        """Add ``amount`` at ``now``; the total within the window that ends at ``now``."""
        self._items.append((now, amount))
        self.total += amount
        return self.trim(now)

    def trim(self, now: float) -> int:
        """Forget what is older than the window that ends at ``now``; the total of the rest."""
        horizon = now - self.seconds
        while self._items and self._items[0][0] < horizon:
            self.total -= self._items.popleft()[1]
        return self.total
