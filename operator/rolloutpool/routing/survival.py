"""A quantile of final contexts that counts the sessions still running (pure).

The first rollouts to finish are the short ones: a quantile of finished sessions' final contexts alone says
"contexts stay short" while the long rollouts of a bimodal mix are still growing. A session still live holds at
least its current context at the end, so it is a right-censored observation of its final one; the Kaplan-Meier
estimate over the finished (events) and the live (censored at their current contexts) corrects for that survivorship,
and it has no quantile at all while too many sessions are still running past every finished context.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable

__all__ = ["censored_quantile"]


def censored_quantile(*, finished: Iterable[float], live: Iterable[float], q: float) -> float | None:
    """The ``q`` quantile of final contexts by Kaplan-Meier, or None where the estimate does not reach it (pure).

    ``finished``: final contexts of finished sessions; ``live``: current contexts of sessions still running (each
    will end at least there). The quantile is the smallest finished context at which the estimated share of sessions
    ending beyond it falls to ``1 - q`` or below. A live session at a context counts as at risk there (censored
    after the events at the same context). None while no finished session is known or the share never falls that far.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    events = sorted(finished)
    censored = sorted(live)
    survival, i = 1.0, 0
    while i < len(events):
        value = events[i]
        same = bisect_right(events, value, lo=i)
        at_risk = len(events) - i + len(censored) - bisect_left(censored, value)  # still running at ``value``
        survival *= 1.0 - (same - i) / at_risk
        if survival <= 1.0 - q + 1e-12:
            return value
        i = same
    return None
