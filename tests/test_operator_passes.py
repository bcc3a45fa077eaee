"""Whole reconcile passes against the in-memory Kubernetes fake: conflicts, races and injected faults.

Each test runs :func:`rolloutpool.handlers.passes.reconcile_pool` (observe -> decide -> act) on
a :class:`~rolloutpool.kube.fake.FakeKube`, with the routers' stats and Prometheus stubbed, and
checks what the pass did to the objects, the status it wrote, the Events it posted and the delay
it asked for.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from rolloutpool.autoscale import ReplicaSignals
from rolloutpool.handlers.context import OperatorContext
from rolloutpool.handlers.passes import reconcile_pool
from rolloutpool.handlers.workers import PoolKey, PoolWorkers
from rolloutpool.kube.fake import FakeKube
from rolloutpool.kube.port import KubeError
from rolloutpool.metrics.prom import PrometheusUnreachable
from rolloutpool.metrics.routerstats import RouterStats
from rolloutpool.reconcile.labels import ANNOTATION_DRAIN_STARTED

NS, NAME = "team", "p"
KEY: PoolKey = (NS, NAME)
ROUTER_KINDS = ["Secret", "ServiceAccount", "Role", "RoleBinding", "Service", "Deployment"]
SPEC: dict[str, Any] = {
    "replicas": 2,
    "engine": {"kind": "simulated", "model": "m", "maxModelLen": 32768, "kvCapacityTokens": 400000},
    "concurrency": {"workingSetTarget": 0.9},
}


class Reader:
    """Prometheus as the slow loop sees it: fixed signals, or unreachable."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.reads = 0

    def read(
        self, *, namespace: str, replicas: Sequence[str], window_seconds: float
    ) -> Mapping[str, ReplicaSignals | None]:
        self.reads += 1
        if self.error is not None:
            raise PrometheusUnreachable(self.error)
        return {name: ReplicaSignals(kv_usage=0.2, kv_capacity_tokens=400000, sampled_at=1e12) for name in replicas}


class Harness:
    """One pool in a fake cluster and an operator context around it."""

    def __init__(self, spec: dict[str, Any] | None = None) -> None:
        self.kube = FakeKube()
        self.kube.put(
            {
                "apiVersion": "rolloutpool.io/v1alpha1",
                "kind": "RolloutPool",
                "metadata": {"name": NAME, "namespace": NS},
                "spec": copy.deepcopy(spec or SPEC),
            }
        )
        self.events: list[tuple[str, str, str]] = []
        self.stats = RouterStats({}, 0, 0)
        self.reader = Reader()

        async def no_pass(_key: PoolKey) -> float | None:
            return None

        self.context = OperatorContext(
            kube=self.kube,
            prometheus=lambda _url: self.reader,
            router_stats=lambda _urls: self.stats,
            workers=PoolWorkers(no_pass),
            image="ghcr.io/rolloutpool/rolloutpool:test",
            post_event=lambda _pool, type_, reason, message: self.events.append((type_, reason, message)),
        )

    async def run(self) -> float | None:
        return await reconcile_pool(self.context, KEY)

    def pods(self) -> list[str]:
        return [o["metadata"]["name"] for (k, _, _), o in sorted(self.kube.objects.items()) if k == "Pod"]

    def pod(self, name: str) -> dict[str, Any]:
        pod = self.kube.peek("Pod", NS, name)
        assert pod is not None, name
        return pod

    def ready(self, *names: str) -> None:
        for name in names:
            pod = self.pod(name)
            pod["status"] = {
                "phase": "Running",
                "podIP": "127.0.0.9",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
            self.kube.put(pod)

    def status(self) -> dict[str, Any]:
        pool = self.kube.peek("RolloutPool", NS, NAME)
        assert pool is not None
        status: dict[str, Any] = pool.get("status") or {}
        return status

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status()["conditions"] if c["type"] == type_)

    def scale(self, replicas: int) -> None:
        self.kube.patch("RolloutPool", NS, NAME, {"spec": {"replicas": replicas}})

    def forget_calls(self) -> None:
        self.kube.calls.clear()

    def writes(self) -> list[tuple[str, str, str]]:
        return [
            (c.verb, c.kind, c.name) for c in self.kube.calls if c.verb in {"create", "patch", "delete", "patch_status"}
        ]


async def _settled(h: Harness, names: Sequence[str] = ("p-engine-0", "p-engine-1")) -> None:
    await h.run()
    h.ready(*names)
    await h.run()


async def test_a_new_pool_gets_its_router_objects_and_engine_pods_then_a_quiet_pass_writes_nothing() -> None:
    h = Harness()
    delay = await h.run()
    assert h.kube.verbs("create") == ["p-router-admin"] + ["p-router"] * 5 + ["p-engine-0", "p-engine-1"]
    secret = h.kube.peek("Secret", NS, "p-router-admin")  # a fresh admin token for the routers, made once
    assert len(secret["stringData"]["token"]) >= 32
    assert [c.kind for c in h.kube.calls if c.verb == "create"][:6] == ROUTER_KINDS
    assert h.status()["replicas"] == 0  # the status describes what the pass observed
    assert h.status()["observedGeneration"] == 1
    assert h.condition("Ready")["status"] == "False"
    assert delay == 1.0  # busy: pods were created
    h.ready("p-engine-0", "p-engine-1")
    await h.run()
    assert h.status()["readyReplicas"] == 2
    h.forget_calls()
    delay = await h.run()
    assert h.writes() == []  # nothing changed: no apply (not due), no status write
    assert delay == 5.0


async def test_the_admin_token_secret_is_created_once_and_never_read_or_changed() -> None:
    h = Harness()
    mine = {"kind": "Secret", "metadata": {"name": "p-router-admin", "namespace": NS}, "stringData": {"token": "own"}}
    h.kube.put(mine)  # the user's own token, there first
    await _settled(h)
    assert h.kube.peek("Secret", NS, "p-router-admin")["stringData"] == {"token": "own"}
    secret_calls = [c.verb for c in h.kube.calls if c.kind == "Secret"]
    assert secret_calls == ["create"] * len(secret_calls)  # the operator's RBAC: create only
    h.kube.delete("Secret", NS, "p-router-admin")
    h.context.remember(KEY).router_generation = None
    await h.run()
    fresh = h.kube.peek("Secret", NS, "p-router-admin")["stringData"]
    assert fresh["token"] != "own"  # noqa: S105 -- a fresh one


async def test_a_create_that_meets_an_existing_pod_409_takes_it_as_is() -> None:
    h = Harness()
    squatter = {"kind": "Pod", "metadata": {"name": "p-engine-1", "namespace": NS, "labels": {}}, "spec": {}}
    h.kube.before("create", "Pod", "p-engine-1", lambda: h.kube.put(squatter) and None)
    await h.run()
    assert h.pod("p-engine-1")["metadata"].get("labels") == {}  # untouched: pods are never patched
    assert "p-engine-1" not in [n for v, k, n in h.writes() if v == "delete"]


async def test_a_router_object_deleted_under_us_comes_back() -> None:
    h = Harness()
    await _settled(h)
    h.kube.delete("Deployment", NS, "p-router")
    h.forget_calls()
    await h.run()  # the Deployment is compared on every pass: drift, re-applied
    assert ("create", "Deployment", "p-router") in h.writes()
    h.kube.delete("Service", NS, "p-router")
    h.context.remember(KEY).router_generation = None  # what on_router_object_event does
    await h.run()
    assert h.kube.peek("Service", NS, "p-router") is not None


async def test_an_object_gone_between_the_409_and_the_read_is_left_for_the_next_pass() -> None:
    h = Harness()
    h.kube.fail("create", "Service", error=409)
    await h.run()
    assert h.kube.peek("Service", NS, "p-router") is None  # 409 then 404 on the read: unchanged
    assert h.kube.peek("Deployment", NS, "p-router") is not None  # the pass went on
    h.context.remember(KEY).router_generation = None
    await h.run()
    assert h.kube.peek("Service", NS, "p-router") is not None


async def test_a_pod_recreated_under_us_is_not_deleted_uid_mismatch() -> None:
    h = Harness()
    await _settled(h)
    h.kube.put({**h.pod("p-engine-1"), "status": {"phase": "Failed"}})
    original = h.pod("p-engine-1")["metadata"]["uid"]

    def recreate() -> None:  # someone replaced the pod between our list and our delete
        fresh = h.pod("p-engine-1")
        h.kube.objects.pop(("Pod", NS, "p-engine-1"))
        fresh["metadata"] = {k: v for k, v in fresh["metadata"].items() if k != "uid"}
        h.kube.put(fresh)

    h.kube.before("delete", "Pod", "p-engine-1", recreate)
    await h.run()
    assert h.pod("p-engine-1")["metadata"]["uid"] != original  # the new incarnation survives the 409
    assert ("delete", "Pod", "p-engine-1") in h.writes()


async def test_a_failed_pod_stuck_terminating_is_waited_for_then_recreated() -> None:
    h = Harness()
    await _settled(h)
    h.kube.stick("Pod", NS, "p-engine-0")
    h.kube.put({**h.pod("p-engine-0"), "status": {"phase": "Failed"}})
    await h.run()
    assert h.pod("p-engine-0")["metadata"].get("deletionTimestamp")
    for _ in range(3):  # still terminating: not recreated, left out of the table, looked at again soon
        h.forget_calls()
        delay = await h.run()
        assert ("create", "Pod", "p-engine-0") not in h.writes()
        assert delay == 1.0
    assert [r["name"] for r in h.status()["replicaStatus"]] == ["p-engine-1"]
    h.kube.release("Pod", NS, "p-engine-0")
    await h.run()
    assert h.pod("p-engine-0")["status"]["phase"] == "Pending"  # the new incarnation


async def test_scale_down_drains_the_ready_pod_then_deletes_it_when_its_sessions_end() -> None:
    h = Harness()
    await _settled(h)
    h.stats = RouterStats({"p-engine-1": 3}, 0, 1)
    h.kube.put(
        {
            "kind": "Pod",
            "metadata": {"name": "p-router-x", "namespace": NS, "labels": _router_labels()},
            "status": {"podIP": "127.0.0.50"},
        }
    )
    h.scale(1)
    await h.run()
    assert ANNOTATION_DRAIN_STARTED in h.pod("p-engine-1")["metadata"]["annotations"]
    assert ("Normal", "DrainStarted", "Started draining p-engine-1: 3 live sessions") in h.events
    await h.run()
    assert "p-engine-1" in h.pods()  # 3 live sessions: still draining
    h.stats = RouterStats({"p-engine-1": 0}, 0, 1)
    await h.run()
    assert h.pods() == ["p-engine-0", "p-router-x"]
    assert ("Normal", "DrainEnded", "Drained p-engine-1; deleting it") in h.events


def _router_labels() -> dict[str, str]:
    from rolloutpool.reconcile.labels import router_match_labels  # noqa: PLC0415

    return router_match_labels(NAME)


async def test_the_pool_deleted_before_the_status_write_ends_the_worker_without_events() -> None:
    h = Harness()
    h.kube.before("patch_status", "RolloutPool", NAME, lambda: h.kube.delete("RolloutPool", NS, NAME))
    assert await h.run() is None
    assert h.events == []


async def test_a_status_write_that_loses_a_race_409_fails_the_pass_and_the_next_one_writes_it() -> None:
    h = Harness()
    h.kube.fail("patch_status", error=409)
    with pytest.raises(KubeError) as raised:
        await h.run()
    assert raised.value.status == 409
    assert h.status() == {}
    assert h.events == []
    await h.run()
    assert h.status()["observedGeneration"] == 1


async def test_a_spec_change_racing_the_status_write_is_caught_up_by_the_next_pass() -> None:
    h = Harness()
    h.kube.before("patch_status", "RolloutPool", NAME, lambda: h.scale(3))
    await h.run()
    assert h.status()["observedGeneration"] == 1  # written for what the pass read
    await h.run()
    assert h.status()["observedGeneration"] == 2
    assert "p-engine-2" in h.pods()


@pytest.mark.parametrize(
    ("verb", "kind", "error"),
    [
        ("get", "RolloutPool", TimeoutError("injected")),
        ("list", "Pod", TimeoutError("injected")),
        ("create", "Pod", TimeoutError("injected")),
        ("patch_status", "RolloutPool", TimeoutError("injected")),
        ("list", "Pod", KubeError(500, "Injected")),
    ],
    ids=["get-pool-timeout", "list-pods-timeout", "create-pod-timeout", "status-timeout", "list-500"],
)
async def test_a_call_that_fails_fails_the_pass_and_the_next_pass_completes(
    verb: str, kind: str, error: BaseException
) -> None:
    h = Harness()
    h.kube.fail(verb, kind, error=error)
    with pytest.raises(type(error)):
        await h.run()
    await h.run()
    await h.run()
    assert sorted(h.pods()) == ["p-engine-0", "p-engine-1"]
    assert h.status()["replicas"] == 2


async def test_a_404_on_the_pool_read_stops_the_worker() -> None:
    h = Harness()
    h.kube.fail("get", "RolloutPool", error=404)
    assert await h.run() is None
    assert h.writes() == []


async def test_an_unservable_spec_changes_nothing_but_the_status_and_warns_once() -> None:
    h = Harness({**SPEC, "engine": {"kind": "simulated", "model": "m", "maxModelLen": 32768}})
    h.kube.patch("RolloutPool", NS, NAME, {"spec": {"engine": {"kvCapacityTokens": 1000}}})
    await h.run()
    assert [v for v, _, _ in h.writes()] == ["patch", "patch_status"]  # our own patch, then the status
    ready = h.condition("Ready")
    assert ready["status"] == "False"
    warnings = [e for e in h.events if e[0] == "Warning"]
    assert len(warnings) == 1
    await h.run()
    assert [e for e in h.events if e[0] == "Warning"] == warnings


async def test_the_slow_loop_reads_prometheus_once_per_interval_and_reports_it_unreachable() -> None:
    spec = {**SPEC, "autoscaling": {"enabled": True, "prometheusUrl": "http://prom:9090", "intervalSeconds": 3600}}
    h = Harness(spec)
    await h.run()
    h.reader.error = "connection refused"
    await _settled(h)
    assert h.reader.reads == 1  # the first pass with pods read; the interval has not elapsed since
    assert h.condition("MetricsAvailable")["reason"] == "PrometheusUnreachable"
    h.context.remember(KEY).control_at = -1e9  # the interval elapsed
    h.reader.error = None
    await h.run()
    assert h.reader.reads == 2
    assert h.condition("MetricsAvailable")["status"] == "True"


async def test_a_worker_retries_a_failed_pass_after_its_backoff() -> None:
    h = Harness()
    h.kube.fail("list", "Pod", error=TimeoutError("injected"))
    workers = PoolWorkers(lambda key: reconcile_pool(h.context, key), error_backoff=0.05)
    workers.poke(KEY)
    for _ in range(100):
        if len(h.pods()) == 2:
            break
        await asyncio.sleep(0.02)
    await workers.close()
    assert sorted(h.pods()) == ["p-engine-0", "p-engine-1"]


async def test_a_pod_deleted_under_us_before_its_drain_mark_or_its_delete_is_recreated_next_pass() -> None:
    h = Harness()
    await _settled(h)
    h.stats = RouterStats({"p-engine-1": 2}, 0, 1)
    h.kube.put(
        {
            "kind": "Pod",
            "metadata": {"name": "p-router-x", "namespace": NS, "labels": _router_labels()},
            "status": {"podIP": "127.0.0.50"},
        }
    )
    h.scale(1)
    h.kube.before("patch", "Pod", "p-engine-1", lambda: h.kube.delete("Pod", NS, "p-engine-1"))
    await h.run()  # the drain mark meets a 404: nothing to drain any more
    assert "p-engine-1" not in h.pods()
    h.scale(2)
    h.kube.put({**h.pod("p-engine-0"), "status": {"phase": "Failed"}})
    h.kube.before("delete", "Pod", "p-engine-0", lambda: h.kube.delete("Pod", NS, "p-engine-0"))
    await h.run()  # the delete of the failed pod meets a 404; the missing index is created
    await h.run()
    assert sorted(h.pods()) == ["p-engine-0", "p-engine-1", "p-router-x"]
    assert h.pod("p-engine-0")["status"]["phase"] == "Pending"
