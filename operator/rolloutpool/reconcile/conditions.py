"""Kubernetes-style conditions and the Events a status change deserves (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from rolloutpool.api.status import Condition, ConditionStatus, ReplicaStatus, RolloutPoolStatus
from rolloutpool.routing.pressure import LEGACY_SPELLINGS, PressureReason

__all__ = [
    "CONDITION_TYPES",
    "EventIntent",
    "EventType",
    "events_between",
    "find_condition",
    "quarantine_detail",
    "quarantine_word",
    "set_condition",
]

CONDITION_TYPES = ("Ready", "Progressing", "Degraded", "ReplicasQuarantined", "MetricsAvailable")
"""Every condition the operator writes, in the order it writes them."""

EventType = Literal["Normal", "Warning"]

_WORDS = {
    **{reason.value: reason.value.lower() for reason in PressureReason},
    **{legacy: reason.value.lower() for legacy, reason in LEGACY_SPELLINGS.items()},
    "Draining": "draining",
    "Drained": "drained",
    "DrainTimeout": "drain timed out",
    "Terminating": "terminating",
    "NoMetrics": "no metrics",
}
_DRAIN_END = frozenset({"Drained", "DrainTimeout"})
_LIFECYCLE = frozenset({"Draining", "Terminating"}) | _DRAIN_END


@dataclass(frozen=True)
class EventIntent:
    """A Kubernetes Event to emit on the RolloutPool."""

    reason: str
    """CamelCase: ReplicaQuarantined, ReplicaReleased, CapChanged, DrainStarted, DrainEnded."""
    message: str
    type: EventType = "Normal"
    replica: str | None = None
    """The engine pod the event is about."""


def quarantine_word(reason: str | None) -> str:
    """A replica's quarantine reason as a word for messages: ``Evicting`` -> ``evicting`` (pure)."""
    if not reason:
        return "unknown"
    return _WORDS.get(reason, reason[:1].lower() + reason[1:])


def quarantine_detail(entry: ReplicaStatus) -> str:
    """Why and by whom a replica is quarantined, for messages (pure).

    ``evicting`` (the operator's decision, which the routers obey), ``evicting; router`` (a router's
    own fast quarantine), ``evicting; operator and router``, or ``draining; router: evicting``.
    """
    operator = quarantine_word(entry.reason) if entry.quarantined else None
    router = quarantine_word(entry.router_reason) if entry.router_quarantined else None
    if router is None:
        return operator or "not quarantined"
    if operator is None:
        return f"{router}; router"
    return f"{operator}; operator and router" if operator == router else f"{operator}; router: {router}"


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of a type, if present (pure)."""
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: Sequence[Condition],
    *,
    type: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    observed_generation: int | None,
    now: datetime,
) -> list[Condition]:
    """The conditions with one set (pure; returns a new list, other conditions untouched).

    ``lastTransitionTime`` keeps its old value unless ``status`` flips (or the condition is new);
    reason, message and ``observedGeneration`` always take the new values.
    """
    old = find_condition(conditions, type)
    since = old.last_transition_time if old is not None and old.status == status else now
    new = Condition(
        type=type,
        status=status,
        reason=reason,
        message=message,
        observed_generation=observed_generation,
        last_transition_time=since,
    )
    if old is None:
        return [*conditions, new]
    return [new if c.type == type else c for c in conditions]


def _pressure(entry: ReplicaStatus | None) -> bool:
    return entry is not None and entry.quarantined and entry.reason not in _LIFECYCLE


def _held(entry: ReplicaStatus | None) -> bool:
    """Quarantined for pressure, by the operator's law or by a router's fast loop."""
    return _pressure(entry) or (entry is not None and entry.router_quarantined)


def _drain_events(name: str, before: ReplicaStatus | None, after: ReplicaStatus) -> list[EventIntent]:
    was_draining = before is not None and before.reason == "Draining"
    if after.reason == "Draining" and not was_draining:
        return [
            EventIntent("DrainStarted", f"Started draining {name}: {after.live_sessions} live sessions", "Normal", name)
        ]
    if after.reason in _DRAIN_END and (before is None or before.reason not in _DRAIN_END):
        if after.reason == "DrainTimeout":
            message = f"Drain of {name} timed out with {after.live_sessions} live sessions; deleting it"
            return [EventIntent("DrainEnded", message, "Warning", name)]
        return [EventIntent("DrainEnded", f"Drained {name}; deleting it", "Normal", name)]
    if was_draining and after.reason not in _LIFECYCLE:
        return [EventIntent("DrainEnded", f"Stopped draining {name}: it is wanted again", "Normal", name)]
    return []


def events_between(previous: RolloutPoolStatus | None, current: RolloutPoolStatus) -> list[EventIntent]:
    """Events for what changed per replica from one status to the next (pure).

    A replica quarantined or released for pressure (by the control law or by a router: one
    ``ReplicaQuarantined`` when the first of them quarantines it, one ``ReplicaReleased`` when the
    last lets go; a router quarantine flapping every few seconds is smoothed by the status, which
    keeps ``routerQuarantined`` for a while), a cap that moved, a drain that started or ended.
    Replicas that appear or disappear give no event (their pods' own events tell that story);
    without a previous status there is nothing to compare.
    """
    if previous is None:
        return []
    before = {entry.name: entry for entry in previous.replica_status}
    events: list[EventIntent] = []
    for after in current.replica_status:
        name = after.name
        old = before.get(name)
        if old is None:
            continue
        events += _drain_events(name, old, after)
        if _held(after) and not _held(old):
            detail = quarantine_detail(after)
            events.append(EventIntent("ReplicaQuarantined", f"Quarantined {name} ({detail})", "Warning", name))
        elif _held(old) and not _held(after) and not after.quarantined:
            events.append(EventIntent("ReplicaReleased", f"Released {name} from quarantine", "Normal", name))
        if old.target is not None and after.target is not None and old.target != after.target:
            moved_by = after.target_reason or after.reason
            why = f" ({quarantine_word(moved_by)})" if moved_by else ""
            message = f"Working-set target of {name} changed from {old.target:g} to {after.target:g}{why}"
            events.append(EventIntent("TargetChanged", message, "Normal", name))
    return events
