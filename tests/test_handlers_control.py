"""The slow loop inside a pass (with a fake Prometheus reader and injected clocks), and the pass's pure helpers.

``_step`` does what a pass does: ``metrics_due`` says whether to read, ``read_metrics`` reads,
``remember_read`` and ``step_controls`` decide (:mod:`rolloutpool.reconcile.control`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from rolloutpool.api.spec import RolloutPoolSpec, SimulatorSpec
from rolloutpool.api.status import ReplicaStatus, RolloutPoolStatus
from rolloutpool.autoscale import RATE_WINDOW_SECONDS, ReplicaControl, ReplicaSignals
from rolloutpool.handlers.context import PoolMemory
from rolloutpool.handlers.control import read_metrics
from rolloutpool.metrics.prom import PrometheusUnreachable
from rolloutpool.reconcile.caps import controls_from_status, plan_controls
from rolloutpool.reconcile.control import (
    ControlStep,
    metrics_due,
    remember_read,
    spec_window_seconds,
    stale_after_seconds,
    step_controls,
    window_seconds,
)
from rolloutpool.reconcile.decide import (
    health_from_status,
    previous_status,
    router_urls,
    status_wire,
    unknown_sessions,
)

SPEC: dict[str, Any] = {
    "replicas": 2,
    "engine": {"kind": "simulated", "model": "m", "maxModelLen": 32768, "kvCapacityTokens": 400000},
    "concurrency": {"workingSetTarget": 0.9},
    "autoscaling": {"enabled": True, "prometheusUrl": "http://prom:9090", "intervalSeconds": 15},
}
NAMES = ["p-engine-0", "p-engine-1"]
NOW = 1_800_000_000.0


class Reader:
    """A PrometheusSignals stand-in: answers with fixed signals, or fails."""

    def __init__(self, signals: Mapping[str, ReplicaSignals | None] | None = None, error: str | None = None) -> None:
        self.signals = dict(signals or {})
        self.error = error
        self.reads: list[tuple[str, tuple[str, ...], float]] = []

    def read(
        self, *, namespace: str, replicas: Sequence[str], window_seconds: float
    ) -> Mapping[str, ReplicaSignals | None]:
        self.reads.append((namespace, tuple(replicas), window_seconds))
        if self.error is not None:
            raise PrometheusUnreachable(self.error)
        return {name: self.signals.get(name) for name in replicas}


def _spec(**autoscaling: Any) -> RolloutPoolSpec:
    raw = copy.deepcopy(SPEC)
    raw["autoscaling"].update(autoscaling)
    return RolloutPoolSpec.model_validate(raw)


def _fresh(usage: float = 0.2) -> ReplicaSignals:
    return ReplicaSignals(kv_usage=usage, kv_capacity_tokens=400000, sampled_at=NOW - 1)


async def _step(
    reader: Reader,
    memory: PoolMemory,
    *,
    spec: RolloutPoolSpec,
    clock: float,
    replicas: Sequence[str] = tuple(NAMES),
    previous: RolloutPoolStatus | None = None,
    now: float = NOW,
    queued_sessions: int | None = None,
) -> ControlStep:
    memo = memory.recall().control
    url = metrics_due(spec=spec, replicas=replicas, memo=memo, clock=clock)
    if url is not None:
        window = spec_window_seconds(spec)
        read = await read_metrics(lambda _url: reader, url, namespace="ns", replicas=replicas, window_seconds=window)
        memo = remember_read(spec=spec, read=read, now=now, clock=clock, queued_sessions=queued_sessions)
        memory.keep_control(memo)
    return step_controls(
        spec=spec, replicas=replicas, previous=previous, memo=memo, stepped=url is not None, now=now, clock=clock
    )


async def test_steps_only_when_the_interval_elapsed_and_new_replicas_keep_the_routers_target() -> None:
    reader, memory, spec = Reader({n: _fresh() for n in NAMES}), PoolMemory(), _spec()
    first = await _step(reader, memory, spec=spec, clock=100.0)
    assert first.stepped
    assert first.health.reason == "MetricsAvailable"
    expected = plan_controls(
        spec=spec, replicas=NAMES, signals=reader.signals, previous={}, health=first.health, now=NOW
    )
    assert first.controls == expected  # the law saw the signals read
    assert {c.target for c in first.controls.values()} == {spec.concurrency.working_set_target}
    assert reader.reads == [("ns", tuple(NAMES), 120.0)]  # the law's two minutes at the default 15 s interval

    previous = RolloutPoolStatus(
        replica_status=[
            ReplicaStatus(
                name=n,
                index=i,
                target=c.target,
                target_changed_at=None if c.changed_at is None else datetime.fromtimestamp(c.changed_at, tz=UTC),
            )
            for i, (n, c) in enumerate(first.controls.items())
        ]
    )
    later = await _step(reader, memory, spec=spec, clock=110.0, previous=previous, replicas=[*NAMES, "p-engine-2"])
    assert not later.stepped
    assert later.next_in == pytest.approx(5.0)
    assert len(reader.reads) == 1
    assert later.controls["p-engine-0"] == controls_from_status(previous)["p-engine-0"]
    assert later.controls["p-engine-2"].target is None  # the routers' own target until the law has its signals

    again = await _step(reader, memory, spec=spec, clock=115.0, previous=previous)
    assert again.stepped
    assert len(reader.reads) == 2


async def test_unreachable_prometheus_leaves_the_routers_target_and_says_why() -> None:
    reader, memory, spec = Reader(error="Prometheus at http://prom:9090 refused the connection"), PoolMemory(), _spec()
    previous = RolloutPoolStatus(
        replica_status=[ReplicaStatus(name=n, index=i, target=0.7) for i, n in enumerate(NAMES)]
    )
    step = await _step(reader, memory, spec=spec, clock=0.0, previous=previous)
    assert (step.health.available, step.health.reason) == (False, "PrometheusUnreachable")
    assert "refused the connection" in step.health.message
    # blind, the law publishes no target: the routers' own (safe by construction) applies, never a guess
    assert {(c.target, c.reason) for c in step.controls.values()} == {(None, "NoMetrics")}
    assert not any(c.quarantined for c in step.controls.values())


async def test_no_replicas_reads_nothing_and_the_first_pass_with_pods_steps_at_once() -> None:
    reader, memory, spec = Reader({n: _fresh() for n in NAMES}), PoolMemory(), _spec()
    empty = await _step(reader, memory, spec=spec, clock=0.0, replicas=[])
    assert (empty.health.available, empty.health.reason, empty.controls) == (False, "MetricsMissing", {})
    assert reader.reads == []
    step = await _step(reader, memory, spec=spec, clock=1.0)
    assert step.stepped
    assert len(reader.reads) == 1


async def test_disabled_autoscaling_publishes_no_cap_every_pass_without_reading() -> None:
    raw = copy.deepcopy(SPEC)
    raw["autoscaling"] = {"enabled": False}
    spec = RolloutPoolSpec.model_validate(raw)
    reader = Reader()
    step = await _step(reader, PoolMemory(), spec=spec, clock=0.0)
    # no target from the law: the routers keep concurrency.workingSetTarget
    assert set(step.controls.values()) == {ReplicaControl(target=None)}
    assert step.health.reason == "AutoscalingDisabled"
    assert step.next_in is None
    assert reader.reads == []


async def test_pressure_reaches_the_law_with_the_previous_targets() -> None:
    spec = _spec()
    previous = RolloutPoolStatus(
        replica_status=[ReplicaStatus(name=n, index=i, target=0.8) for i, n in enumerate(NAMES)]
    )
    hot = ReplicaSignals(kv_usage=0.99, preemptions_per_s=2.0, kv_capacity_tokens=400000, sampled_at=NOW - 1)
    reader = Reader({"p-engine-0": hot, "p-engine-1": _fresh(0.8)})
    step = await _step(reader, PoolMemory(), spec=spec, clock=0.0, previous=previous)
    expected = plan_controls(
        spec=spec,
        replicas=NAMES,
        signals=reader.signals,
        previous=controls_from_status(previous),
        health=step.health,
        now=NOW,
    )
    assert step.controls == expected
    assert step.controls["p-engine-0"].quarantined
    target = step.controls["p-engine-0"].target
    assert target is not None
    assert target < 0.8
    assert not step.controls["p-engine-1"].quarantined


def test_windows_are_the_laws_engine_time_and_grow_with_the_interval() -> None:
    assert window_seconds(5) == window_seconds(15) == RATE_WINDOW_SECONDS == 120.0  # the window the law was tuned on
    assert window_seconds(90) == 180.0  # two intervals at least
    assert window_seconds(5, time_scale=2.0) == 60.0  # engines twice as fast: the same engine seconds in half the time
    assert window_seconds(5, time_scale=10.0) == 30.0  # never under two default scrapes
    assert window_seconds(20, time_scale=10.0) == 40.0
    assert stale_after_seconds(15) == 60.0


def test_a_pools_window_follows_its_simulated_engines_time_scale() -> None:
    spec = _spec()
    assert spec_window_seconds(spec) == 120.0
    simulated = spec.model_copy(
        update={"engine": spec.engine.model_copy(update={"simulator": SimulatorSpec(time_scale=4.0)})}
    )
    assert spec_window_seconds(simulated) == 30.0


def test_router_urls_skip_pods_without_ip_or_being_deleted() -> None:
    pods = [
        {"metadata": {"name": "a"}, "status": {"podIP": "10.0.0.2"}},
        {"metadata": {"name": "b"}, "status": {}},
        {"metadata": {"name": "c", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"podIP": "10.0.0.3"}},
        {"metadata": {"name": "d"}, "status": {"podIP": "fd00::1"}},
    ]
    assert router_urls(pods) == ["http://10.0.0.2:8080", "http://[fd00::1]:8080"]


def test_unknown_sessions_hold_every_drain() -> None:
    assert unknown_sessions([{"metadata": {"name": "x"}}, {"metadata": {"name": "y"}}]) == {"x": 1, "y": 1}


def test_previous_status_tolerates_missing_and_garbled_status() -> None:
    assert previous_status({}) is None
    assert previous_status({"status": {"replicas": -3}}) is None
    parsed = previous_status({"status": {"replicas": 2, "conditions": []}})
    assert parsed is not None
    assert status_wire(parsed)["replicas"] == 2


def test_health_from_status_keeps_the_recorded_metrics_condition() -> None:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    status = RolloutPoolStatus.model_validate(
        {
            "conditions": [
                {"type": "MetricsAvailable", "status": "False", "reason": "MetricsStale", "lastTransitionTime": when}
            ]
        }
    )
    assert health_from_status(status).reason == "MetricsStale"
    assert health_from_status(None).reason == "AutoscalingDisabled"


async def test_the_routers_queue_reaches_every_replicas_signals() -> None:
    """The law raises a cap only while sessions wait; the routers' queue depth is that signal."""
    reader = Reader({"p-engine-0": _fresh(), "p-engine-1": None})
    step = await _step(reader, PoolMemory(), spec=_spec(), clock=0.0, queued_sessions=7)
    first = step.signals["p-engine-0"]
    assert first is not None
    assert first.queued_sessions == 7
    assert first.kv_usage == reader.signals["p-engine-0"].kv_usage  # type: ignore[union-attr]
    assert step.signals["p-engine-1"] is None
    unknown = await _step(reader, PoolMemory(), spec=_spec(), clock=0.0)
    assert unknown.signals["p-engine-0"].queued_sessions is None  # type: ignore[union-attr]
