"""The RolloutPool status, rebuilt from the observed world on every pass (pure).

Counts, the per-replica table the router reads (cap, quarantine) and five conditions:
``Ready``, ``Progressing``, ``Degraded``, ``ReplicasQuarantined``, ``MetricsAvailable``.
Conditions keep their ``lastTransitionTime`` unless their status flips. Events for what
changed between two statuses come from ``events_between`` (re-exported here).

Two quarantines per replica: ``quarantined``/``reason`` is the operator's decision (the control
law, drains), which the routers obey; ``routerQuarantined``/``routerReason`` is what the routers
report of their own fast loop (``rolloutpool_router_replica_pressure``), for people to see and
never read back by the routers. The count, the ``ReplicasQuarantined`` condition and the Events
cover both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rolloutpool.api.pods import is_ready, is_terminating
from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.api.status import Condition, ConditionStatus, ReplicaStatus, ReplicaTurns, RolloutPoolStatus
from rolloutpool.autoscale.law import MetricsHealth, ReplicaControl, ReplicaSignals
from rolloutpool.reconcile.caps import estimated_kv_capacity_tokens
from rolloutpool.reconcile.conditions import EventIntent, events_between, quarantine_detail, set_condition
from rolloutpool.reconcile.engines import EnginePlan
from rolloutpool.reconcile.labels import engine_index, engine_selector
from rolloutpool.routing.discovery import replica_event

__all__ = [
    "FAILING_REASONS",
    "ROUTER_QUARANTINE_HOLD_SECONDS",
    "EventIntent",
    "build_status",
    "events_between",
    "pod_problem",
    "router_quarantine",
    "spec_error_reason",
]

FAILING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
"""Container waiting reasons that mean the pod will not come up by itself."""

ROUTER_QUARANTINE_HOLD_SECONDS = 15.0
"""How long the status keeps a router's quarantine after the routers last reported it.

A router lifts its fast quarantine when one of the replica's sessions ends and sets it again at
the next eviction, so under load it can flap every few seconds; the status (and the Events that
follow its changes) shows such a run as one quarantine."""

_FIELD = re.compile(r"^(?:spec|metadata)(?:\.[A-Za-z0-9]+|\[\d+\])*\.(?P<leaf>[A-Za-z][A-Za-z0-9]*)(?:\[\d+\])?:")


def spec_error_reason(error: str) -> str:
    """Condition reason naming the field of an error: ``spec.engine.maxModelLen: ...`` -> ``InvalidMaxModelLen``."""
    match = _FIELD.match(error)
    if match is None:
        return "InvalidSpec"
    leaf = match["leaf"]
    return "Invalid" + leaf[:1].upper() + leaf[1:]


def pod_problem(pod: Mapping[str, Any]) -> str | None:
    """Why a pod is failing (``Failed``, ``CrashLoopBackOff``, ``Unschedulable``...), or None (pure)."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return str(status.get("reason") or "Failed")
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FAILING_REASONS:
            return str(waiting["reason"])
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return "Unschedulable"
    return None


def _utc(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, tz=UTC)


def router_quarantine(
    *, reported: Mapping[str, str] | None, name: str, old: ReplicaStatus | None, now: datetime, hold_seconds: float
) -> tuple[bool, str | None, datetime | None]:
    """``routerQuarantined``, ``routerReason`` and ``routerQuarantinedAt`` of one replica (pure).

    ``reported`` maps replica -> reason for the replicas the answering routers quarantine by
    themselves; None when no router answered: nothing is reported then, and nothing is kept (a
    stale quarantine is never latched). A replica no router reports any more stays quarantined
    until ``hold_seconds`` after the last report.
    """
    if reported is None:
        return False, None, None
    reason = reported.get(name)
    if reason is not None:
        return True, reason, now
    if old is not None and old.router_quarantined and old.router_quarantined_at is not None:
        elapsed = (now - old.router_quarantined_at).total_seconds()
        if 0 <= elapsed < hold_seconds:
            return True, old.router_reason, old.router_quarantined_at
    return False, None, None


def _replica_entry(
    *,
    pod: Mapping[str, Any],
    index: int,
    live: int,
    control: ReplicaControl | None,
    signals: ReplicaSignals | None,
    old: ReplicaStatus | None,
    lifecycle: str | None,
    estimate: int | None,
    router: tuple[bool, str | None, datetime | None],
) -> ReplicaStatus:
    name = str(pod["metadata"]["name"])
    reported = signals.kv_capacity_tokens if signals else None
    capacity = reported or (old.kv_capacity_tokens if old else None) or estimate
    usage = signals.kv_usage if signals else None
    law: dict[str, Any] = {}
    quarantined, reason = False, None
    if control is not None:
        law = {
            "target": control.target,
            "target_changed_at": _utc(control.changed_at),
            "target_reason": control.reason,
        }
        quarantined, reason = control.quarantined, control.reason if control.quarantined else None
    elif old is not None:
        law = old.model_dump(include={"target", "target_changed_at", "target_reason"})
    if lifecycle is not None:
        quarantined, reason = True, lifecycle
    return ReplicaStatus(
        name=name,
        index=index,
        ready=is_ready(pod),
        endpoint=replica_event("MODIFIED", dict(pod)).url,  # the engine's URL, as the router discovers it
        live_sessions=max(0, live),
        kv_capacity_tokens=capacity,
        kv_usage=None if usage is None or not math.isfinite(usage) else min(1.0, max(0.0, usage)),
        quarantined=quarantined,
        reason=reason,
        router_quarantined=router[0],
        router_reason=router[1],
        router_quarantined_at=router[2],
        **law,
    )


def _router_available(spec: RolloutPoolSpec | None, router_deployment: Mapping[str, Any] | None) -> tuple[bool, str]:
    wanted = spec.router.replicas if spec else 1
    if wanted == 0:
        return True, "no router pods wanted"
    available = int(((router_deployment or {}).get("status") or {}).get("availableReplicas") or 0)
    return available >= wanted, f"{available} of {wanted} router pods available"


def _progress(
    *, spec: RolloutPoolSpec | None, wanted: list[str], pods: dict[str, Mapping[str, Any]], plan: EnginePlan | None
) -> tuple[bool, str, str]:
    replicas = spec.replicas if spec else len(wanted)
    surplus = sorted(n for n, p in pods.items() if (engine_index(p) or 0) >= replicas or engine_index(p) is None)
    outdated = list(plan.outdated) if plan else []
    checks = [
        ("ScalingDown", "removing", surplus),
        ("Updating", f"{len(outdated)} of {replicas} replicas run an old spec:", outdated),
        ("Draining", "draining", list(plan.quarantine) if plan else []),
        ("Creating", "creating", list(plan.missing) if plan else [n for n in wanted if n not in pods]),
        (
            "Starting",
            "waiting to become ready:",
            [n for n in wanted if n in pods and not is_ready(pods[n]) and pod_problem(pods[n]) is None],
        ),
        ("Terminating", "waiting to terminate:", [n for n, p in pods.items() if is_terminating(p)]),
    ]
    for reason, words, names in checks:
        if names:
            return True, reason, f"{words} {', '.join(names)}"
    return False, "Reconciled", f"{replicas} replicas up to date"


_Verdict = tuple[str, bool, str, str]


def _verdicts(
    *,
    spec: RolloutPoolSpec | None,
    spec_error: str | None,
    name: str,
    entries: list[ReplicaStatus],
    pods: dict[str, Mapping[str, Any]],
    plan: EnginePlan | None,
    health: MetricsHealth,
    router_deployment: Mapping[str, Any] | None,
) -> list[_Verdict]:
    """Type, truth, reason and message of every condition, in ``CONDITION_TYPES`` order."""
    replicas = spec.replicas if spec else len(entries)
    wanted = [f"{name}-engine-{i}" for i in range(replicas)]
    ready_wanted = sum(1 for n in wanted if n in pods and is_ready(pods[n]))
    router_ok, router_message = _router_available(spec, router_deployment)
    counts = f"{ready_wanted} of {replicas} replicas ready; {router_message}"
    if spec_error is not None:
        ready: _Verdict = ("Ready", False, spec_error_reason(spec_error), spec_error)
    elif ready_wanted < replicas:
        ready = ("Ready", False, "ReplicasNotReady", counts)
    elif not router_ok:
        ready = ("Ready", False, "RouterUnavailable", counts)
    else:
        ready = ("Ready", True, "Ready", counts)

    progressing, reason, message = _progress(spec=spec, wanted=wanted, pods=pods, plan=plan)

    failing = {n: problem for n, p in sorted(pods.items()) if (problem := pod_problem(p)) is not None}
    detail = ", ".join(f"{n} ({problem})" for n, problem in failing.items())
    degraded: _Verdict = (
        ("Degraded", True, "PodsFailing", f"{len(failing)} of {len(pods)} engine pods failing: {detail}")
        if failing
        else ("Degraded", False, "AsExpected", "no engine pod is failing")
    )

    held = [e for e in entries if e.quarantined or e.router_quarantined]
    lifecycle = ("Draining", "Drained", "DrainTimeout")
    pressure = any(e.router_quarantined or e.reason not in lifecycle for e in held)
    listed = "".join(f"{', ' if i else ': '}{e.name} ({quarantine_detail(e)})" for i, e in enumerate(held))
    quarantined: _Verdict = (
        "ReplicasQuarantined",
        bool(held),
        ("KVPressure" if pressure else "Draining") if held else "NoneQuarantined",
        f"{len(held)} of {len(entries)} replicas quarantined{listed}",
    )
    return [
        ready,
        ("Progressing", progressing, reason, message),
        degraded,
        quarantined,
        ("MetricsAvailable", health.available, health.reason, health.message),
    ]


def build_status(
    *,
    pool: Mapping[str, Any],
    spec: RolloutPoolSpec | None,
    spec_error: str | None,
    pods: Sequence[Mapping[str, Any]],
    live_sessions: Mapping[str, int],
    queued_sessions: int,
    controls: Mapping[str, ReplicaControl],
    health: MetricsHealth,
    draining: Mapping[str, float],
    previous: RolloutPoolStatus | None,
    now: datetime,
    signals: Mapping[str, ReplicaSignals | None] | None = None,
    plan: EnginePlan | None = None,
    router_deployment: Mapping[str, Any] | None = None,
    router_quarantined: Mapping[str, str] | None = None,
    router_hold_seconds: float = ROUTER_QUARANTINE_HOLD_SECONDS,
    engine_warnings: Mapping[str, Sequence[str]] | None = None,
    turns: Mapping[str, ReplicaTurns] | None = None,
) -> RolloutPoolStatus:
    """The whole status of a pool from what was observed in this pass (pure).

    ``pods`` are the pool's engine pods (pods being deleted are left out of the table);
    ``controls`` the control law's decision per pod (a pod without one keeps its previous cap);
    ``draining`` pod -> drain start; ``plan`` this pass's engine plan (drains starting and
    ending, outdated and missing pods); ``signals`` the engine metrics (KV capacity and usage);
    ``router_deployment`` the observed router Deployment (``Ready`` needs it available);
    ``router_quarantined`` replica -> reason for the replicas the answering routers quarantine by
    themselves, None when no router answered (see :func:`router_quarantine`).
    ``engine_warnings`` replica -> what its engine does not report (the routers' view); ``turns`` replica ->
    the routers' held turns, kept and let-go prefixes and moves.
    With ``spec_error`` set, ``Ready`` is False with a reason naming the field.
    """
    meta = pool.get("metadata") or {}
    name = str(meta.get("name", ""))
    generation = meta.get("generation")
    generation = int(generation) if isinstance(generation, int) else None
    signals = signals or {}
    estimate = estimated_kv_capacity_tokens(spec) if spec else None
    old_entries = {entry.name: entry for entry in previous.replica_status} if previous else {}
    ending = {end.name: end.reason for end in plan.end_drain} if plan else {}
    drains = set(plan.quarantine) if plan else set(draining)  # the plan knows which drains go on

    live_pods = {str(p["metadata"]["name"]): p for p in pods if (p.get("metadata") or {}).get("name")}
    entries: list[ReplicaStatus] = []
    for pod_name, pod in sorted(live_pods.items(), key=lambda item: (engine_index(item[1]) or 0, item[0])):
        if is_terminating(pod):
            continue
        lifecycle: str | None = None
        if ending.get(pod_name) in ("Drained", "DrainTimeout"):
            lifecycle = ending[pod_name]
        elif pod_name in drains and pod_name not in ending:
            lifecycle = "Draining"
        entries.append(
            _replica_entry(
                pod=pod,
                index=engine_index(pod) or 0,
                live=live_sessions.get(pod_name, 0),
                control=controls.get(pod_name),
                signals=signals.get(pod_name),
                old=old_entries.get(pod_name),
                lifecycle=lifecycle,
                estimate=estimate,
                router=router_quarantine(
                    reported=router_quarantined,
                    name=pod_name,
                    old=old_entries.get(pod_name),
                    now=now,
                    hold_seconds=router_hold_seconds,
                ),
            )
        )
        if engine_warnings and engine_warnings.get(pod_name):
            entries[-1] = entries[-1].model_copy(update={"engine_warnings": list(engine_warnings[pod_name])})
        counts = (turns or {}).get(pod_name)
        if counts is not None:
            update = {"held_turns": counts.held, "kept_sessions": counts.kept, "let_go_sessions": counts.let_go}
            entries[-1] = entries[-1].model_copy(update=update | {"moves": counts.moves})

    verdicts = _verdicts(
        spec=spec,
        spec_error=spec_error,
        name=name,
        entries=entries,
        pods=live_pods,
        plan=plan,
        health=health,
        router_deployment=router_deployment,
    )
    conditions: list[Condition] = list(previous.conditions) if previous else []
    for type_, ok, reason, message in verdicts:
        status: ConditionStatus = "True" if ok else "False"
        conditions = set_condition(
            conditions,
            type=type_,
            status=status,
            reason=reason,
            message=message,
            observed_generation=generation,
            now=now,
        )
    return RolloutPoolStatus(
        observed_generation=generation,
        replicas=len(entries),
        ready_replicas=sum(1 for e in entries if e.ready),
        selector=engine_selector(name),
        live_sessions=sum(e.live_sessions for e in entries),
        queued_sessions=max(0, queued_sessions),
        quarantined_replicas=sum(1 for e in entries if e.quarantined or e.router_quarantined),
        held_turns=sum(e.held_turns for e in entries),
        kept_sessions=sum(e.kept_sessions for e in entries),
        moves=sum(e.moves for e in entries),
        replica_status=entries,
        conditions=conditions,
    )
