"""``decide``: a whole pass's decision from what it observed, with no cluster and no I/O."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from rolloutpool.autoscale import ReplicaSignals
from rolloutpool.reconcile.control import ControlMemo, MetricsRead
from rolloutpool.reconcile.decide import Observed, PassSettings, Recall, RouterView, decide, metrics_query

NOW, CLOCK = 1_800_000_000.0, 5_000.0
POOL: dict[str, Any] = {
    "apiVersion": "rolloutpool.io/v1alpha1",
    "kind": "RolloutPool",
    "metadata": {"name": "p", "namespace": "team", "uid": "u-1", "generation": 3},
    "spec": {
        "replicas": 2,
        "engine": {"kind": "simulated", "model": "m", "maxModelLen": 32768, "kvCapacityTokens": 400000},
    },
}
SETTINGS = PassSettings(image="ghcr.io/rolloutpool/rolloutpool:test")


def _observed(pool: dict[str, Any] | None = None, **changes: Any) -> Observed:
    base = Observed(pool or POOL, [], None, RouterView(), Recall(), SETTINGS, CLOCK)
    return replace(base, **changes)


def _ready(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
    pod["status"] = {"phase": "Running", "podIP": "127.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]}
    return pod


def test_a_new_pool_creates_everything_and_asks_to_look_again_soon() -> None:
    decision = decide(_observed(), now=NOW)
    kinds = [o["kind"] for o in decision.router]
    assert kinds == ["Secret", "ServiceAccount", "Role", "RoleBinding", "Service", "Deployment"]
    assert decision.plan is not None
    assert [p["metadata"]["name"] for p in decision.plan.create] == ["p-engine-0", "p-engine-1"]
    assert decision.write_status
    assert decision.status.observed_generation == 3
    assert decision.next_delay(acted=True) == SETTINGS.busy_interval
    assert decision.next_delay(acted=False) == max(SETTINGS.busy_interval, SETTINGS.status_interval / 2)


def test_router_objects_are_applied_on_a_new_generation_a_drift_or_a_resync_only() -> None:
    first = decide(_observed(), now=NOW)
    deployment = next(o for o in first.router if o["kind"] == "Deployment")
    pods = [_ready(p) for p in first.plan.create] if first.plan else []
    applied = Recall(router_generation=3, router_applied_at=CLOCK - 1)
    quiet = decide(_observed(pods=pods, deployment=deployment, recall=applied), now=NOW)
    assert quiet.router == ()
    assert quiet.plan is not None
    assert quiet.plan.idle
    new_generation = decide(
        _observed(pods=pods, deployment=deployment, recall=replace(applied, router_generation=2)), now=NOW
    )
    assert len(new_generation.router) == 6
    drifted = copy.deepcopy(deployment)
    drifted["metadata"]["labels"]["rolloutpool.io/pool"] = "edited"  # someone edited the Deployment
    assert len(decide(_observed(pods=pods, deployment=drifted, recall=applied), now=NOW).router) == 6
    stale = replace(applied, router_applied_at=CLOCK - SETTINGS.router_resync_seconds)
    assert len(decide(_observed(pods=pods, deployment=deployment, recall=stale), now=NOW).router) == 6


def test_a_quiet_pool_writes_no_status_and_rests() -> None:
    first = decide(_observed(), now=NOW)
    deployment = next(o for o in first.router if o["kind"] == "Deployment")
    pods = [_ready(p) for p in first.plan.create] if first.plan else []
    recall = Recall(router_generation=3, router_applied_at=CLOCK)
    settled = decide(_observed(pods=pods, deployment=deployment, recall=recall), now=NOW)
    pool = {**POOL, "status": settled.status.model_dump(mode="json", by_alias=True, exclude_none=True)}
    again = decide(_observed(pool, pods=pods, deployment=deployment, recall=recall), now=NOW + 1)
    assert not again.write_status
    assert again.events == ()
    assert again.next_delay(acted=False) == SETTINGS.status_interval


def test_an_unservable_spec_plans_nothing_and_warns() -> None:
    pool = copy.deepcopy(POOL)
    pool["spec"]["engine"]["kvCapacityTokens"] = 1000  # below one maxModelLen
    decision = decide(_observed(pool), now=NOW)
    assert decision.spec_error is not None
    assert decision.plan is None
    assert decision.router == ()
    assert [e[0] for e in decision.events].count("Warning") == 1


def test_unknown_live_sessions_hold_a_drain_open() -> None:
    pool = copy.deepcopy(POOL)
    pool["spec"]["replicas"] = 1
    pods = [_ready(p) for p in decide(_observed(), now=NOW).plan.create]  # type: ignore[union-attr]
    pods[1]["metadata"]["annotations"] = {"rolloutpool.io/drain-started": f"{NOW - 10:.3f}"}
    unknown = decide(_observed(pool, pods=pods, routers=RouterView(known=False)), now=NOW)
    assert unknown.plan is not None
    assert unknown.plan.delete == ()  # no router answered: a session may still live there
    known = decide(_observed(pool, pods=pods, routers=RouterView(known=True)), now=NOW)
    assert known.plan is not None
    assert known.plan.delete == ("p-engine-1",)


def test_the_slow_loop_asks_for_a_read_when_due_and_decides_from_it() -> None:
    pool = copy.deepcopy(POOL)
    pool["spec"]["autoscaling"] = {"enabled": True, "prometheusUrl": "http://prom:9090", "intervalSeconds": 15}
    pods = [_ready(p) for p in decide(_observed(), now=NOW).plan.create]  # type: ignore[union-attr]
    observed = _observed(pool, pods=pods)
    query = metrics_query(observed, now=NOW)
    assert query is not None
    assert (query.url, query.replicas) == ("http://prom:9090", ("p-engine-0", "p-engine-1"))
    assert query.window_seconds == 120.0  # the law's window of engine time: real engines, a 15 s interval
    signals = {n: ReplicaSignals(kv_usage=0.3, kv_capacity_tokens=400000, sampled_at=NOW - 1) for n in query.replicas}
    decision = decide(replace(observed, metrics=MetricsRead(signals)), now=NOW)
    assert decision.read_metrics
    assert decision.control.control_at == CLOCK
    assert decision.control.health is not None
    assert decision.control.health.available
    assert decision.next_in == 15
    later = replace(observed, recall=Recall(control=decision.control), clock=CLOCK + 5)
    assert metrics_query(later, now=NOW + 5) is None
    kept = decide(later, now=NOW + 5)
    assert not kept.read_metrics
    assert kept.next_in == 10
    failed = decide(replace(observed, metrics=MetricsRead(error="connection refused")), now=NOW)
    assert failed.control.health is not None
    assert failed.control.health.reason == "PrometheusUnreachable"


def test_a_due_step_without_a_read_counts_as_unreachable() -> None:
    pool = copy.deepcopy(POOL)
    pool["spec"]["autoscaling"] = {"enabled": True, "prometheusUrl": "http://prom:9090"}
    pods = [_ready(p) for p in decide(_observed(), now=NOW).plan.create]  # type: ignore[union-attr]
    decision = decide(_observed(pool, pods=pods, recall=Recall(control=ControlMemo())), now=NOW)
    assert decision.control.health is not None
    assert decision.control.health.reason == "PrometheusUnreachable"


def test_a_time_scaled_pools_rates_reach_the_law_per_engine_second() -> None:
    """Prometheus' rates are per wall second; a simulated pool's engines run timeScale times faster, so the law (whose
    thresholds are per engine second: 0.05 preemptions/s) must see a tenth of them at time scale 10."""
    decisions = {}
    for scale in (1.0, 10.0):
        pool = copy.deepcopy(POOL)
        pool["spec"]["engine"]["simulator"] = {"timeScale": scale}
        pool["spec"]["autoscaling"] = {"enabled": True, "prometheusUrl": "http://prom:9090", "intervalSeconds": 15}
        pods = [_ready(p) for p in decide(_observed(pool), now=NOW).plan.create]  # type: ignore[union-attr]
        preempting = ReplicaSignals(  # 0.2 preemptions per wall second: 0.02 per engine second at time scale 10
            kv_usage=0.5, preemptions_per_s=0.2, kv_capacity_tokens=400000, sampled_at=NOW - 1
        )
        signals = {f"p-engine-{i}": preempting for i in range(2)}
        decisions[scale] = decide(replace(_observed(pool, pods=pods), metrics=MetricsRead(signals)), now=NOW)
    real, scaled = (
        {r.name: r for r in decisions[s].status.replica_status or []} for s in (1.0, 10.0)
    )  # fmt: skip
    assert all(r.target is not None and r.target < 0.9 for r in real.values()), real  # cut on 0.2/s
    assert all(r.target == 0.9 for r in scaled.values()), scaled  # 0.02/s of engine time: no pressure
    seen = decisions[10.0].control.signals["p-engine-0"]
    assert seen is not None
    assert seen.preemptions_per_s == 0.2 / 10
