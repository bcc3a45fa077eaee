"""The weight-update scenario of ``rolloutpool simulate``: pause, flush and resume every N simulated minutes.

What an RL trainer does between two policy versions, with vLLM 0.32's ``/pause?mode=wait``:
at each update the router stops handing requests to the engines (they are held, as
vLLM holds them while paused), the requests already in an engine run to their end,
and once every engine is idle each one's prefix cache is reset (``reset_prefix_cache``)
and the new weights load for ``load_s``; then the held requests go out again. Every
live session re-prefills its next turn.

That re-prefill is expected. The simulator drives the router's own
:class:`~rolloutpool.routing.weights.WeightTracker`: it learns of each flush as the
router does from its fan-out, a session's first turn after the flush is measured but
not counted as evicted re-prefill (nor fed to the fast quarantine), scrapes within the
grace after a flush raise no fast quarantine, and the adaptive law sees the update in
its window (``ReplicaSignals.weight_updates``) and holds. ``excuse=False`` turns all of
that off: the control run that shows what the updates would cost without it.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rolloutpool.engine.model.core import Request
from rolloutpool.routing.pressure import PressureReason
from rolloutpool.routing.weights import WeightConfig, WeightTracker

if TYPE_CHECKING:
    from rolloutpool.engine.model.core import Engine
    from rolloutpool.sim.adaptive import AdaptiveTargets
    from rolloutpool.sim.results import RunResult

__all__ = [
    "SimWeightUpdates",
    "WeightUpdateConfig",
    "WeightUpdateTotals",
    "law_cuts_after_flushes",
    "weight_update_lines",
]


@dataclass(frozen=True)
class WeightUpdateConfig:
    """When and how long the simulated trainer updates the weights."""

    every_s: float
    """Simulated seconds between two updates (an RL step)."""
    load_s: float = 20.0
    """Simulated seconds the new weights take to load once every engine is idle."""
    excuse: bool = True
    """Tell the router, the fast quarantine and the law of each update (False: the control run)."""
    grace_s: float = 60.0
    """After a flush, scrape pressure (waiting, preemptions) raises no fast quarantine for this long."""

    def __post_init__(self) -> None:
        if not self.every_s > 0 or self.load_s < 0 or self.grace_s < 0:
            raise ValueError("every_s must be positive, load_s and grace_s non-negative")


@dataclass
class WeightUpdateTotals:
    """What the updates did over a run."""

    updates: int = 0
    paused_s: float = 0.0
    """Simulated seconds the engines took no new request (drain plus load), summed over updates."""
    update_reprefill_tokens: int = 0
    """Live sessions' context re-prefilled after a flush (expected; not evicted re-prefill)."""
    held_requests: int = 0
    false_evicted_tokens: int = 0
    """Update re-prefill counted as evicted re-prefill (only when the updates are not announced)."""
    false_quarantines: int = 0
    """Fast quarantines an update's re-prefill or its burst entered (only when not announced)."""


@dataclass
class SimWeightUpdates:
    """The scenario's state inside one fleet run; the fleet calls it at a few hooks."""

    config: WeightUpdateConfig
    names: list[str]
    tracker: WeightTracker = field(init=False)
    totals: WeightUpdateTotals = field(default_factory=WeightUpdateTotals)
    pausing: bool = False
    paused_at: float = 0.0
    flushed: bool = False
    held: deque[tuple[str, Request]] = field(default_factory=deque)
    flush_times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tracker = WeightTracker(WeightConfig(grace_s=self.config.grace_s))

    # -- the trainer ------------------------------------------------------------------------

    def pause(self, *, now: float) -> None:
        """An update starts: hold new requests (the fleet calls :meth:`try_flush` next)."""
        self.pausing, self.flushed, self.paused_at = True, False, now
        self.totals.updates += 1

    def try_flush(self, engines: dict[str, Engine], *, now: float) -> float | None:
        """Once every engine is idle: reset every prefix cache; returns when to resume (None: not yet).

        The tracker learns of every flush, announced or not: unannounced, it only attributes costs.
        """
        if not self.pausing or self.flushed or any(e.has_work for e in engines.values()):
            return None
        for name, engine in engines.items():
            if not engine.pool.reset_prefix_cache():  # pragma: no cover - idle engines hold no block
                raise RuntimeError(f"replica {name} held blocks while idle")
            self.tracker.flushed(name, now=now)
        self.flushed = True
        self.flush_times.append(now)
        return now + self.config.load_s

    def resume(self, *, now: float) -> list[tuple[str, Request]]:
        """The update is over: the held requests, in arrival order, to send out again."""
        self.pausing = False
        self.totals.paused_s += now - self.paused_at
        held = list(self.held)
        self.held.clear()
        return held

    # -- hooks of the fleet -------------------------------------------------------------------

    def hold(self, replica: str, request: Request) -> bool:
        """Whether a request must wait for the end of the update (then it is kept here)."""
        if not self.pausing:
            return False
        self.held.append((replica, request))
        self.totals.held_requests += 1
        return True

    def attribute_turn(
        self, session_id: str, replica: str, *, excused: bool, missed: int, live: int, entered: int
    ) -> None:
        """Count what an answered request's update re-prefill cost.

        Announced, the ledger itself excused the turn (``excused``: its tracker is this one).
        Unannounced (the control run), the ledger knows of no flush and counts the miss as
        eviction (``live`` tokens, ``entered`` fast quarantines); this tracker, which saw every
        flush, attributes those to the update.
        """
        if self.config.excuse:
            if excused:
                self.totals.update_reprefill_tokens += missed
            return
        if self.tracker.excuse(session_id, replica) is None:
            return
        self.totals.update_reprefill_tokens += missed
        self.totals.false_evicted_tokens += live
        self.totals.false_quarantines += entered

    def attribute_scrape(self, name: str, *, now: float, entered: int) -> None:
        """Unannounced, fast quarantines a scrape entered in the grace after a flush are the update's."""
        if not self.config.excuse and self.tracker.in_grace(name, now=now):
            self.totals.false_quarantines += entered

    def annotate(self, result: RunResult, *, law: AdaptiveTargets | None) -> RunResult:
        """The run's result with the scenario's figures."""
        t = self.totals
        cuts = None
        if law is not None:
            points = [(p.t, p.replica, p.target, p.reason) for p in law.points]
            cuts = law_cuts_after_flushes(points, self.flush_times, window_s=law.params.rate_window_seconds)
        return dataclasses.replace(
            result,
            weight_updates=t.updates,
            update_reprefill_tokens=t.update_reprefill_tokens,
            update_false_evicted_tokens=t.false_evicted_tokens,
            update_false_quarantines=t.false_quarantines,
            update_law_cuts=cuts,
        )

    def weight_updates(self, *, now: float, window_s: float) -> float | None:
        """Flushes within the law's window ending at ``now`` (what Prometheus would show); None when not told."""
        if not self.config.excuse:
            return None
        return float(sum(1 for t in self.flush_times if now - window_s <= t <= now))


def weight_update_lines(runs: list[tuple[float, RunResult]]) -> list[str]:
    """One line per run of the weight-update scenario: what the updates cost and whether anything false fired."""
    lines = []
    for load, r in runs:
        if r.weight_updates is None:
            continue
        cuts = "-" if r.law_cuts is None else str(r.law_cuts)
        law_q = "-" if r.law_quarantines is None else str(r.law_quarantines)
        lines.append(
            f"load {load:g}x {r.policy}: updates {r.weight_updates}, update re-prefill {r.update_reprefill_tokens} "
            f"tokens; caused by updates: evicted re-prefill {r.update_false_evicted_tokens} tokens, fast "
            f"quarantines {r.update_false_quarantines}, law cuts {r.update_law_cuts}; run totals: evicted "
            f"re-prefill {r.evicted_reprefill_tokens} tokens, fast quarantines {r.quarantines}, law cuts {cuts}, "
            f"law quarantines {law_q}"
        )
    return lines


def law_cuts_after_flushes(
    points: list[tuple[float, str, float, str | None]], flush_times: list[float], *, window_s: float
) -> int:
    """Target cuts the law made within ``window_s`` after a flush on the burst a resume causes (pure).

    ``points`` are (time, replica, target, reason) in time order. A hold (reason ``WeightUpdate``)
    is no cut. A cut on queueing or preemptions inside the window is one the update caused;
    a cut on live-prefix eviction is not: the update's own re-prefill is left out of that signal.
    """
    last: dict[str, float] = {}
    cuts = 0
    for t, replica, cap, reason in points:
        before = last.get(replica)
        last[replica] = cap
        if before is None or cap >= before or reason not in {PressureReason.QUEUEING, PressureReason.PREEMPTING}:
            continue
        if any(0 <= t - f <= window_s for f in flush_times):
            cuts += 1
    return cuts
