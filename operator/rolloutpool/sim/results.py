"""What a simulated run measured, and how it is summarised (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rolloutpool.engine.model.core import Engine

if TYPE_CHECKING:
    from rolloutpool.sim.adaptive import AdaptiveTargets, ControlPoint
    from rolloutpool.sim.config import FleetConfig
    from rolloutpool.sim.renewal import RenewalTotals

__all__ = ["RunResult", "Sample", "summarize"]


@dataclass(frozen=True)
class Sample:
    """One replica at one sampling instant."""

    t: float
    replica: str
    live: int
    hit_ratio: float | None
    usage: float
    quarantined: bool
    queued: int


@dataclass
class RunResult:
    """The measured figures of one policy at one offered load."""

    policy: str
    scenario: str
    in_flight: int
    replicas: int
    duration_s: float
    cap: int | None
    generated_tokens: int
    tokens_per_s: float
    completed: int
    completed_per_hour: float
    reprefilled_tokens: int
    evicted_reprefill_tokens: int
    preemptions: int
    prefix_hit_ratio: float
    p50_trajectory_s: float | None
    p90_trajectory_s: float | None
    max_live_per_replica: int
    mean_live_per_replica: float
    quarantines: int
    cache_evicted_blocks: int
    """Cached blocks evicted to make room (any session's, live or finished: stock vLLM's LRU churn)."""
    samples: list[Sample] = field(default_factory=list, repr=False)
    mean_target: float | None = None
    """Adaptive policy: the mean per-replica working-set target over the run's control steps."""
    law_cuts: int | None = None
    """Adaptive policy: target cuts the control law made."""
    law_quarantines: int | None = None
    """Adaptive policy: quarantines the control law entered (the fast loop's are ``quarantines``)."""
    control: list[ControlPoint] = field(default_factory=list, repr=False)
    """Adaptive policy: every replica's decision at every control step."""
    prefilled_tokens: int = 0
    """Prompt tokens computed (queried minus prefix-cache hits): the share ``reprefilled_tokens`` is of it."""
    renewals: int | None = None
    """With prefix renewal: renewal requests sent (their tokens, queries and hits are left out of the figures)."""
    weight_updates: int | None = None
    """Weight-update scenario: updates (pause, flush, resume) in the run."""
    update_reprefill_tokens: int | None = None
    """Weight-update scenario: live sessions' context re-prefilled after a flush (expected, not evicted)."""
    update_false_evicted_tokens: int | None = None
    """Weight-update scenario: update re-prefill counted as evicted (nonzero only when updates are unannounced)."""
    update_false_quarantines: int | None = None
    """Weight-update scenario: fast quarantines entered on an update's re-prefill or burst."""
    update_law_cuts: int | None = None
    """Weight-update scenario, adaptive policy: the law's cuts on pressure within its window after a flush."""

    def row(self) -> dict[str, Any]:
        """The figures without the time series (for tables and JSON); adaptive-only figures when set."""
        data = asdict(self)
        data.pop("samples")
        data.pop("control")
        for key in ("mean_target", "law_cuts", "law_quarantines", "renewals"):
            if data[key] is None:
                data.pop(key)
        return data


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(
    *,
    policy: str,
    config: FleetConfig,
    engines: list[Engine],
    completed_times: list[float],
    reprefilled: int,
    evicted_reprefill: int,
    quarantines: int,
    samples: list[Sample],
    cap: int | None,
    law: AdaptiveTargets | None = None,
    renewals: RenewalTotals | None = None,
) -> RunResult:
    """Fold engine counters and router observations into one result (pure); renewals' own counts are left out."""
    generated = sum(e.counters.generation_tokens for e in engines)
    queries = sum(e.counters.prefix_queries for e in engines)
    hits = sum(e.counters.prefix_hits for e in engines)
    if renewals is not None:
        generated -= renewals.generated
        queries -= renewals.prefix_queries
        hits -= renewals.prefix_hits
    lives = [s.live for s in samples]
    hours = config.duration_s / 3600
    return RunResult(
        policy=policy,
        scenario=config.scenario.name,
        in_flight=config.in_flight,
        replicas=config.replicas,
        duration_s=config.duration_s,
        cap=cap,
        generated_tokens=generated,
        tokens_per_s=generated / config.duration_s,
        completed=len(completed_times),
        completed_per_hour=len(completed_times) / hours,
        reprefilled_tokens=reprefilled,
        evicted_reprefill_tokens=evicted_reprefill,
        preemptions=sum(e.counters.preemptions for e in engines),
        prefix_hit_ratio=hits / queries if queries else 0.0,
        p50_trajectory_s=_pct(completed_times, 50),
        p90_trajectory_s=_pct(completed_times, 90),
        max_live_per_replica=max(lives, default=0),
        mean_live_per_replica=float(np.mean(lives)) if lives else 0.0,
        quarantines=quarantines,
        cache_evicted_blocks=sum(e.pool.evictions for e in engines),
        samples=samples,
        mean_target=float(np.mean([p.target for p in law.points])) if law is not None and law.points else None,
        law_cuts=None if law is None else law.cuts,
        law_quarantines=None if law is None else law.quarantines,
        control=[] if law is None else law.points,
        renewals=None if renewals is None else renewals.sent,
        prefilled_tokens=queries - hits,
    )
