"""The routers' own fast quarantine in the status: shown beside the operator's decision, never obeyed from it.

``replicaStatus[].quarantined`` stays the operator's decision (the routers obey it);
``routerQuarantined``/``routerReason`` is what the routers report of their own fast loop. The
count, ``ReplicasQuarantined`` and the Events cover both; a router quarantine that flaps every
few seconds reads as one (``ROUTER_QUARANTINE_HOLD_SECONDS``); routers that do not answer
report nothing and nothing is kept.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from poolcases import load_example
from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.api.status import Condition, ReplicaStatus, RolloutPoolStatus
from rolloutpool.autoscale.law import MetricsHealth, ReplicaControl
from rolloutpool.reconcile.caps import parse_spec
from rolloutpool.reconcile.children import desired_engine_pods
from rolloutpool.reconcile.conditions import EventIntent, events_between, quarantine_detail
from rolloutpool.reconcile.engines import EnginePlan
from rolloutpool.reconcile.status import ROUTER_QUARANTINE_HOLD_SECONDS, build_status, router_quarantine
from rolloutpool.routing.discovery import operator_limits

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
HOLD = ROUTER_QUARANTINE_HOLD_SECONDS
HEALTHY = MetricsHealth(True, "MetricsAvailable", "fresh metrics")
POOL = load_example("simulated-pool.yaml")
POOL["metadata"].update(namespace="ns", uid="uid-1", generation=3)


def E(i: int) -> str:  # noqa: N802 -- reads like the pod name it builds
    return f"sim-grpo-engine-{i}"


def _pods() -> list[dict[str, Any]]:
    spec = RolloutPoolSpec.model_validate(POOL["spec"])
    pods = []
    for manifest in desired_engine_pods(pool=POOL, spec=spec, default_image="img").values():
        pod = copy.deepcopy(manifest)
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        pods.append(pod)
    return pods


def _status(
    router: Mapping[str, str] | None,
    *,
    now: datetime = T0,
    previous: RolloutPoolStatus | None = None,
    controls: dict[str, ReplicaControl] | None = None,
    plan: EnginePlan | None = None,
) -> RolloutPoolStatus:
    spec, _ = parse_spec(pool=POOL)
    return build_status(
        pool=POOL,
        spec=spec,
        spec_error=None,
        pods=_pods(),
        live_sessions={},
        queued_sessions=0,
        controls=controls or {},
        health=HEALTHY,
        draining={},
        previous=previous,
        now=now,
        plan=plan,
        router_deployment={"status": {"availableReplicas": 1}},
        router_quarantined=router,
    )


def _quarantined(status: RolloutPoolStatus) -> Condition:
    return next(c for c in status.conditions if c.type == "ReplicasQuarantined")


def _law(reason: str) -> dict[str, ReplicaControl]:
    return {E(0): ReplicaControl(target=0.8, changed_at=T0.timestamp(), quarantined=True, reason=reason)}


# ---------------------------------------------------------------- one replica's router quarantine


def _old(*, at: datetime | None, quarantined: bool = True) -> ReplicaStatus:
    return ReplicaStatus(
        name=E(0), index=0, router_quarantined=quarantined, router_reason="Evicting", router_quarantined_at=at
    )


@pytest.mark.parametrize(
    ("reported", "old", "now", "expected"),
    [
        ({E(0): "Preempting"}, None, T0, (True, "Preempting", T0)),  # reported: shown, seen now
        ({E(0): "Queueing"}, _old(at=T0), T0 + timedelta(seconds=3), (True, "Queueing", T0 + timedelta(seconds=3))),
        ({}, None, T0, (False, None, None)),  # reported by no router
        ({}, _old(at=T0), T0 + timedelta(seconds=HOLD - 1), (True, "Evicting", T0)),  # lifted a moment ago: held
        ({}, _old(at=T0), T0 + timedelta(seconds=HOLD), (False, None, None)),  # lifted for the hold: released
        ({}, _old(at=T0 + timedelta(seconds=60)), T0, (False, None, None)),  # a seen time ahead of now: not trusted
        ({}, _old(at=None), T0, (False, None, None)),
        ({}, _old(at=T0, quarantined=False), T0, (False, None, None)),
        ({E(1): "Evicting"}, _old(at=T0), T0 + timedelta(seconds=HOLD * 2), (False, None, None)),  # another replica
        (None, _old(at=T0), T0, (False, None, None)),  # no router answered: nothing kept, never latched
    ],
)
def test_router_quarantine_of_one_replica(
    reported: dict[str, str] | None,
    old: ReplicaStatus | None,
    now: datetime,
    expected: tuple[bool, str | None, datetime | None],
) -> None:
    assert router_quarantine(reported=reported, name=E(0), old=old, now=now, hold_seconds=HOLD) == expected


# ---------------------------------------------------------------- the status and its condition


@pytest.mark.parametrize(
    ("router", "controls", "shown", "reason", "detail"),
    [
        ({E(0): "Evicting"}, {}, 1, "KVPressure", f"{E(0)} (evicting; router)"),
        ({E(0): "Evicting"}, _law("Evicting"), 1, "KVPressure", f"{E(0)} (evicting; operator and router)"),
        ({E(0): "Evicting"}, _law("Preempting"), 1, "KVPressure", f"{E(0)} (preempting; router: evicting)"),
        ({}, _law("Queueing"), 1, "KVPressure", f"{E(0)} (queueing)"),
        ({E(1): "Queueing", E(2): "Preempting"}, _law("Preempting"), 3, "KVPressure", f"{E(2)} (preempting; router)"),
        ({}, {}, 0, "NoneQuarantined", ""),
        (None, {}, 0, "NoneQuarantined", ""),  # routers unreachable: nothing reported
    ],
)
def test_condition_and_count_cover_both_quarantines(
    router: dict[str, str] | None, controls: dict[str, ReplicaControl], shown: int, reason: str, detail: str
) -> None:
    status = _status(router, controls=controls)
    held = _quarantined(status)
    assert (held.status, held.reason) == ("True" if shown else "False", reason)
    assert held.message.startswith(f"{shown} of 4 replicas quarantined")
    assert detail in held.message
    assert status.quarantined_replicas == shown
    for entry in status.replica_status:  # the operator's decision is the law's alone
        assert entry.quarantined == (entry.name in controls)
        assert (entry.router_quarantined, entry.router_reason) == (
            entry.name in (router or {}),
            (router or {}).get(entry.name),
        )


def test_a_router_quarantine_during_a_drain_is_pressure() -> None:
    plan = EnginePlan(start_drain=(E(3),), quarantine=(E(3),))
    draining = _status({}, plan=plan)
    assert _quarantined(draining).reason == "Draining"
    both = _status({E(3): "Evicting"}, plan=plan)
    assert (_quarantined(both).reason, both.quarantined_replicas) == ("KVPressure", 1)
    assert f"{E(3)} (draining; router: evicting)" in _quarantined(both).message


def test_the_routers_never_obey_their_own_reported_quarantine() -> None:
    status = _status({E(0): "Evicting"})
    wire = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    entry = wire["replicaStatus"][0]
    assert (entry["quarantined"], entry["routerQuarantined"], entry["routerReason"]) == (False, True, "Evicting")
    assert "reason" not in entry
    assert datetime.fromisoformat(entry["routerQuarantinedAt"]) == T0
    limits = operator_limits({"status": wire})  # what a router reads back from the pool
    assert limits[E(0)].quarantined is False
    assert limits[E(0)].reason is None


def test_the_hold_survives_an_operator_restart_through_the_status_wire() -> None:
    first = _status({E(0): "Evicting"})
    wire = first.model_dump(mode="json", by_alias=True, exclude_none=True)
    restored = RolloutPoolStatus.model_validate(wire)
    held = _status({}, previous=restored, now=T0 + timedelta(seconds=HOLD / 2))
    assert held.replica_status[0].router_quarantined
    assert held == _status({}, previous=first, now=T0 + timedelta(seconds=HOLD / 2))


# ---------------------------------------------------------------- events over passes


def _passes(steps: list[tuple[float, Mapping[str, str] | None, dict[str, ReplicaControl]]]) -> list[list[EventIntent]]:
    """Statuses pass after pass (seconds after T0, what the routers report, the law); the Events of each pass."""
    previous: RolloutPoolStatus | None = _status({})
    out = []
    for seconds, router, controls in steps:
        current = _status(router, now=T0 + timedelta(seconds=seconds), previous=previous, controls=controls)
        out.append(events_between(previous, current))
        previous = current
    return out


QUARANTINED = EventIntent("ReplicaQuarantined", f"Quarantined {E(0)} (evicting; router)", "Warning", E(0))
RELEASED = EventIntent("ReplicaReleased", f"Released {E(0)} from quarantine", "Normal", E(0))


def test_a_flapping_router_quarantine_gives_one_event_pair() -> None:
    on, off = {E(0): "Evicting"}, {}
    flaps = [(float(t), on if t % 10 < 4 else off, {}) for t in range(0, 60, 2)]  # 4 s on, 6 s off, for a minute
    last_on = max(t for t, router, _ in flaps if router)
    events = _passes([*flaps, (last_on + HOLD - 1, off, {}), (last_on + HOLD, off, {}), (90 + HOLD, off, {})])
    assert [e for pass_ in events for e in pass_] == [QUARANTINED, RELEASED]
    assert events[0] == [QUARANTINED]
    assert events[-2] == [RELEASED]  # released once the routers have been quiet for the hold


def test_events_for_the_law_and_the_router_together() -> None:
    law = _law("Evicting")
    events = _passes(
        [
            (0, {E(0): "Evicting"}, {}),  # the router first: announced
            (5, {E(0): "Evicting"}, law),  # the law too: still the same quarantine, no second event
            (10, {}, law),  # the router lifts: the law still holds it
            (10 + HOLD, {}, law),
            (20 + HOLD, {}, {}),  # the law lifts too: released
        ]
    )
    assert events == [[QUARANTINED], [], [], [], [RELEASED]]


def test_routers_gone_release_at_once() -> None:
    events = _passes([(0, {E(0): "Evicting"}, {}), (2, None, {})])
    assert events == [[QUARANTINED], [RELEASED]]


@pytest.mark.parametrize(
    ("entry", "detail"),
    [
        ({"quarantined": True, "reason": "Queueing"}, "queueing"),
        ({"router_quarantined": True, "router_reason": "Preempting"}, "preempting; router"),
        ({"router_quarantined": True}, "unknown; router"),
        ({}, "not quarantined"),
    ],
)
def test_quarantine_detail(entry: dict[str, Any], detail: str) -> None:
    assert quarantine_detail(ReplicaStatus(name=E(0), index=0, **entry)) == detail


def test_a_router_quarantine_turning_into_a_drain_is_no_release() -> None:
    before = RolloutPoolStatus(
        replica_status=[ReplicaStatus(name=E(0), index=0, router_quarantined=True, router_reason="Evicting")]
    )
    after = RolloutPoolStatus(replica_status=[ReplicaStatus(name=E(0), index=0, quarantined=True, reason="Draining")])
    assert events_between(before, after) == [
        EventIntent("DrainStarted", f"Started draining {E(0)}: 0 live sessions", "Normal", E(0))
    ]
