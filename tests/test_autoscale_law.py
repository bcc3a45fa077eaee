"""The control law, pure and table-driven, with fake time (``now`` passed in)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rolloutpool.autoscale import (
    LawParams,
    ReplicaControl,
    ReplicaSignals,
    cheap_cache_reads,
    classify_health,
    decide_replica,
    decide_unobserved,
    initial_cap,
    pressure_reason,
)

P = LawParams(
    floor=10, ceiling=40, target_kv_usage=0.85, tolerance=0.05, cooldown_seconds=60, decrease_factor=0.8,
    increase_step=1, reprefill_tokens_per_s=2000, preemptions_per_s=0.01, waiting_threshold=1,
    slow_start_factor=1.0, slow_start_near_factor=1.0, settle_seconds=180, probe_seconds=600, binding_slack=1,
    severe_factor=3.0, quarantine_on="any", quarantine_holds=True,
)  # fmt: skip
CALM = ReplicaSignals(kv_usage=0.5, preemptions_per_s=0.0, waiting=0, reprefill_tokens_per_s=0.0, live_sessions=20)
EVICTING = replace(CALM, reprefill_tokens_per_s=5000.0)
"""Over the threshold, under ``severe_factor`` times it: the edge of the cliff."""
STORM = replace(CALM, reprefill_tokens_per_s=10000.0)
"""Far over the threshold."""
FREE = replace(CALM, kv_usage=0.2, kv_cap=30)
"""A mostly free cache, nothing evicted, a measured floor past the slow start's next step."""


def at(cap: int, *, changed_at: float | None = 0.0, reason: str | None = None, **kw: object) -> ReplicaControl:
    return ReplicaControl(cap=cap, changed_at=changed_at, reason=reason, **kw)  # type: ignore[arg-type]


# (case, previous, signals, now, expected cap, quarantined, reason)
CASES = [
    ("raise without pressure under target", at(20), CALM, 100, 21, False, "Raised"),
    ("first decision starts at the floor and raises", None, replace(CALM, live_sessions=10), 0, 11, False, "Raised"),
    ("hold inside the band", at(20), replace(CALM, kv_usage=0.82), 100, 20, False, None),
    ("hold above the target", at(20), replace(CALM, kv_usage=0.95), 100, 20, False, None),
    ("hold while the cap does not bind", at(20), replace(CALM, live_sessions=12), 100, 20, False, None),
    ("hold inside the cooldown", at(20), CALM, 30, 20, False, None),
    ("hold without a usage reading", at(20), replace(CALM, kv_usage=None), 100, 20, False, None),
    ("one step back at the edge of the cliff", at(20), EVICTING, 100, 19, True, "Evicting"),
    ("multiplicative cut under severe eviction", at(20), STORM, 100, 16, True, "Evicting"),
    ("severe preemptions cut multiplicatively", at(20), replace(CALM, preemptions_per_s=0.05), 100, 16, True,
     "Preempting"),
    ("mild preemptions step back", at(20), replace(CALM, preemptions_per_s=0.02), 100, 19, True, "Preempting"),
    ("a waiting queue with the KV cache full steps back", at(20), replace(CALM, waiting=5, kv_usage=0.95), 100, 19,
     True, "Queueing"),
    ("slow start jumps to the measured floor", at(20), replace(CALM, kv_cap=55), 100, 40, False, "Raised"),
    ("slow start climbs past a measured floor under it", at(20), replace(CALM, kv_cap=12), 100, 21, False, "Raised"),
    ("a learned limit ignores the KV projection", at(20, limit=22), replace(CALM, kv_cap=80), 100, 21, False,
     "Raised"),
    ("a mostly free cache jumps to the measured floor inside the cooldown", at(20), FREE, 30, 30, False, "Raised"),
    ("a mostly free cache still waits the jump cooldown", at(20), FREE, 10, 20, False, None),
    ("a slow-start step keeps the cooldown", at(20), replace(FREE, kv_cap=None), 30, 20, False, None),
    ("a floor within the slow start's own step keeps the cooldown", at(20), replace(FREE, kv_cap=21), 30, 20, False,
     None),
    ("any eviction keeps the cooldown before the jump", at(20), replace(FREE, reprefill_tokens_per_s=50.0), 30, 20,
     False, None),
    ("any preemption keeps the cooldown before the jump", at(20), replace(FREE, preemptions_per_s=0.001), 30, 20,
     False, None),
    ("unknown eviction keeps the cooldown before the jump", at(20), replace(FREE, reprefill_tokens_per_s=None), 30,
     20, False, None),
    ("a cache half full keeps the cooldown before the jump", at(20), replace(FREE, kv_usage=0.5), 30, 20, False,
     None),
    ("a learned limit keeps the cooldown", at(20, limit=40), FREE, 30, 20, False, None),
    ("a cap nobody waits for does not jump", at(20), replace(FREE, live_sessions=12), 30, 20, False, None),
    ("a waiting queue with free KV blocks is not pressure", at(20), replace(CALM, waiting=5), 100, 21, False,
     "Raised"),
    ("a cut right after a raise does not wait", at(21, reason="Raised"), EVICTING, 10, 20, True, "Evicting"),
    ("floor clamp: pressure at the floor holds it", at(10), STORM, 100, 10, True, "Evicting"),
    ("floor clamp: a cut never goes below", at(12), replace(STORM, live_sessions=12), 100, 10, True,
     "Evicting"),
    ("ceiling clamp: no raise past it", at(40), replace(CALM, live_sessions=40), 100, 40, False, None),
    ("ceiling clamp: a cap above is brought down", at(55), replace(CALM, live_sessions=40), 100, 40, False, None),
    ("re-prefill under the warning level is no sign", at(20), replace(CALM, reprefill_tokens_per_s=400), 100, 21,
     False, "Raised"),
    ("re-prefill under the threshold stops the climb", at(20), replace(CALM, reprefill_tokens_per_s=1500), 100, 20,
     False, "Nearing"),
    ("a settling cut holds, quarantined", at(16, reason="Evicting"), EVICTING, 100, 16, True,
     "Evicting"),
    ("pressure after the settle time cuts again", at(16, reason="Evicting"),
     replace(EVICTING, live_sessions=16), 200, 15, True,
     "Evicting"),
    ("sessions above the cap still finishing: hold", at(16), replace(EVICTING, live_sessions=19), 500, 16, True,
     "Evicting"),
    ("additive raise stops one under the learned limit", at(24, limit=25, limit_at=50.0),
     replace(CALM, live_sessions=24), 100, 24, False, None),
    ("probe one step past the limit after probe_seconds", at(24, limit=25, limit_at=0.0),
     replace(CALM, live_sessions=24), 700, 25, False, "Probed"),
    ("a failed probe of the limit steps back once", at(25, reason="Probed", limit=25, limit_at=0.0),
     replace(EVICTING, live_sessions=25), 710, 24, True, "Evicting"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("previous", "signals", "now", "cap", "quarantined", "reason"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_law_table(
    previous: ReplicaControl | None,
    signals: ReplicaSignals,
    now: float,
    cap: int,
    quarantined: bool,
    reason: str | None,
) -> None:
    decision = decide_replica(previous=previous, signals=signals, params=P, now=now)
    assert (decision.cap, decision.quarantined, decision.reason) == (cap, quarantined, reason)
    assert P.floor <= decision.cap <= P.ceiling


def test_a_cut_learns_the_limit_and_raises_stop_under_it() -> None:
    control = decide_replica(previous=at(20), signals=EVICTING, params=P, now=100)
    assert (control.cap, control.limit, control.limit_at) == (19, 20, 100)
    now = 100.0
    for _ in range(20):  # 20 calm minutes: back up to one under the limit, never to it before probe_seconds
        now += 60
        control = decide_replica(previous=control, signals=replace(CALM, live_sessions=control.cap), params=P, now=now)
        if now - 100 < P.probe_seconds:
            assert control.cap <= 19
    assert control.cap >= 20  # probed past the old limit once calm long enough


def test_slow_start_raises_multiplicatively_until_the_first_pressure() -> None:
    params = replace(P, slow_start_factor=1.5)
    far = replace(CALM, kv_usage=0.3, live_sessions=10)  # far from the cliff: the fast factor
    first = decide_replica(previous=at(10), signals=far, params=params, now=100)
    assert first.cap == 15
    cut = decide_replica(previous=first, signals=replace(EVICTING, live_sessions=15), params=params, now=110)
    assert (cut.cap, cut.limit) == (14, 15)
    calm = replace(CALM, live_sessions=14)
    later = decide_replica(previous=replace(cut, changed_at=0.0), signals=calm, params=params, now=1000)
    assert later.cap == cut.cap + 1  # additive once a limit is known


def test_a_storm_cuts_multiplicatively_then_climbs_back_by_probes_only() -> None:
    control = decide_replica(previous=at(30), signals=replace(STORM, live_sessions=30), params=P, now=100)
    assert (control.cap, control.limit) == (24, 25)
    calm = replace(CALM, live_sessions=24)
    assert decide_replica(previous=control, signals=calm, params=P, now=100 + P.cooldown_seconds).cap == 24
    assert decide_replica(previous=control, signals=calm, params=P, now=100 + P.probe_seconds).cap == 25


def test_nearing_the_cliff_turns_the_climb_into_probes() -> None:
    warned = decide_replica(previous=at(20), signals=replace(CALM, reprefill_tokens_per_s=1000), params=P, now=100)
    assert (warned.cap, warned.limit, warned.limit_at, warned.reason) == (20, 21, 100, "Nearing")
    calm = replace(CALM, live_sessions=20)
    assert decide_replica(previous=warned, signals=calm, params=P, now=200).cap == 20  # no raise before a probe
    probed = decide_replica(previous=warned, signals=calm, params=P, now=100 + P.probe_seconds)
    assert (probed.cap, probed.reason, probed.limit) == (21, "Probed", 21)


def test_eviction_of_idle_prefixes_speeds_the_slow_start_up_instead_of_stopping_it() -> None:
    params = replace(P, idle_eviction_factor=1.15, idle_eviction_cooldown_seconds=15, idle_eviction_usage=0.25)
    idle = replace(CALM, kv_usage=0.4, kv_usage_mean=0.2, reprefill_tokens_per_s=1000.0)  # past warning_fraction
    fast = decide_replica(previous=at(20), signals=idle, params=params, now=16)
    assert (fast.cap, fast.reason, fast.limit) == (23, "Raised", None)  # x1.15 after 15 s, no Nearing stop
    assert decide_replica(previous=at(20), signals=idle, params=params, now=14).cap == 20  # its own cooldown
    # a cache that ran fuller over the window, an unknown mean or unknown preemptions: early eviction stops it
    for signals in (
        replace(idle, kv_usage=0.1, kv_usage_mean=0.3),
        replace(idle, kv_usage_mean=None),
        replace(idle, preemptions_per_s=None),
        replace(idle, weight_updates=1.0),  # a flushed, reloaded engine reads empty: no sign of idle prefixes
    ):
        warned = decide_replica(previous=at(20), signals=signals, params=params, now=100)
        assert (warned.cap, warned.reason, warned.limit) == (20, "Nearing", 21), signals
    # nothing evicted yet: the gentle slow start, after the whole cooldown
    quiet = replace(idle, reprefill_tokens_per_s=0.0)
    assert decide_replica(previous=at(20), signals=quiet, params=params, now=16).cap == 20
    assert decide_replica(previous=at(20), signals=quiet, params=params, now=60).cap == 21
    # once a limit is learned the slow start is over: the cooldown holds and early eviction stops the climb again
    learned = at(20, limit=30)
    assert decide_replica(previous=learned, signals=idle, params=params, now=16).cap == 20
    stopped = decide_replica(previous=learned, signals=idle, params=params, now=60)
    assert (stopped.cap, stopped.reason, stopped.limit) == (20, "Nearing", 21)
    # over the threshold it is pressure, whatever the usage
    cut = decide_replica(previous=at(20), signals=replace(idle, reprefill_tokens_per_s=2500.0), params=params, now=16)
    assert (cut.cap, cut.reason) == (19, "Evicting")


def test_mild_pressure_quarantines_only_when_asked() -> None:
    params = replace(P, quarantine_on="severe")
    assert not decide_replica(previous=at(20), signals=EVICTING, params=params, now=100).quarantined
    assert decide_replica(previous=at(20), signals=STORM, params=params, now=100).quarantined
    assert not decide_replica(
        previous=at(20), signals=STORM, params=replace(P, quarantine_on="never"), now=100
    ).quarantined


def test_by_default_only_the_cutting_step_quarantines() -> None:
    params = LawParams(floor=10, ceiling=40)
    storm = replace(STORM, reprefill_tokens_per_s=50_000.0, live_sessions=30)
    cut = decide_replica(previous=at(30), signals=storm, params=params, now=100)
    assert (cut.cap, cut.quarantined) == (25, True)  # x0.85
    held = decide_replica(previous=cut, signals=replace(storm, live_sessions=27), params=params, now=115)
    assert (held.cap, held.quarantined, held.reason) == (25, False, "Evicting")


def test_the_law_starts_at_its_initial_cap_clamped_to_floor_and_ceiling() -> None:
    params = LawParams(floor=10, ceiling=40, initial=20)
    assert initial_cap(params) == 20
    assert initial_cap(replace(params, initial=None)) == 10
    assert initial_cap(replace(params, initial=99)) == 40
    assert initial_cap(replace(params, initial=3)) == 10
    calm = replace(CALM, kv_usage=0.3, live_sessions=20)
    first = decide_replica(previous=None, signals=calm, params=params, now=0)
    assert (first.cap, first.reason) == (21, "Raised")  # slow start from 20: x1.05, at least one step
    blind = decide_replica(previous=None, signals=None, params=params, now=0)
    assert (blind.cap, blind.reason) == (10, "NoMetrics")  # Prometheus down: the floor, as ever


FLOOR_S = 0.01
"""A step's floor in these tests (engine seconds)."""


def test_cheap_cache_reads_need_both_costs_and_a_whole_read_under_the_headroom() -> None:
    cheap = replace(P, step_floor_seconds=FLOOR_S, cache_read_seconds=0.5 * FLOOR_S)
    assert cheap_cache_reads(cheap)
    assert not cheap_cache_reads(replace(cheap, cache_read_seconds=FLOOR_S))  # a read of it doubles the step
    assert not cheap_cache_reads(replace(cheap, step_floor_seconds=None))  # real vLLM: unknown
    assert not cheap_cache_reads(replace(cheap, cache_read_seconds=None))
    assert cheap_cache_reads(replace(cheap, cache_read_seconds=2 * FLOOR_S, headroom_ratio=3.5))
    assert initial_cap(cheap) == P.ceiling  # nothing to protect against until pressure shows
    assert initial_cap(replace(cheap, cache_read_seconds=FLOOR_S)) == P.floor  # P has no initial: the floor


def test_eviction_in_steps_with_room_is_no_pressure_where_cache_reads_are_cheap() -> None:
    cheap = replace(P, step_floor_seconds=FLOOR_S, cache_read_seconds=0.5 * FLOOR_S)
    roomy = replace(STORM, mean_itl_seconds=1.5 * FLOOR_S)
    assert pressure_reason(roomy, cheap) is None
    assert pressure_reason(replace(roomy, mean_itl_seconds=2.0 * FLOOR_S), cheap) == "Evicting"  # at the mark
    assert pressure_reason(replace(roomy, mean_itl_seconds=None), cheap) == "Evicting"  # unknown: no room
    assert pressure_reason(roomy, replace(cheap, cache_read_seconds=1.5 * FLOOR_S)) == "Evicting"  # dear reads
    assert pressure_reason(replace(roomy, preemptions_per_s=1.0), cheap) == "Preempting"  # preemption still counts
    # with room the slow start climbs as for idle prefixes (x1.15 every 15 s), eviction or not
    params = replace(cheap, cooldown_seconds=60, idle_eviction_factor=1.15, idle_eviction_cooldown_seconds=15)
    binding = replace(roomy, kv_usage=0.5, live_sessions=20, queued_sessions=4)
    assert decide_replica(previous=at(20), signals=binding, params=params, now=15).cap == 23
    dear = replace(binding, mean_itl_seconds=2.5 * FLOOR_S, reprefill_tokens_per_s=100.0)  # under the threshold
    assert decide_replica(previous=at(20), signals=dear, params=params, now=15).cap == 20  # the 60 s cooldown


def test_the_slow_start_climbs_gently_once_kv_usage_is_past_the_near_mark() -> None:
    params = LawParams(floor=10, ceiling=100, initial=20, slow_start_factor=1.15, slow_start_near_factor=1.08)
    far = decide_replica(previous=None, signals=replace(CALM, kv_usage=0.3, live_sessions=20), params=params, now=0)
    near = decide_replica(previous=None, signals=replace(CALM, kv_usage=0.6, live_sessions=20), params=params, now=0)
    assert (far.cap, near.cap) == (23, 21)  # x1.15 far from the cliff, x1.08 near it
    assert far.limit is None  # both still the slow start: no pressure seen yet
    assert near.limit is None
    busy = replace(CALM, kv_usage=0.6, live_sessions=50)
    assert decide_replica(previous=at(50), signals=busy, params=params, now=100).cap == 54


def test_the_early_jump_never_waits_longer_than_the_cooldown() -> None:
    params = replace(P, cooldown_seconds=5, jump_cooldown_seconds=15)
    calm = replace(CALM, kv_usage=0.2)
    assert decide_replica(previous=at(20), signals=FREE, params=params, now=6).cap == 30  # the jump: 5 s
    assert decide_replica(previous=at(20), signals=calm, params=params, now=6).cap == 21  # a slow-start step: 5 s


def test_a_replica_without_metrics_of_its_own_starts_at_or_drops_to_the_initial_cap() -> None:
    params = LawParams(floor=10, ceiling=40, initial=20)
    assert decide_unobserved(previous=None, params=params, now=5) == ReplicaControl(cap=20)
    low = at(14, reason="Evicting")
    assert decide_unobserved(previous=low, params=params, now=5) == low  # under the start: kept as it is
    high = decide_unobserved(previous=replace(at(30), quarantined=True, limit=31), params=params, now=5)
    assert (high.cap, high.quarantined, high.reason, high.changed_at, high.limit) == (20, False, "NoMetrics", 5, 31)


def test_missing_metrics_fall_back_to_the_floor_unquarantined() -> None:
    down = decide_replica(previous=at(30, reason="Raised"), signals=None, params=P, now=100)
    assert (down.cap, down.quarantined, down.reason, down.changed_at) == (10, False, "NoMetrics", 100)
    again = decide_replica(previous=down, signals=None, params=P, now=200)
    assert again == down  # no new change, the cooldown clock is not reset
    assert decide_replica(previous=None, signals=None, params=P, now=0).cap == P.floor


@pytest.mark.parametrize("period", [1, 2, 3, 5])
def test_flapping_inputs_produce_bounded_changes(period: int) -> None:
    """Pressure on for ``period`` steps, off for ``period`` steps, for two hours of 15 s steps."""
    control: ReplicaControl | None = None
    changes, caps, last_change = 0, [], None
    for i in range(480):
        now = 15.0 * i
        pressure = (i // period) % 2 == 0
        live = control.cap if control else P.floor
        signals = replace(EVICTING if pressure else CALM, live_sessions=live)
        nxt = decide_replica(previous=control, signals=signals, params=P, now=now)
        if control is not None and nxt.cap != control.cap:
            changes += 1
            if nxt.cap > control.cap and last_change is not None:
                assert now - last_change >= P.cooldown_seconds  # raises respect the cooldown
            last_change = now
        control = nxt
        caps.append(control.cap)
    assert changes <= 7200 / P.cooldown_seconds  # at most one change per cooldown on average
    assert all(P.floor <= c <= P.ceiling for c in caps)
    assert max(caps) <= P.floor + 7200 / P.cooldown_seconds


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
