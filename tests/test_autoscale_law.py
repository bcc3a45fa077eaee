"""The control law, pure and table-driven, with fake time (``now`` passed in): each replica's working-set target."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rolloutpool.autoscale import (
    LawParams,
    ReplicaControl,
    ReplicaSignals,
    classify_health,
    decide_replica,
    pressure_reason,
)

P = LawParams(
    initial=0.9, minimum=0.5, maximum=1.0, step=0.02, decrease_factor=0.9, cooldown_seconds=60,
    reprefill_tokens_per_s=2000, preemptions_per_s=0.01, waiting_threshold=1, severe_factor=3.0,
)  # fmt: skip
CALM = ReplicaSignals(kv_usage=0.5, preemptions_per_s=0.0, waiting=0, reprefill_tokens_per_s=0.0, live_sessions=20)
WAITING = replace(CALM, held_turns=3.0)
"""Turns wait for room, nothing presses: the target may rise."""
EVICTING = replace(CALM, reprefill_tokens_per_s=5000.0)
"""Kept prefixes re-prefilled over the threshold, under ``severe_factor`` times it."""
STORM = replace(CALM, reprefill_tokens_per_s=10000.0)
"""Far over the threshold: the replica is quarantined for the step."""


def at(target: float, *, changed_at: float | None = 0.0, reason: str | None = None) -> ReplicaControl:
    return ReplicaControl(target=target, changed_at=changed_at, reason=reason)


# (case, previous, signals, now, expected target, quarantined, reason)
TABLE = [
    ("no previous: the initial target", None, CALM, 100.0, 0.9, False, None),
    ("calm, nothing waits: held", at(0.9), CALM, 100.0, 0.9, False, None),
    ("turns wait, cooled: raised", at(0.9), WAITING, 100.0, 0.92, False, "Raised"),
    ("new sessions queue, cooled: raised", at(0.9), replace(CALM, queued_sessions=4), 100.0, 0.92, False, "Raised"),
    ("turns wait, in the cooldown: held", at(0.9), WAITING, 30.0, 0.9, False, None),
    ("raised to the maximum and no further", at(0.99), WAITING, 100.0, 1.0, False, "Raised"),
    ("at the maximum: held", at(1.0), WAITING, 100.0, 1.0, False, None),
    ("kept prefixes evicted: cut", at(0.9), EVICTING, 100.0, 0.81, False, "Evicting"),
    ("preempting: cut", at(0.9), replace(CALM, preemptions_per_s=0.02), 100.0, 0.81, False, "Preempting"),
    ("queueing on a full cache: cut", at(0.9), replace(CALM, waiting=5, kv_usage=0.95), 100.0, 0.81, False, "Queueing"),
    ("queueing with free blocks: no pressure", at(0.9), replace(CALM, waiting=5, kv_usage=0.5), 100.0, 0.9, False,
     None),
    ("a storm: cut and quarantined", at(0.9), STORM, 100.0, 0.81, True, "Evicting"),
    ("pressure in the cooldown: held, its reason shown", at(0.9), EVICTING, 30.0, 0.9, False, "Evicting"),
    ("a storm in the cooldown: quarantined, not cut", at(0.9), STORM, 30.0, 0.9, True, "Evicting"),
    ("at the minimum: no cut", at(0.5), STORM, 100.0, 0.5, True, "Evicting"),
    ("a weight update's burst: held", at(0.9), replace(CALM, preemptions_per_s=0.5, weight_updates=1.0), 100.0,
     0.9, False, "WeightUpdate"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("previous", "signals", "now", "target", "quarantined", "reason"), [t[1:] for t in TABLE], ids=[t[0] for t in TABLE]
)
def test_law_table(
    previous: ReplicaControl | None,
    signals: ReplicaSignals,
    now: float,
    target: float,
    quarantined: bool,
    reason: str | None,
) -> None:
    after = decide_replica(previous=previous, signals=signals, params=P, now=now)
    assert (after.target, after.quarantined, after.reason) == (target, quarantined, reason)
    if after.target != (P.initial if previous is None else previous.target):
        assert after.changed_at == now  # a move restarts the cooldown


def test_blind_publishes_no_target_so_the_routers_keep_their_own() -> None:
    after = decide_replica(previous=at(0.7), signals=None, params=P, now=100.0)
    assert (after.target, after.quarantined, after.reason) == (None, False, "NoMetrics")
    back = decide_replica(previous=after, signals=CALM, params=P, now=200.0)
    assert back.target == P.initial  # with signals again, from the initial target


def test_bad_params_are_refused() -> None:
    with pytest.raises(ValueError, match="minimum <= initial <= maximum"):
        LawParams(initial=0.4, minimum=0.5)
    with pytest.raises(ValueError, match="decrease_factor"):
        LawParams(decrease_factor=1.0)


@pytest.mark.parametrize("period", [1, 2, 5])
def test_flapping_inputs_produce_bounded_changes(period: int) -> None:
    control: ReplicaControl | None = None
    targets = []
    last_change = None
    changes = 0
    for i in range(480):  # two hours of 15 s steps, pressure and waiting turns alternating
        now = i * 15.0
        signals = EVICTING if (i // period) % 2 else WAITING
        nxt = decide_replica(previous=control, signals=signals, params=P, now=now)
        if control is not None and nxt.target != control.target:
            changes += 1
            if last_change is not None:
                assert now - last_change >= P.cooldown_seconds  # every move respects the cooldown
            last_change = now
        control = nxt
        assert control.target is not None
        targets.append(control.target)
    assert changes <= 7200 / P.cooldown_seconds + 1
    assert all(P.minimum <= t <= P.maximum for t in targets)


def test_pressure_reason_orders_the_signals() -> None:
    assert pressure_reason(CALM, P) is None
    both = replace(EVICTING, preemptions_per_s=1.0, waiting=9)
    assert pressure_reason(both, P) == "Evicting"
    assert pressure_reason(replace(both, reprefill_tokens_per_s=None), P) == "Preempting"
    assert pressure_reason(ReplicaSignals(waiting=2), P) == "Queueing"
    assert pressure_reason(ReplicaSignals(), P) is None


FRESH = replace(CALM, sampled_at=100.0)
ON = {"enabled": True, "reachable": True}
HEALTH = [
    ("disabled", {**ON, "enabled": False, "signals": {"a": FRESH}}, "AutoscalingDisabled", False),
    ("unreachable", {**ON, "reachable": False, "signals": {}, "error": "timed out"}, "PrometheusUnreachable", False),
    ("a replica without signals", {**ON, "signals": {"a": FRESH, "b": None}}, "MetricsMissing", False),
    ("a replica without KV usage", {**ON, "signals": {"a": replace(FRESH, kv_usage=None)}}, "MetricsMissing", False),
    ("old samples", {**ON, "signals": {"a": replace(FRESH, sampled_at=10.0)}}, "MetricsStale", False),
    ("no timestamp", {**ON, "signals": {"a": replace(FRESH, sampled_at=None)}}, "MetricsStale", False),
    ("fresh", {**ON, "signals": {"a": FRESH, "b": FRESH}}, "MetricsAvailable", True),
]


@pytest.mark.parametrize(("kwargs", "reason", "available"), [h[1:] for h in HEALTH], ids=[h[0] for h in HEALTH])
def test_classify_health(kwargs: dict[str, object], reason: str, available: bool) -> None:
    health = classify_health(now=120.0, stale_after_seconds=60.0, **kwargs)  # type: ignore[arg-type]
    assert (health.reason, health.available) == (reason, available)
    assert health.message


def test_classify_health_names_the_replicas() -> None:
    health = classify_health(
        enabled=True, reachable=True, signals={"r1": None, "r0": FRESH}, now=120.0, stale_after_seconds=60.0
    )
    assert "r1" in health.message
    assert "r0" not in health.message
    assert (
        "timed out"
        in classify_health(
            enabled=True, reachable=False, signals={}, now=0.0, stale_after_seconds=60.0, error="timed out"
        ).message
    )


def test_law_at_a_target_never_raises_past_it_unless_a_maximum_says_so() -> None:
    unset = LawParams.at_target(0.85)
    assert (unset.initial, unset.maximum) == (0.85, 0.85)
    raised = LawParams.at_target(0.85, maximum=1.0, step=0.05)
    assert (raised.initial, raised.maximum, raised.step) == (0.85, 1.0, 0.05)
    lowered = LawParams.at_target(0.85, maximum=0.8)  # a ceiling under the target: start at the ceiling
    assert (lowered.initial, lowered.maximum) == (0.8, 0.8)
