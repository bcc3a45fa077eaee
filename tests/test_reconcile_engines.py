"""The engine-pod plan: scale up and down, drains, rolling updates, failed pods, idempotence."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poolcases import load_example
from rolloutpool.api.pods import is_ready
from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.reconcile.children import desired_engine_pods
from rolloutpool.reconcile.engines import DrainEnd, EnginePlan, plan_engines
from rolloutpool.reconcile.labels import ANNOTATION_SPEC_HASH

IMAGE = "img:1"
TIMEOUT = 100.0
NOW = 10_000.0


def make_spec(replicas: int, max_model_len: int = 32768) -> tuple[dict[str, Any], RolloutPoolSpec]:
    pool = load_example("simulated-pool.yaml")
    pool["metadata"].update(namespace="ns", uid="uid-1")
    pool["spec"]["replicas"] = replicas
    pool["spec"]["engine"]["maxModelLen"] = max_model_len
    return pool, RolloutPoolSpec.model_validate(pool["spec"])


def desired_for(replicas: int, max_model_len: int = 32768) -> tuple[RolloutPoolSpec, dict[str, dict[str, Any]]]:
    pool, spec = make_spec(replicas, max_model_len)
    return spec, desired_engine_pods(pool=pool, spec=spec, default_image=IMAGE)


def running(manifest: dict[str, Any], *, ready: bool = True, phase: str = "Running") -> dict[str, Any]:
    pod = copy.deepcopy(manifest)
    pod["metadata"]["uid"] = "pod-" + pod["metadata"]["name"]
    pod["status"] = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return pod


def terminating(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return out


def fleet(
    replicas: int, *, max_model_len: int = 32768, overrides: dict[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Ready pods of an older or current spec; ``overrides`` maps pod name -> running() kwargs."""
    overrides = overrides or {}
    _, desired = desired_for(replicas, max_model_len)
    return [running(pod, **overrides.get(name, {})) for name, pod in desired.items()]


def plan(
    replicas: int,
    observed: list[dict[str, Any]],
    *,
    live: dict[str, int] | None = None,
    draining: dict[str, float] | None = None,
    now: float = NOW,
    max_model_len: int = 32768,
) -> EnginePlan:
    spec, desired = desired_for(replicas, max_model_len)
    return plan_engines(
        spec=spec,
        desired=desired,
        observed=observed,
        live_sessions=live or {},
        draining=draining or {},
        now=now,
        drain_timeout_seconds=TIMEOUT,
    )


def names(manifests: tuple[dict[str, Any], ...]) -> list[str]:
    return [m["metadata"]["name"] for m in manifests]


def E(i: int) -> str:  # noqa: N802 -- reads like the pod name it builds
    return f"sim-grpo-engine-{i}"


# ---------------------------------------------------------------- table


def test_creates_every_missing_replica_at_once() -> None:
    result = plan(3, [])
    assert names(result.create) == [E(0), E(1), E(2)]
    assert result.missing == (E(0), E(1), E(2))
    assert result.delete == result.start_drain == result.quarantine == ()
    assert result.end_drain == ()
    assert result.create[0]["metadata"]["annotations"][ANNOTATION_SPEC_HASH]


def test_steady_state_is_idle() -> None:
    result = plan(3, fleet(3), live={E(0): 5})
    assert result.idle
    assert result == EnginePlan()


def test_scale_up_creates_the_new_indexes_only() -> None:
    result = plan(5, fleet(3))
    assert names(result.create) == [E(3), E(4)]


def test_scale_down_drains_ready_surplus_highest_index_first() -> None:
    result = plan(2, fleet(5), live={E(2): 1, E(3): 4, E(4): 2})
    assert result.start_drain == (E(4), E(3), E(2))
    assert result.quarantine == (E(2), E(3), E(4))
    assert result.delete == ()
    assert result.reasons == {E(2): "ScaleDown", E(3): "ScaleDown", E(4): "ScaleDown"}
    assert result.recheck_seconds == TIMEOUT


def test_scale_down_deletes_unready_surplus_without_drain() -> None:
    result = plan(1, fleet(3, overrides={E(2): {"ready": False}}), live={E(1): 3})
    assert result.delete == (E(2),)
    assert result.start_drain == (E(1),)


@pytest.mark.parametrize(
    ("live", "started", "expected_end", "still_draining"),
    [
        (3, NOW - 10, None, True),  # sessions left, time left
        (0, NOW - 10, "Drained", False),  # drained
        (3, NOW - TIMEOUT, "DrainTimeout", False),  # exactly at the timeout
        (3, NOW - TIMEOUT - 1, "DrainTimeout", False),
    ],
)
def test_drain_ends_when_drained_or_timed_out(
    live: int, started: float, expected_end: str | None, still_draining: bool
) -> None:
    result = plan(2, fleet(3), live={E(2): live}, draining={E(2): started})
    assert result.start_drain == ()
    if expected_end is None:
        assert result.end_drain == ()
        assert result.delete == ()
        assert result.recheck_seconds == pytest.approx(started + TIMEOUT - NOW)
    else:
        assert result.end_drain == (DrainEnd(E(2), expected_end),)  # type: ignore[arg-type]
        assert result.delete == (E(2),)
    assert (E(2) in result.quarantine) is still_draining


def test_scale_back_up_cancels_a_drain() -> None:
    result = plan(3, fleet(3), live={E(2): 4}, draining={E(2): NOW - 5})
    assert result.end_drain == (DrainEnd(E(2), "Cancelled"),)
    assert result.quarantine == ()
    assert result.delete == ()


def test_terminating_pods_are_waited_for() -> None:
    pods = fleet(3)
    pods[1] = terminating(pods[1])
    result = plan(3, pods, draining={E(1): NOW - 5})
    assert result.waiting == (E(1),)
    assert result.create == ()  # the name is still taken
    assert result.missing == (E(1),)
    assert result.delete == ()
    assert result.end_drain == ()


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_finished_pods_are_deleted_at_once_then_recreated(phase: str) -> None:
    pods = fleet(3, overrides={E(1): {"ready": False, "phase": phase}})
    first = plan(3, pods, live={E(1): 2})
    assert first.delete == (E(1),)
    assert first.start_drain == ()
    assert first.reasons == {E(1): "Failed"}
    gone = [p for p in pods if p["metadata"]["name"] != E(1)]
    second = plan(3, gone)
    assert names(second.create) == [E(1)]


def test_rolling_update_replaces_one_ready_replica_at_a_time() -> None:
    old = fleet(3, max_model_len=32768)
    live = {E(0): 5, E(1): 1, E(2): 3}
    first = plan(3, old, live=live, max_model_len=16384)
    assert first.outdated == (E(0), E(1), E(2))
    assert first.start_drain == (E(1),)  # the replica with the fewest live sessions
    assert first.reasons == {E(1): "Update"}
    again = plan(3, old, live=live, draining={E(1): NOW}, max_model_len=16384)
    assert again.start_drain == ()
    assert again.quarantine == (E(1),)
    done = plan(3, old, live={**live, E(1): 0}, draining={E(1): NOW}, max_model_len=16384)
    assert done.end_drain == (DrainEnd(E(1), "Drained"),)
    assert done.delete == (E(1),)
    assert done.start_drain == ()


def test_rolling_update_waits_for_every_other_replica_to_be_ready() -> None:
    _, new = desired_for(3, 16384)
    pods = [*fleet(3, max_model_len=32768)[:2], running(new[E(2)], ready=False)]
    result = plan(3, pods, max_model_len=16384)
    assert result.outdated == (E(0), E(1))
    assert result.start_drain == ()
    assert result.delete == ()
    pods[2] = running(new[E(2)])
    assert plan(3, pods, max_model_len=16384).start_drain == (E(0),)


def test_rolling_update_waits_for_a_missing_replica() -> None:
    result = plan(3, fleet(3, max_model_len=32768)[:2], max_model_len=16384)
    assert names(result.create) == [E(2)]
    assert result.start_drain == ()


def test_unready_outdated_replicas_are_replaced_at_once() -> None:
    pods = fleet(3, max_model_len=32768, overrides={E(0): {"ready": False}, E(2): {"ready": False}})
    result = plan(3, pods, max_model_len=16384)
    assert result.delete == (E(2), E(0))
    assert result.reasons == {E(0): "Update", E(2): "Update"}
    assert result.start_drain == ()  # E(1) waits: two replicas are being replaced


def test_unknown_pod_of_the_pool_is_removed() -> None:
    pods = fleet(1)
    stray = copy.deepcopy(pods[0])
    stray["metadata"]["name"] = "sim-grpo-engine-x"
    del stray["metadata"]["labels"]["rolloutpool.io/index"]
    result = plan(1, [*pods, stray])
    assert result.start_drain == ("sim-grpo-engine-x",)
    assert result.reasons == {"sim-grpo-engine-x": "Unknown"}


def test_same_inputs_give_the_same_plan() -> None:
    pods = fleet(4, max_model_len=32768, overrides={E(3): {"ready": False, "phase": "Failed"}})
    args: dict[str, Any] = {"live": {E(0): 1}, "draining": {E(2): NOW - 50}, "max_model_len": 16384}
    assert plan(2, pods, **args) == plan(2, copy.deepcopy(pods), **args)


# ---------------------------------------------------------------- simulated world


@dataclass
class World:
    """A tiny kubelet + API server: applies a plan, ages pods, drops terminated ones."""

    pods: dict[str, dict[str, Any]]
    live: dict[str, int]
    draining: dict[str, float] = field(default_factory=dict)
    actions: list[tuple[str, str]] = field(default_factory=list)

    def apply(self, result: EnginePlan, now: float) -> None:
        for name in result.start_drain:
            assert name not in self.draining, f"drain of {name} started twice"
            self.draining[name] = now
            self.actions.append(("drain", name))
        for end in result.end_drain:
            started = self.draining.pop(end.name)
            if end.reason == "Drained":
                assert self.live.get(end.name, 0) == 0, f"{end.name} ended its drain with live sessions"
            elif end.reason == "DrainTimeout":
                assert now - started >= TIMEOUT, f"{end.name} timed out early"
        for name in result.delete:
            assert "deletionTimestamp" not in self.pods[name]["metadata"], f"{name} deleted twice"
            self.pods[name] = terminating(self.pods[name])
            self.draining.pop(name, None)
            self.actions.append(("delete", name))
        for manifest in result.create:
            name = manifest["metadata"]["name"]
            assert name not in self.pods, f"{name} created while it exists"
            self.pods[name] = running(manifest, ready=False, phase="Pending")
            self.actions.append(("create", name))

    def tick(self, *, stuck: bool) -> None:
        """Terminating pods go, new pods become ready, live sessions finish one by one (unless stuck)."""
        for name in [n for n, p in self.pods.items() if p["metadata"].get("deletionTimestamp")]:
            del self.pods[name]
            self.live.pop(name, None)
        for name, pod in self.pods.items():
            self.pods[name] = running(pod)
        for name in self.draining:
            self.live[name] = max(0, self.live.get(name, 0) - (0 if stuck else 1))


pod_state = st.sampled_from(["ready", "unready", "failed", "missing", "old-ready", "old-unready"])


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(0, 5),
    target=st.integers(0, 5),
    states=st.lists(pod_state, min_size=5, max_size=5),
    sessions=st.lists(st.integers(0, 6), min_size=5, max_size=5),
    stuck=st.booleans(),
)
def test_any_world_converges_one_update_drain_at_a_time(
    start: int, target: int, states: list[str], sessions: list[int], stuck: bool
) -> None:
    """Sessions that never end (``stuck``) make every drain run into its timeout."""
    spec, desired = desired_for(target, 16384)
    _, everything_new = desired_for(5, 16384)
    _, everything_old = desired_for(5, 32768)
    pods: dict[str, dict[str, Any]] = {}
    for i in range(start):
        state = states[i]
        if state == "missing":
            continue
        source = everything_old if state.startswith("old") else everything_new
        pods[E(i)] = running(
            source[E(i)], ready=state in ("ready", "old-ready"), phase="Failed" if state == "failed" else "Running"
        )
    world = World(pods=pods, live={E(i): sessions[i] for i in range(5)})
    now = NOW
    for _ in range(200):
        ready = {n for n, p in world.pods.items() if is_ready(p)}
        result = plan_engines(
            spec=spec,
            desired=desired,
            observed=list(world.pods.values()),
            live_sessions=world.live,
            draining=dict(world.draining),
            now=now,
            drain_timeout_seconds=TIMEOUT,
        )
        update_drains = [n for n in world.draining if n in desired] + [
            n for n in result.start_drain if result.reasons[n] == "Update"
        ]
        assert len(set(update_drains)) <= 1, update_drains
        for name in result.start_drain:
            if result.reasons[name] == "Update":
                others = [n for n in desired if n != name]
                assert all(n in ready for n in others), "an update drain started while a replica was not ready"
        assert set(result.quarantine) <= set(world.pods)
        world.apply(result, now)
        if result.idle and set(ready) == set(world.pods):
            break
        world.tick(stuck=stuck)
        now += 10
    else:
        pytest.fail(f"no convergence: {world.actions}")
    assert sorted(world.pods) == sorted(desired)
    for name, pod in world.pods.items():
        assert pod["metadata"]["annotations"] == desired[name]["metadata"]["annotations"]
        assert is_ready(pod)
    # an idle world stays idle: nothing is created, drained or deleted twice
    again = plan_engines(
        spec=spec,
        desired=desired,
        observed=list(world.pods.values()),
        live_sessions=world.live,
        draining=dict(world.draining),
        now=now + 1000,
        drain_timeout_seconds=TIMEOUT,
    )
    assert again.idle
