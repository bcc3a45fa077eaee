"""Weight updates are not eviction: who learns of one, and what it excuses (pure, no I/O).

RL trainers pause the engines, load new weights and resume; most flush the prefix
cache (vLLM's ``/pause`` clears it by default, ``/update_weights`` and
``/reset_prefix_cache`` too), and prime-rl salts requests with ``cache_salt`` = the
policy version instead, so a new version shares no cached block with the old one.
Either way every live session re-prefills its next turn. That re-prefill is expected:
it must not quarantine a replica, cut a cap, or count as evicted re-prefill.

How each component learns of an update:

- the router, of a flush: its own fan-out (``/admin/rl/...``) calls :meth:`WeightTracker.flushed`
  for each replica a flushing call succeeded on (:func:`call_flushes`); a trainer that calls
  the engines directly shows in the engines' ``vllm:rl_weight_update_operation_duration_seconds_count``,
  which the router's scrape reads (:func:`flush_operations_total`; a count that grew is a flush);
- the router, of a new salt: each request's ``cache_salt`` (:meth:`WeightTracker.note_salt`);
- the operator's law: the same engine metrics over its window in Prometheus
  (``ReplicaSignals.weight_updates``); with an update in the window the law holds (:func:`law_holds`);
- the simulator: it performs the updates and drives the same :class:`WeightTracker`.

What is excused: a session's first turn after a flush of its replica, or its first
turn with a new salt (:func:`reprefill_excuse`), is measured but not counted as
eviction; for ``grace_s`` after a flush the scrape's waiting queue and preemptions
(the burst of re-prefills) raise no fast quarantine (:func:`observe_scrape_excused`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rolloutpool.api.vllm_metrics import RL_WEIGHT_UPDATE_OPS_COUNT
from rolloutpool.routing.pressure import PressureReason
from rolloutpool.routing.quarantine import PressureState

__all__ = [
    "FLUSHING_OPERATIONS",
    "TurnMark",
    "WeightConfig",
    "WeightTracker",
    "call_flushes",
    "flush_operations_total",
    "law_holds",
    "observe_scrape_excused",
    "reprefill_excuse",
]

FLUSHING_OPERATIONS = frozenset({"pause", "update_weights", "reset_prefix_cache"})
"""``operation`` labels of ``vllm:rl_weight_update_*`` that may clear the prefix cache."""

_OPS_COUNT = RL_WEIGHT_UPDATE_OPS_COUNT

TurnMark = tuple[str, int, str | None]
"""What a session's last answered turn left: (replica, the replica's flush epoch when it ended, cache_salt)."""


def call_flushes(call: str, query: Mapping[str, str]) -> bool:
    """Whether a weight-sync call clears the prefix cache (vLLM 0.32 semantics) (pure)."""
    if call in {"update_weights", "reset_prefix_cache"}:
        return True
    if call == "pause":
        return query.get("clear_cache", "true").strip().lower() not in {"0", "false", "no"}
    return False


def reprefill_excuse(*, previous: TurnMark | None, replica: str, epoch: int, salt: str | None) -> str | None:
    """Why a turn's cache shortfall is expected, or None (then it is eviction) (pure).

    ``WeightUpdate``: the replica's cache was flushed since the session's previous turn
    ended there (between the turns, or while this turn waited in a paused engine).
    ``CacheSaltChanged``: the turn carries another ``cache_salt`` than the previous one. A
    first turn has nothing to compare with (None: it is not measured anyway).
    """
    if previous is None:
        return None
    prev_replica, prev_epoch, prev_salt = previous
    if prev_replica == replica and epoch > prev_epoch:
        return "WeightUpdate"
    if salt != prev_salt:
        return "CacheSaltChanged"
    return None


def flush_operations_total(metrics_text: str) -> float | None:
    """Sum of the flushing operations' counts in an engine's ``/metrics`` text; None without the metric (pure)."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        if not line.startswith(_OPS_COUNT):
            continue
        name, _, rest = line.partition("{")
        if name != _OPS_COUNT:
            continue
        labels, _, value = rest.rpartition("}")
        operation = next(
            (part.split("=", 1)[1].strip('"') for part in labels.split(",") if part.strip().startswith("operation=")),
            None,
        )
        if operation not in FLUSHING_OPERATIONS:
            continue
        try:
            total += float(value.split()[0])
        except (IndexError, ValueError):
            continue
        seen = True
    return total if seen else None


def law_holds(*, weight_updates: float | None, reason: str | None) -> bool:
    """Whether the operator's law should hold (no cut, no quarantine) instead of acting on ``reason`` (pure).

    ``weight_updates`` counts the flushing weight-sync operations the replica's engines
    ran in the law's window. The queue and the preemptions of such a window are the
    expected burst of re-prefills after the resume. Live-prefix eviction is not held: the
    router already leaves an update's re-prefill out of that counter, so what remains is real.
    """
    return reason in _BURST_REASONS and (weight_updates or 0.0) > 0


_BURST_REASONS = frozenset({PressureReason.PREEMPTING, PressureReason.QUEUEING})


def observe_scrape_excused(state: PressureState, *, now: float, preemptions_total: float) -> None:
    """Feed a scrape taken in the grace after a flush: nothing raises pressure, an old quarantine may lift."""
    state.last_preemptions = preemptions_total  # the burst's preemptions are expected
    state.observe_scrape(now=now, preemptions_total=preemptions_total, waiting=0.0)


@dataclass(frozen=True)
class WeightConfig:
    """How long a flush excuses scrape-based pressure."""

    grace_s: float = 60.0
    """After a flush, waiting queues and preemptions on the replica raise no fast quarantine for this long."""


@dataclass
class WeightTracker:
    """Flush epochs per replica and each live session's last turn (pure state, driven by router and simulator)."""

    config: WeightConfig = field(default_factory=WeightConfig)
    epochs: dict[str, int] = field(default_factory=dict)
    flushed_at: dict[str, float] = field(default_factory=dict)
    flushes: int = 0
    """Replica flushes seen (cumulative)."""
    excused_turns: int = 0
    """Turns whose shortfall was excused (cumulative)."""
    _turns: dict[str, TurnMark] = field(default_factory=dict)
    _salts: dict[str, str | None] = field(default_factory=dict)
    _engine_ops: dict[str, float] = field(default_factory=dict)

    def flushed(self, replica: str, *, now: float) -> None:
        """The replica's prefix cache was cleared (a weight update)."""
        self.epochs[replica] = self.epochs.get(replica, 0) + 1
        self.flushed_at[replica] = now
        self.flushes += 1

    def observe_engine_ops(self, replica: str, total: float | None, *, now: float) -> bool:
        """An engine's flushing-operation count from a scrape; returns whether it grew (then: a flush).

        No such metric counts as zero (vLLM creates a series at its first operation); the
        first scrape of a replica is the baseline.
        """
        total = total or 0.0
        before = self._engine_ops.get(replica)
        self._engine_ops[replica] = total
        if before is not None and total > before:
            self.flushed(replica, now=now)
            return True
        return False

    def in_grace(self, replica: str, *, now: float) -> bool:
        """Whether the replica was flushed less than ``grace_s`` ago."""
        at = self.flushed_at.get(replica)
        return at is not None and now - at < self.config.grace_s

    def note_salt(self, session_id: str, salt: object) -> None:
        """The ``cache_salt`` of a session's next turn (any non-string counts as none)."""
        self._salts[session_id] = salt if isinstance(salt, str) and salt else None

    def excuse(self, session_id: str, replica: str) -> str | None:
        """A session's turn on ``replica`` was answered: why it may fall short of its cached context, or None.

        Call it for every answered turn, measured or not (a first turn too): it leaves the
        mark the next turn is compared with.
        """
        epoch = self.epochs.get(replica, 0)
        salt = self._salts.pop(session_id, None)
        reason = reprefill_excuse(previous=self._turns.get(session_id), replica=replica, epoch=epoch, salt=salt)
        self._turns[session_id] = (replica, epoch, salt)
        if reason is not None:
            self.excused_turns += 1
        return reason

    def forget(self, session_id: str) -> None:
        """The session is no longer live (a reused id starts afresh)."""
        self._turns.pop(session_id, None)
        self._salts.pop(session_id, None)

    def forget_replica(self, replica: str) -> None:
        """The replica left."""
        self.epochs.pop(replica, None)
        self.flushed_at.pop(replica, None)
        self._engine_ops.pop(replica, None)
