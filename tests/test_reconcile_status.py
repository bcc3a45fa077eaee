"""Status, conditions and events rebuilt from the observed world; caps from the spec."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poolcases import invalid_cases, load_example
from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.api.status import Condition, ConditionStatus, ReplicaStatus, RolloutPoolStatus
from rolloutpool.autoscale.law import MetricsHealth, ReplicaControl, ReplicaSignals
from rolloutpool.reconcile.caps import (
    controls_from_status,
    estimated_kv_capacity_tokens,
    law_params,
    parse_spec,
    plan_controls,
    replica_caps,
)
from rolloutpool.reconcile.children import desired_engine_pods
from rolloutpool.reconcile.conditions import EventIntent, events_between, set_condition
from rolloutpool.reconcile.engines import DrainEnd, EnginePlan
from rolloutpool.reconcile.status import build_status, pod_problem, spec_error_reason

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
HEALTHY = MetricsHealth(True, "MetricsAvailable", "fresh metrics for 4 replicas")


def pool_object(replicas: int = 4) -> dict[str, Any]:
    pool = load_example("simulated-pool.yaml")
    pool["metadata"].update(namespace="ns", uid="uid-1", generation=7)
    pool["spec"]["replicas"] = replicas
    return pool


def E(i: int) -> str:  # noqa: N802 -- reads like the pod name it builds
    return f"sim-grpo-engine-{i}"


def pods_of(pool: dict[str, Any], *, unready: tuple[int, ...] = (), waiting: dict[int, str] | None = None) -> list[Any]:
    spec = RolloutPoolSpec.model_validate(pool["spec"])
    pods = []
    for i, manifest in enumerate(desired_engine_pods(pool=pool, spec=spec, default_image="img").values()):
        pod = copy.deepcopy(manifest)
        ready = "False" if i in unready else "True"
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]}
        if waiting and i in waiting:
            pod["status"]["containerStatuses"] = [{"name": "engine", "state": {"waiting": {"reason": waiting[i]}}}]
        pods.append(pod)
    return pods


ROUTER_UP = {"status": {"availableReplicas": 1}}


def status_of(
    pool: dict[str, Any],
    pods: list[Any],
    *,
    now: datetime = T0,
    previous: RolloutPoolStatus | None = None,
    controls: dict[str, ReplicaControl] | None = None,
    draining: dict[str, float] | None = None,
    plan: EnginePlan | None = None,
    health: MetricsHealth = HEALTHY,
    spec_error: str | None = None,
    router: dict[str, Any] | None = ROUTER_UP,
    signals: dict[str, ReplicaSignals | None] | None = None,
) -> RolloutPoolStatus:
    spec, _ = parse_spec(pool=pool)
    return build_status(
        pool=pool,
        spec=spec,
        spec_error=spec_error,
        pods=pods,
        live_sessions={E(0): 10, E(1): 3},
        queued_sessions=2,
        controls=controls or {},
        health=health,
        draining=draining or {},
        previous=previous,
        now=now,
        plan=plan,
        router_deployment=router,
        signals=signals,
    )


def cond(status: RolloutPoolStatus, type_: str) -> Condition:
    return next(c for c in status.conditions if c.type == type_)


# ---------------------------------------------------------------- caps and spec checks


def test_capacity_estimates() -> None:
    sim = RolloutPoolSpec.model_validate(pool_object()["spec"])
    assert estimated_kv_capacity_tokens(sim) == 400_000
    vllm = RolloutPoolSpec.model_validate(load_example("vllm-pool.yaml")["spec"])
    estimate = estimated_kv_capacity_tokens(vllm)
    assert estimate is not None
    assert 370_000 < estimate < 440_000  # DESIGN: an 8B model on 80 GB at 0.9 holds ~380k-440k tokens
    unknown = load_example("vllm-pool.yaml")["spec"]
    del unknown["engine"]["modelShape"]
    unknown["engine"]["model"] = "acme/secret-model"
    assert estimated_kv_capacity_tokens(RolloutPoolSpec.model_validate(unknown)) is None


def test_replica_caps_and_law_params() -> None:
    spec = RolloutPoolSpec.model_validate(pool_object()["spec"])
    caps = replica_caps(spec=spec)
    assert caps is not None
    assert caps.floor == 400_000 // 32768
    params = law_params(spec=spec)
    assert params.initial == spec.concurrency.working_set_target
    assert spec.autoscaling.max_target is None  # unset: the law never raises past the pool's own target
    assert (params.minimum, params.maximum) == (spec.autoscaling.min_target, spec.concurrency.working_set_target)
    raised = spec.model_copy(update={"autoscaling": spec.autoscaling.model_copy(update={"max_target": 0.95})})
    assert (law_params(spec=raised).initial, law_params(spec=raised).maximum) == (0.9, 0.95)
    lowered = spec.model_copy(update={"autoscaling": spec.autoscaling.model_copy(update={"max_target": 0.8})})
    assert (law_params(spec=lowered).initial, law_params(spec=lowered).maximum) == (0.8, 0.8)
    assert params.cooldown_seconds == spec.autoscaling.cooldown_seconds
    assert params.step == spec.autoscaling.target_step


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"concurrency": {"maxSessionsPerReplica": 3}}, "InvalidMaxSessionsPerReplica"),
        ({"engine": {"kvCapacityTokens": 1000}}, "InvalidMaxModelLen"),
        ({"replicas": -1}, "InvalidReplicas"),
        ({"engine": {"maxModelLen": "long"}}, "InvalidMaxModelLen"),
    ],
)
def test_unservable_spec_names_the_field(change: dict[str, Any], reason: str) -> None:
    pool = pool_object()
    for key, value in change.items():
        if isinstance(value, dict):
            pool["spec"][key].update(value)
        else:
            pool["spec"][key] = value
    _, error = parse_spec(pool=pool)
    assert error is not None
    assert spec_error_reason(error) == reason
    status = status_of(pool, pods_of(pool_object()), spec_error=error)
    ready = cond(status, "Ready")
    assert (ready.status, ready.reason, ready.message) == ("False", reason, error)


def test_every_schema_invalid_case_names_its_field() -> None:
    for case in invalid_cases():
        _, error = parse_spec(pool=case.manifest)
        assert error is not None, case.id
        assert re.match(re.escape(case.field) + r"(\[\d+\])?: ", error), (case.id, error)  # an item: its index
        leaf = case.field.rsplit(".", 1)[1]
        assert spec_error_reason(error) == "Invalid" + leaf[0].upper() + leaf[1:]


def test_pool_name_too_long_for_the_router_service() -> None:
    pool = pool_object()
    pool["metadata"]["name"] = "x" * 57
    assert parse_spec(pool=pool) == (None, parse_spec(pool=pool)[1])
    assert spec_error_reason(parse_spec(pool=pool)[1] or "") == "InvalidName"


def test_controls_survive_a_restart_through_the_status() -> None:
    at = T0 - timedelta(seconds=30)
    status = RolloutPoolStatus(
        replica_status=[
            ReplicaStatus(name=E(0), index=0, target=0.8, quarantined=True, reason="Preempting", target_changed_at=at),
            ReplicaStatus(name=E(1), index=1, target=0.9, quarantined=True, reason="Draining"),
            ReplicaStatus(name=E(2), index=2),
        ]
    )
    assert controls_from_status(status) == {
        E(0): ReplicaControl(target=0.8, changed_at=at.timestamp(), quarantined=True, reason="Preempting"),
        E(1): ReplicaControl(target=0.9, changed_at=None, quarantined=False, reason=None),
    }
    assert controls_from_status(None) == {}


def test_the_law_state_round_trips_through_the_status_wire() -> None:
    controls = {
        E(0): ReplicaControl(target=0.92, changed_at=T0.timestamp(), quarantined=False, reason="Raised"),
        E(1): ReplicaControl(target=0.81, changed_at=T0.timestamp() - 60, quarantined=True, reason="Preempting"),
    }
    pool = pool_object()
    status = status_of(pool, pods_of(pool), controls=controls)
    wire = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert wire["replicaStatus"][0]["targetReason"] == "Raised"
    assert "reason" not in wire["replicaStatus"][0]  # not quarantined: the router sees no reason
    assert controls_from_status(RolloutPoolStatus.model_validate(wire)) == controls


def test_plan_controls_modes() -> None:
    pool = pool_object(2)
    pool["spec"]["autoscaling"] = {"enabled": True, "prometheusUrl": "http://prom:9090"}
    spec = RolloutPoolSpec.model_validate(pool["spec"])
    names = [E(0), E(1)]
    waiting = ReplicaSignals(kv_usage=0.5, kv_capacity_tokens=400_000, held_turns=2, sampled_at=0)
    previous = {E(0): ReplicaControl(target=0.8, changed_at=0.0)}
    down = MetricsHealth(False, "PrometheusUnreachable", "refused")
    blind = plan_controls(spec=spec, replicas=names, signals={E(0): waiting}, previous=previous, health=down, now=1e6)
    assert {n: c.target for n, c in blind.items()} == {E(0): None, E(1): None}  # blind: the routers' own target
    seeing = plan_controls(
        spec=spec, replicas=names, signals={E(0): waiting}, previous=previous, health=HEALTHY, now=1e6
    )
    assert seeing[E(0)].target == 0.82  # turns wait, nothing presses: raised
    assert seeing[E(1)].target is None  # no signals of its own yet
    pool["spec"]["autoscaling"] = {"enabled": False}
    static = RolloutPoolSpec.model_validate(pool["spec"])
    off = MetricsHealth(False, "AutoscalingDisabled", "off")
    # without autoscaling the operator publishes no target, whatever an earlier release published
    was = {E(0): ReplicaControl(target=0.7, changed_at=0.0)}
    off_targets = plan_controls(spec=static, replicas=names, signals={}, previous=was, health=off, now=5.0)
    assert off_targets == {E(0): ReplicaControl(target=None), E(1): ReplicaControl(target=None)}
    same = plan_controls(spec=static, replicas=names, signals={}, previous=off_targets, health=off, now=9.0)
    assert same == off_targets  # no change, no new changed_at


def test_a_pool_without_autoscaling_clears_the_target_an_earlier_status_held() -> None:
    pool = pool_object(2)
    pool["spec"]["autoscaling"] = {"enabled": False}
    pods = pods_of(pool)
    earlier = RolloutPoolStatus(replica_status=[ReplicaStatus(name=E(i), index=i, target=0.7) for i in range(2)])
    off = MetricsHealth(False, "AutoscalingDisabled", "off")
    controls = {E(i): ReplicaControl(target=None) for i in range(2)}
    status = status_of(pool, pods, previous=earlier, controls=controls, health=off)
    assert [(r.target, r.target_changed_at, r.quarantined) for r in status.replica_status] == [(None, None, False)] * 2
    assert controls_from_status(status) == {}  # nothing for the law to resume from


# ---------------------------------------------------------------- conditions


def test_set_condition_keeps_transition_time_unless_status_flips() -> None:
    first = set_condition([], type="Ready", status="False", reason="A", message="a", observed_generation=1, now=T0)
    later = T0 + timedelta(minutes=5)
    same = set_condition(first, type="Ready", status="False", reason="B", message="b", observed_generation=2, now=later)
    assert same[0].last_transition_time == T0
    assert (same[0].reason, same[0].message, same[0].observed_generation) == ("B", "b", 2)
    flipped = set_condition(same, type="Ready", status="True", reason="C", message="", observed_generation=2, now=later)
    assert flipped[0].last_transition_time == later
    other = set_condition(
        flipped, type="Degraded", status="False", reason="D", message="", observed_generation=2, now=T0
    )
    assert [c.type for c in other] == ["Ready", "Degraded"]
    assert other[0] == flipped[0]


STATUSES: list[ConditionStatus] = ["True", "False", "Unknown"]


@given(st.lists(st.sampled_from(STATUSES), min_size=1, max_size=12))
def test_transition_time_moves_exactly_when_the_status_flips(statuses: list[ConditionStatus]) -> None:
    conditions: list[Condition] = []
    for step, value in enumerate(statuses):
        now = T0 + timedelta(seconds=step)
        before = conditions[0] if conditions else None
        conditions = set_condition(
            conditions,
            type="Ready",
            status=value,
            reason="R",
            message="",
            observed_generation=step,
            now=now,
        )
        expected = now if before is None or before.status != value else before.last_transition_time
        assert conditions[0].last_transition_time == expected
        assert len(conditions) == 1


def test_healthy_pool() -> None:
    pool = pool_object()
    controls = {E(i): ReplicaControl(target=0.85, changed_at=T0.timestamp()) for i in range(4)}
    status = status_of(pool, pods_of(pool), controls=controls)
    assert (status.replicas, status.ready_replicas, status.live_sessions, status.queued_sessions) == (4, 4, 13, 2)
    assert status.observed_generation == 7
    assert status.selector == "rolloutpool.io/pool=sim-grpo,rolloutpool.io/component=engine"
    assert [e.target for e in status.replica_status] == [0.85] * 4
    assert status.replica_status[0].target_changed_at == T0
    assert status.replica_status[0].kv_capacity_tokens == 400_000
    verdicts = {c.type: (c.status, c.reason) for c in status.conditions}
    assert verdicts == {
        "Ready": ("True", "Ready"),
        "Progressing": ("False", "Reconciled"),
        "Degraded": ("False", "AsExpected"),
        "ReplicasQuarantined": ("False", "NoneQuarantined"),
        "MetricsAvailable": ("True", "MetricsAvailable"),
    }
    assert all(c.observed_generation == 7 for c in status.conditions)


def test_router_unavailable_keeps_the_pool_not_ready() -> None:
    pool = pool_object()
    status = status_of(pool, pods_of(pool), router=None)
    assert (cond(status, "Ready").status, cond(status, "Ready").reason) == ("False", "RouterUnavailable")


def test_starting_and_crash_looping_replicas() -> None:
    pool = pool_object()
    pods = pods_of(pool, unready=(1, 2), waiting={2: "CrashLoopBackOff"})
    status = status_of(pool, pods)
    assert cond(status, "Ready").reason == "ReplicasNotReady"
    assert cond(status, "Ready").message.startswith("2 of 4 replicas ready")
    assert (cond(status, "Progressing").status, cond(status, "Progressing").reason) == ("True", "Starting")
    assert E(1) in cond(status, "Progressing").message
    degraded = cond(status, "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "PodsFailing")
    assert f"{E(2)} (CrashLoopBackOff)" in degraded.message


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"phase": "Failed", "reason": "Evicted"}, "Evicted"),
        ({"phase": "Failed"}, "Failed"),
        ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "reason": "Unschedulable"}]}, "Unschedulable"),
        ({"initContainerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull"}}}]}, "ErrImagePull"),
        ({"containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}, None),
        ({"phase": "Running"}, None),
    ],
)
def test_pod_problem(status: dict[str, Any], expected: str | None) -> None:
    assert pod_problem({"status": status}) == expected


def test_quarantine_and_drain_in_the_table_and_conditions() -> None:
    pool = pool_object()
    controls = {
        E(0): ReplicaControl(target=0.8, changed_at=T0.timestamp(), quarantined=True, reason="Evicting"),
        E(1): ReplicaControl(target=0.9),
    }
    plan = EnginePlan(start_drain=(E(3),), end_drain=(DrainEnd(E(2), "DrainTimeout"),), quarantine=(E(3),))
    status = status_of(pool, pods_of(pool), controls=controls, plan=plan, draining={E(2): 0.0})
    table = {e.name: (e.quarantined, e.reason) for e in status.replica_status}
    assert table == {
        E(0): (True, "Evicting"),
        E(1): (False, None),
        E(2): (True, "DrainTimeout"),
        E(3): (True, "Draining"),
    }
    assert status.quarantined_replicas == 3
    held = cond(status, "ReplicasQuarantined")
    assert (held.status, held.reason) == ("True", "KVPressure")
    assert (
        held.message == f"3 of 4 replicas quarantined: {E(0)} (evicting), {E(2)} (drain timed out), {E(3)} (draining)"
    )
    only_drain = status_of(pool, pods_of(pool), plan=EnginePlan(start_drain=(E(3),), quarantine=(E(3),)))
    assert cond(only_drain, "ReplicasQuarantined").reason == "Draining"
    assert cond(only_drain, "Progressing").reason == "Draining"


def test_scale_down_and_update_progress() -> None:
    pool = pool_object(2)
    pods = pods_of(pool_object(4))
    status = status_of(pool, pods)
    assert (cond(status, "Progressing").status, cond(status, "Progressing").reason) == ("True", "ScalingDown")
    updating = status_of(pool_object(4), pods, plan=EnginePlan(outdated=(E(1),)))
    assert cond(updating, "Progressing").reason == "Updating"


def test_terminating_pods_leave_the_table() -> None:
    pool = pool_object()
    pods = pods_of(pool)
    pods[3]["metadata"]["deletionTimestamp"] = "2026-11-30T11:59:00Z"
    status = status_of(pool, pods)
    assert [e.name for e in status.replica_status] == [E(0), E(1), E(2)]
    assert status.replicas == 3


def test_metrics_condition_and_signals() -> None:
    pool = pool_object()
    down = MetricsHealth(False, "PrometheusUnreachable", "Prometheus query failed: refused")
    signals: dict[str, ReplicaSignals | None] = {
        E(0): ReplicaSignals(kv_usage=1.2, kv_capacity_tokens=123_456),
        E(2): ReplicaSignals(kv_usage=float("nan")),
    }
    status = status_of(pool, pods_of(pool), health=down, signals=signals)
    metrics = cond(status, "MetricsAvailable")
    assert (metrics.status, metrics.reason, metrics.message) == ("False", down.reason, down.message)
    assert status.replica_status[0].kv_usage == 1.0
    assert status.replica_status[0].kv_capacity_tokens == 123_456
    assert status.replica_status[1].kv_usage is None
    assert status.replica_status[2].kv_usage is None  # NaN from Prometheus is no reading


def test_transition_times_survive_passes_and_flip_once() -> None:
    pool = pool_object()
    first = status_of(pool, pods_of(pool, unready=(0,)))
    later = T0 + timedelta(minutes=1)
    second = status_of(pool, pods_of(pool, unready=(0,)), previous=first, now=later)
    assert cond(second, "Ready").last_transition_time == T0
    third = status_of(pool, pods_of(pool), previous=second, now=later + timedelta(minutes=1))
    assert cond(third, "Ready").status == "True"
    assert cond(third, "Ready").last_transition_time == later + timedelta(minutes=1)
    assert cond(third, "Degraded").last_transition_time == T0


def test_rebuilding_from_the_same_world_changes_nothing() -> None:
    pool = pool_object()
    controls = {E(0): ReplicaControl(target=0.8, changed_at=T0.timestamp(), quarantined=True, reason="Queueing")}
    first = status_of(pool, pods_of(pool), controls=controls)
    again = status_of(pool, pods_of(pool), controls=controls, previous=first, now=T0 + timedelta(hours=1))
    assert again == first
    assert events_between(first, again) == []


def test_a_replica_without_control_keeps_its_previous_target() -> None:
    pool = pool_object()
    first = status_of(pool, pods_of(pool), controls={E(0): ReplicaControl(target=0.85, changed_at=T0.timestamp())})
    second = status_of(pool, pods_of(pool), previous=first)
    assert (second.replica_status[0].target, second.replica_status[0].target_changed_at) == (0.85, T0)


# ---------------------------------------------------------------- events


def _entry(name: str, **fields: Any) -> ReplicaStatus:
    return ReplicaStatus(name=name, index=int(name.rsplit("-", 1)[1]), **fields)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ({"target": 0.9}, {"target": 0.9}, []),
        (
            {"target": 0.9},
            {"target": 0.81, "quarantined": True, "reason": "Evicting"},
            [
                EventIntent("ReplicaQuarantined", f"Quarantined {E(0)} (evicting)", "Warning", E(0)),
                EventIntent(
                    "TargetChanged", f"Working-set target of {E(0)} changed from 0.9 to 0.81 (evicting)", "Normal", E(0)
                ),
            ],
        ),
        (
            {"target": 0.81, "quarantined": True, "reason": "Queueing"},
            {"target": 0.81},
            [EventIntent("ReplicaReleased", f"Released {E(0)} from quarantine", "Normal", E(0))],
        ),
        (
            {"target": 0.81},
            {"target": 0.83, "target_reason": "Raised"},
            [
                EventIntent(
                    "TargetChanged", f"Working-set target of {E(0)} changed from 0.81 to 0.83 (raised)", "Normal", E(0)
                )
            ],
        ),
        (
            {"target": 0.81, "live_sessions": 3},
            {"target": 0.81, "live_sessions": 3, "quarantined": True, "reason": "Draining"},
            [EventIntent("DrainStarted", f"Started draining {E(0)}: 3 live sessions", "Normal", E(0))],
        ),
        (
            {"quarantined": True, "reason": "Draining"},
            {"quarantined": True, "reason": "Drained"},
            [EventIntent("DrainEnded", f"Drained {E(0)}; deleting it", "Normal", E(0))],
        ),
        (
            {"quarantined": True, "reason": "Draining", "live_sessions": 2},
            {"quarantined": True, "reason": "DrainTimeout", "live_sessions": 2},
            [
                EventIntent(
                    "DrainEnded", f"Drain of {E(0)} timed out with 2 live sessions; deleting it", "Warning", E(0)
                )
            ],
        ),
        (
            {"quarantined": True, "reason": "Draining"},
            {},
            [EventIntent("DrainEnded", f"Stopped draining {E(0)}: it is wanted again", "Normal", E(0))],
        ),
        (
            {"quarantined": True, "reason": "Preempting"},
            {"quarantined": True, "reason": "Draining"},
            [EventIntent("DrainStarted", f"Started draining {E(0)}: 0 live sessions", "Normal", E(0))],
        ),
    ],
)
def test_events_between(before: dict[str, Any], after: dict[str, Any], expected: list[EventIntent]) -> None:
    previous = RolloutPoolStatus(replica_status=[_entry(E(0), **before)])
    current = RolloutPoolStatus(replica_status=[_entry(E(0), **after)])
    assert events_between(previous, current) == expected


def test_no_events_without_a_previous_status_or_for_new_replicas() -> None:
    current = RolloutPoolStatus(replica_status=[_entry(E(0), quarantined=True, reason="Preempting")])
    assert events_between(None, current) == []
    assert events_between(RolloutPoolStatus(), current) == []


def test_drains_come_from_the_plan_when_there_is_one() -> None:
    pool = pool_object()
    without_plan = status_of(pool, pods_of(pool), draining={E(1): 0.0})
    assert [(e.quarantined, e.reason) for e in without_plan.replica_status][1] == (True, "Draining")
    failed_while_draining = status_of(pool, pods_of(pool), draining={E(1): 0.0}, plan=EnginePlan(delete=(E(1),)))
    assert [(e.quarantined, e.reason) for e in failed_while_draining.replica_status][1] == (False, None)


def test_each_replica_lists_its_engine_endpoint_for_trainers_that_call_engines_directly() -> None:
    pool = pool_object(replicas=2)
    pods = pods_of(pool)
    pods[0]["status"]["podIP"] = "10.1.2.3"
    status = status_of(pool, pods)
    by_name = {r.name: r for r in status.replica_status}
    assert by_name[E(0)].endpoint is not None
    assert by_name[E(0)].endpoint.startswith("http://10.1.2.3:")
    assert by_name[E(1)].endpoint is None  # no IP yet
    assert status.model_dump(by_alias=True)["replicaStatus"][0]["endpoint"].startswith("http://10.1.2.3:")
