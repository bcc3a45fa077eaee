"""The whole product on one machine, as a user runs it, and the faults it must survive.

One ``LocalStack`` for the module (real control plane, process kubelet on a loopback /24 of
its own, Prometheus, the chart installed with ``helm``; always stopped, and no process may be
left afterwards), one simulated pool (``rolloutpool demo``'s) applied with ``kubectl``. The
tests run in file order; each starts by waiting until the pool is quiet (ready, no sessions,
nothing quarantined) and leaves it that way, except the last, which uninstalls everything:

- the operator pod runs under its own ServiceAccount; ``kubectl wait`` sees the pool Ready;
- rollouts through the router outgrow the replicas' working sets: turns held and idle prefixes let go (the
  status and ``kubectl get rp -o wide``), the law's targets published; any quarantine (the law's or a router's
  fast loop) attributed; all of it clears when the sessions end;
- Prometheus stopped: ``MetricsAvailable=False`` (``PrometheusUnreachable``), no target published (``NoMetrics``),
  the router back on its own target; recovery;
- an engine SIGKILLed mid-run: restarted, the router stops placing there, its rollouts go on elsewhere;
- the router crashed (snapshot restored) and its pod deleted (table rebuilt): never double counted;
- a client giving up in the admission queue leaves no session behind;
- the operator's pod deleted: the new one adopts every child, creates nothing;
- ``helm uninstall`` leaves only the CRD and the user's pool; deleting the pool collects its children,
  deleting the CRD removes the pools left.

Recorded for the closing note: ``docs/img/fullstack-get-rp-w.txt`` (``kubectl get rp -o wide -w``
through the load and after it) and ``docs/img/fullstack-describe-rp.txt``.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from fullstack_kit import (
    LoadRun,
    RpWatch,
    acquire,
    chat_turn,
    condition,
    diagnosis,
    engine_pods,
    finished_sessions,
    http_json,
    isolated_stack,
    jwt_subject,
    live_by_replica,
    pod_pids,
    poll_samples,
    processes_under,
    quarantined_by,
    replica_metric,
    replica_of,
    restarts,
    router_metrics,
    router_pod,
    sigkill_pod,
)
from rolloutpool.api.pods import is_ready
from rolloutpool.dev.demo import POOL, demo_pool
from rolloutpool.dev.stack import TRANSIENT_ERRORS, LocalStack
from rolloutpool.dev.wait import wait_until

DOCS = Path(__file__).resolve().parent.parent / "docs" / "img"
TIME_SCALE = 10.0
IN_FLIGHT = 36
ROUTER = "rolloutpool_router_"
SA = "system:serviceaccount:rolloutpool-system:rolloutpool-operator"
TARGET = 0.6
"""The pool's ``workingSetTarget``: 0.6 x 32,768 KV tokens per replica, which the load's 12 tool-chat rollouts per
replica outgrow, so the routers hold turns and let prefixes go (the law may cut it, and raises it back no further)."""
KV_CAPACITY = 32768


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    directory = tmp_path_factory.mktemp("fullstack")
    with isolated_stack(directory) as running:
        yield running
    assert processes_under(str(directory)) == [], "processes of the stack left running"


@pytest.fixture(scope="module")
def manifest(stack: LocalStack) -> dict[str, Any]:
    """The demo's pool, applied with ``kubectl apply``; ``kubectl wait`` for ``Ready`` must succeed."""
    pool = demo_pool(
        prometheus_url=stack.prometheus_url, time_scale=TIME_SCALE, kv_capacity_tokens=KV_CAPACITY, max_model_len=8192
    )
    assert pool["spec"]["engine"]["kvCapacityTokens"] == KV_CAPACITY
    pool["spec"]["concurrency"]["workingSetTarget"] = TARGET
    assert stack.apply(yaml.safe_dump(pool)) == f"rolloutpool.rolloutpool.io/{POOL} created"
    waited = stack.cluster.kubectl("wait", "--for=condition=Ready", f"rp/{POOL}", "--timeout=110s", check=False)
    assert "condition met" in waited.stdout, f"{waited.stderr}\n{diagnosis(stack)}"
    return pool


def _kubectl(stack: LocalStack, *args: str) -> str:
    return stack.cluster.kubectl(*args).stdout


def _router(stack: LocalStack) -> str:
    url: str = wait_until(
        lambda: stack.router_url(POOL), what="a ready router pod", timeout=120, interval=0.5, ignore=TRANSIENT_ERRORS
    )
    return url


def _quiet(stack: LocalStack, timeout: float = 150) -> dict[str, Any]:
    """Wait until the pool is ready with every engine ready, no live session and nothing quarantined."""

    def check() -> dict[str, Any] | None:
        pool = stack.pool(POOL)
        status = pool.get("status") or {}
        pods = engine_pods(stack, POOL)
        url = stack.router_url(POOL)
        ok = (
            condition(pool, "Ready").get("status") == "True"
            and condition(pool, "ReplicasQuarantined").get("status") == "False"
            and status.get("liveSessions") == 0
            and len(pods) == 3
            and all(is_ready(p) for p in pods.values())
            and url is not None
            and sum(live_by_replica(router_metrics(url)).values()) == 0
        )
        return pool if ok else None

    pool: dict[str, Any] = wait_until(
        check, what="the pool quiet", timeout=timeout, interval=1.0, ignore=TRANSIENT_ERRORS
    )
    return pool


def _router_budgets(url: str) -> dict[str, float]:
    """``rolloutpool_router_working_set_budget_tokens`` per replica: the target in force x the KV capacity."""
    return {
        dict(labels)["replica"]: v
        for (name, labels), v in router_metrics(url).items()
        if name == f"{ROUTER}working_set_budget_tokens"
    }


def _decisions(url: str, decision: str) -> float:
    """The router's cumulative turn decisions of one kind over every replica."""
    name = f"{ROUTER}turn_decisions_total"
    return sum(v for (n, labels), v in router_metrics(url).items() if n == name and ("decision", decision) in labels)


def _full(pool: dict[str, Any]) -> bool:
    """Whether the status shows a working set full: turns held or prefixes let go on some replica."""
    entries = (pool.get("status") or {}).get("replicaStatus") or []
    return any(r.get("heldTurns", 0) > 0 or r.get("letGoSessions", 0) > 0 for r in entries)


def test_helm_installed_operator_runs_under_its_own_account_and_the_pool_becomes_ready(
    stack: LocalStack, manifest: dict[str, Any]
) -> None:
    (operator,) = stack.get_json("pods", "-n", stack.namespace, "-l", "app.kubernetes.io/component=operator")["items"]
    assert operator["spec"]["serviceAccountName"] == "rolloutpool-operator"
    assert is_ready(operator)
    home = stack.directory / "cluster" / "kubelet" / "pods"
    (directory,) = home.glob(f"{stack.namespace}_{operator['metadata']['name']}_*")
    log = (directory / "logs" / "operator.log").read_text()
    assert f"Started operator kubeconfig={directory / 'kubeconfig'}" in log, log[:3000]
    assert "Activity 'login_via_client' succeeded" in log, log[:3000]
    assert jwt_subject(directory / "kubeconfig") == SA  # the pod's token is its ServiceAccount's
    for verb, resource, allowed in [
        ("get", "secrets", "no"),
        ("list", "secrets", "no"),
        ("create", "pods", "yes"),
        ("patch", "rolloutpools.rolloutpool.io/status", "yes"),
        ("delete", "nodes", "no"),
    ]:
        answer = stack.cluster.kubectl("auth", "can-i", verb, resource, f"--as={SA}", "-A", check=False)
        assert answer.stdout.strip() == allowed, (verb, resource, answer.stdout, answer.stderr)

    pods = engine_pods(stack, POOL)
    assert sorted(pods) == [f"{POOL}-engine-{i}" for i in range(3)]
    routers = router_pod(stack, POOL)
    assert len(routers) == 1
    for pod in [*pods.values(), *routers]:
        assert pod["status"]["phase"] == "Running", pod["metadata"]["name"]
        assert is_ready(pod), pod["metadata"]["name"]
        assert pod_pids(stack, pod), f"no process runs {pod['metadata']['name']}"
    pool = stack.pool(POOL)
    assert condition(pool, "Ready")["reason"] == "Ready"
    assert pool["status"]["readyReplicas"] == 3
    assert http_json("GET", f"{_router(stack)}/v1/models")["data"], "the router serves no model"


def _bearer(method: str, url: str, token: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=b"{}", method=method, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - our own http URL
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read() or b"null")


def test_a_client_cannot_pause_an_engine_through_the_router_and_the_provisioned_admin_token_can(
    stack: LocalStack, manifest: dict[str, Any]
) -> None:
    _quiet(stack)
    url = _router(stack)
    engines = [f"http://{p['status']['podIP']}:8000" for p in engine_pods(stack, POOL).values()]

    def paused() -> list[bool]:
        return [bool(http_json("GET", f"{e}/is_paused")["is_paused"]) for e in engines]

    for path in ("/pause?mode=keep", "/reset_prefix_cache", "/update_weights"):
        status, body = _bearer("POST", f"{url}{path}", "not-a-token")
        assert status == 403, (path, body)
        assert "/admin/rl/" in body["error"]["message"]
    assert paused() == [False] * len(engines)
    # the operator made the router's admin token (create-only RBAC: it cannot read it back) and the router has it
    secret = stack.get_json("secret", f"{POOL}-router-admin")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert stack.cluster.kubectl("auth", "can-i", "create", "secrets", f"--as={SA}", "-A").stdout.strip() == "yes"
    assert _bearer("POST", f"{url}/admin/rl/pause?mode=keep", "wrong")[0] == 401
    status, body = _bearer("POST", f"{url}/admin/rl/pause?mode=keep", token)
    assert (status, body["ok"]) == (200, len(engines)), body
    assert paused() == [True] * len(engines)
    status, body = _bearer("POST", f"{url}/admin/rl/resume", token)
    assert status == 200, body
    assert paused() == [False] * len(engines)


def _check_quarantine(pool: dict[str, Any]) -> None:
    """A status with quarantined replicas says who holds each and why, in its entries and its condition."""
    held = quarantined_by(pool)
    if not held:
        return
    entries = {r["name"]: r for r in pool["status"]["replicaStatus"]}
    for replica, whos in held.items():
        entry = entries[replica]
        assert "operator" not in whos or entry.get("reason"), entry
        assert "router" not in whos or entry.get("routerReason"), entry
    message = condition(pool, "ReplicasQuarantined")
    assert message["status"] == "True", message
    assert message["reason"] in {"KVPressure", "Draining"}, message
    for replica in held:
        assert replica in message["message"], message
    named = re.search(r"router[):]", message["message"]) is not None  # "(evicting; router)", "(... router: evicting)"
    assert named == any("router" in whos for whos in held.values()), message
    assert pool["status"]["quarantinedReplicas"] == len(held), pool["status"]


def test_load_fills_the_working_sets_and_everything_clears_when_sessions_end(
    stack: LocalStack, manifest: dict[str, Any], tmp_path: Path
) -> None:
    _quiet(stack)
    url = _router(stack)
    sources: dict[str, set[str]] = {}  # who quarantined whom, over every status seen under load
    targets: list[float | None] = []  # the law's targets in every status seen with metrics available

    def seen(pool: dict[str, Any]) -> dict[str, Any]:
        _check_quarantine(pool)
        for replica, by in quarantined_by(pool).items():
            sources.setdefault(replica, set()).update(by)
        if condition(pool, "MetricsAvailable").get("status") == "True":
            targets.extend(r.get("target") for r in pool["status"]["replicaStatus"])
        return pool

    def full_now() -> dict[str, Any] | None:  # the pool object that says so: no race with a later read
        pool = seen(stack.pool(POOL))
        return pool if _full(pool) else None

    let_go_before = _decisions(url, "let_go")
    with RpWatch(stack, tmp_path / "get-rp-w.txt", wide=True) as watch:
        load = LoadRun(url, in_flight=IN_FLIGHT, seconds=240, time_scale=TIME_SCALE, prefix="pressure")
        try:
            started = time.monotonic()
            at_full: dict[str, Any] = wait_until(
                full_now, what="turns held or prefixes let go", timeout=200, interval=1.0, ignore=TRANSIENT_ERRORS
            )
            print(f"load started -> the status shows a full working set: {time.monotonic() - started:.1f}s")
            describe_full = _kubectl(stack, "describe", "rp", POOL)
            # keep the load a little longer: the law steps every 5 s on what the routers hold and the engines show
            until = time.monotonic() + 30
            while time.monotonic() < until:
                with contextlib.suppress(*TRANSIENT_ERRORS):
                    seen(stack.pool(POOL))
                time.sleep(1.0)
        finally:
            load.stop()
        let_go = _decisions(url, "let_go") - let_go_before
        held = _decisions(url, "held")
        stopped = time.monotonic()
        cleared = stack.cluster.kubectl(
            "wait", "--for=condition=ReplicasQuarantined=False", f"rp/{POOL}", "--timeout=110s"
        )
        assert "condition met" in cleared.stdout
        released = _quiet(stack)  # sessions released, or expired when the client gave up on them
        print(f"load stopped -> no live session: {time.monotonic() - stopped:.1f}s")
        describe_released = _kubectl(stack, "describe", "rp", POOL)
        time.sleep(3)  # the watch prints the last status change
        excerpt = watch.stop()

    by = sorted({who for whos in sources.values() for who in whos})
    print(
        f"prefixes let go: {let_go:.0f}, turns held (router lifetime): {held:.0f}; targets seen: "
        f"{sorted({t for t in targets if t is not None})}; quarantined by {by or 'nobody'}: {sorted(sources.items())}"
    )
    # the load outgrew the working sets: the routers let idle prefixes go to make room (a held turn is one of those)
    assert let_go > 0
    full = [r for r in at_full["status"]["replicaStatus"] if r.get("heldTurns", 0) or r.get("letGoSessions", 0)]
    assert full, at_full["status"]
    assert all(r["liveSessions"] > 0 for r in full), full  # held and let-go sessions are live ones
    assert at_full["status"]["heldTurns"] == sum(r.get("heldTurns", 0) for r in at_full["status"]["replicaStatus"])
    # with metrics available the law published a target for every replica, inside minTarget..maxTarget
    assert targets, "no status with MetricsAvailable=True under load"
    assert all(t is not None and 0.5 <= t <= TARGET for t in targets), targets  # maxTarget unset: the pool's
    assert "Held Turns" in describe_full, describe_full
    # everything clears when the sessions end: no held turn, no lease, no quarantine
    assert not quarantined_by(released), released["status"]
    assert not _full(released), released["status"]
    assert all(r.get("keptSessions", 0) == 0 for r in released["status"]["replicaStatus"]), released["status"]
    lines = excerpt.splitlines()
    header = ["NAME", "REPLICAS", "READY", "SESSIONS", "QUARANTINED", "HELD", "LEASES", "MOVES", "AGE"]
    assert lines[0].split() == header, excerpt
    rows = [dict(zip(header, line.split(), strict=True)) for line in lines[1:]]
    assert any(row["LEASES"] != "0" for row in rows), excerpt  # idle prefixes kept under load
    assert (rows[-1]["SESSIONS"], rows[-1]["HELD"], rows[-1]["LEASES"], rows[-1]["QUARANTINED"]) == (
        "0",
        "0",
        "0",
        "0",
    ), excerpt
    stamp = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, e2e/test_fullstack_e2e.py"
    (DOCS / "fullstack-get-rp-w.txt").write_text(
        f"# kubectl get rp -o wide -w  ({stamp}: {IN_FLIGHT} rollouts, then the load stops; "
        f"quarantined by {' and '.join(by) or 'nobody'})\n{excerpt}"
    )
    (DOCS / "fullstack-describe-rp.txt").write_text(
        f"# kubectl describe rp {POOL}  ({stamp})\n\n## while the working sets are full\n\n{describe_full}"
        f"\n## after the load stopped\n\n{describe_released}"
    )


def test_prometheus_down_withdraws_the_targets_and_metrics_come_back(
    stack: LocalStack, manifest: dict[str, Any]
) -> None:
    _quiet(stack)
    own = int(TARGET * KV_CAPACITY)  # the router's own working-set budget (its --target): safe without the law
    prometheus = stack.prometheus
    assert prometheus is not None

    def published() -> dict[str, Any] | None:
        pool = stack.pool(POOL)
        entries = pool["status"]["replicaStatus"]
        available = condition(pool, "MetricsAvailable").get("status") == "True"
        return pool if available and all(r.get("target") is not None for r in entries) else None

    pool = wait_until(
        published, what="MetricsAvailable=True and a target", timeout=60, interval=0.5, ignore=TRANSIENT_ERRORS
    )
    targets_before = [r["target"] for r in pool["status"]["replicaStatus"]]
    url = _router(stack)
    budgets_before = _router_budgets(url)
    prometheus.stop(keep_data=True)
    try:
        stopped = time.monotonic()

        def blind() -> dict[str, Any] | None:
            pool = stack.pool(POOL)
            metrics = condition(pool, "MetricsAvailable")
            entries = pool["status"]["replicaStatus"]
            withdrawn = all(r.get("target") is None for r in entries)
            return pool if metrics.get("reason") == "PrometheusUnreachable" and withdrawn else None

        pool = wait_until(
            blind, what="PrometheusUnreachable and no target", timeout=90, interval=0.5, ignore=TRANSIENT_ERRORS
        )
        print(f"Prometheus stopped -> no target (were {targets_before}): {time.monotonic() - stopped:.1f}s")
        assert condition(pool, "MetricsAvailable")["status"] == "False"
        assert condition(pool, "Ready")["status"] == "True"  # the pool keeps serving on the routers' own targets
        entries = pool["status"]["replicaStatus"]
        assert {r.get("targetReason") for r in entries} == {"NoMetrics"}, entries
        assert not any(r["quarantined"] for r in entries)
        budgets: dict[str, float] = wait_until(
            lambda: (b := _router_budgets(url)) and set(b.values()) == {own} and b,
            what="the router back on its own target",
            timeout=30,
            interval=0.5,
            ignore=TRANSIENT_ERRORS,
        )
        print(f"router working-set budgets: {budgets_before} with the law's targets, {budgets} blind")
        assert sorted(budgets) == sorted(engine_pods(stack, POOL))
    finally:
        if not prometheus.running:
            prometheus.start()
    restarted = time.monotonic()
    wait_until(
        published,
        what="MetricsAvailable=True and targets again",
        timeout=120,
        interval=1.0,
        ignore=TRANSIENT_ERRORS,
    )
    print(f"Prometheus started -> MetricsAvailable=True: {time.monotonic() - restarted:.1f}s")


def test_a_killed_engine_restarts_and_its_sessions_move_without_anything_stuck(
    stack: LocalStack, manifest: dict[str, Any]
) -> None:
    _quiet(stack)
    url = _router(stack)
    victim = f"{POOL}-engine-1"
    ended = finished_sessions(router_metrics(url))
    load = LoadRun(url, in_flight=24, seconds=60, time_scale=TIME_SCALE, prefix="crash")
    try:

        def mid_run() -> bool:  # rollouts have ended and others are under way on the victim
            samples = router_metrics(url)
            return finished_sessions(samples) >= ended + 10 and live_by_replica(samples).get(victim, 0) > 0

        wait_until(mid_run, what="rollouts under way on the victim", timeout=90, interval=0.5, ignore=TRANSIENT_ERRORS)
        on_victim = [i for i in range(200) if replica_of(url, f"crash-{i}") == victim]
        before = engine_pods(stack, POOL)[victim]
        restarted = restarts(before)
        killed = sigkill_pod(stack, before)
        killed_at = time.monotonic()

        def out_of_service() -> bool:
            samples = router_metrics(url)
            ready = replica_metric(samples, "rolloutpool_router_replica_ready", victim)
            return ready == 0 and replica_metric(samples, "rolloutpool_router_live_sessions", victim) == 0

        wait_until(
            out_of_service,
            what="the router takes the dead replica out",
            timeout=30,
            interval=0.3,
            ignore=TRANSIENT_ERRORS,
        )
        print(f"engine killed -> router stopped placing there: {time.monotonic() - killed_at:.1f}s")
        placed = replica_metric(router_metrics(url), "rolloutpool_router_placements_total", victim)

        def back() -> dict[str, Any] | None:
            pod = engine_pods(stack, POOL).get(victim)
            if pod is None or not is_ready(pod):
                return None
            again = pod["metadata"]["uid"] != before["metadata"]["uid"]
            return pod if again or restarts(pod) > restarted else None

        samples = poll_samples(lambda: router_metrics(url), until=lambda: back() is not None, timeout=120, interval=0.5)
        print(f"engine killed -> pod Ready again: {time.monotonic() - killed_at:.1f}s")
        for sample in samples:
            if replica_metric(sample, "rolloutpool_router_replica_ready", victim) == 0:
                assert replica_metric(sample, "rolloutpool_router_live_sessions", victim) == 0
                assert replica_metric(sample, "rolloutpool_router_placements_total", victim) == placed
        revived = back()
        assert revived is not None
        assert set(pod_pids(stack, revived)).isdisjoint(killed)
        wait_until(
            lambda: replica_metric(router_metrics(url), "rolloutpool_router_placements_total", victim) > placed,
            what="the router places on the revived replica",
            timeout=60,
            interval=0.5,
            ignore=TRANSIENT_ERRORS,
        )
        result = load.join(timeout=150)
    finally:
        load.stop()
    after_kill = [t for t in result.completed if t.finished is not None and t.finished > killed_at]
    moved = [t for t in after_kill if t.index in on_victim]
    print(
        f"load: {len(result.completed)} rollouts, {len(after_kill)} after the kill, of which {len(moved)} of the "
        f"{len(on_victim)} that were on the killed replica; {result.retries} retries, {result.errors} errors"
    )
    assert result.errors == 0
    assert len(after_kill) >= 5
    assert moved, "no rollout of the killed replica went on elsewhere"
    assert not [t for t in result.trajectories if t.index in on_victim and t.error], "a moved rollout failed"
    pool = _quiet(stack)  # every session released or expired: the counts are back to zero everywhere
    assert all(r["liveSessions"] == 0 for r in pool["status"]["replicaStatus"])
    assert pool["status"]["queuedSessions"] == 0


def _status_live(stack: LocalStack) -> int:
    return int((stack.pool(POOL).get("status") or {}).get("liveSessions") or 0)


def _settle_on(stack: LocalStack, url: str, expected: dict[str, int], what: str) -> list[int]:
    """Wait until the router and the pool's status both count ``expected``; every status count seen."""
    total = sum(expected.values())
    seen: list[int] = []

    def agreed() -> bool:
        seen.append(_status_live(stack))
        live = {k: v for k, v in live_by_replica(router_metrics(url)).items() if v}
        return live == expected and seen[-1] == total

    wait_until(agreed, what=what, timeout=60, interval=0.5, ignore=TRANSIENT_ERRORS)
    return seen


def test_router_restarts_never_double_count_live_sessions(stack: LocalStack, manifest: dict[str, Any]) -> None:
    _quiet(stack)
    url = _router(stack)
    ids = [f"held-{i}" for i in range(6)]
    placed = acquire(url, ids)
    assert all(created for _, created in placed.values())
    expected: dict[str, int] = {}
    for replica, _ in placed.values():
        expected[replica] = expected.get(replica, 0) + 1
    _settle_on(stack, url, expected, "6 live sessions counted once")

    # the router's container crashes: the kubelet restarts it and it restores its snapshot (emptyDir)
    (pod,) = router_pod(stack, POOL)
    chat_turn(url, ids)
    assert not any(created for _, created in acquire(url, ids).values())
    sigkill_pod(stack, pod)
    restarted = wait_until(
        lambda: next(
            (p for p in router_pod(stack, POOL) if is_ready(p) and p["status"]["containerStatuses"][0]["restartCount"]),
            None,
        ),
        what="the router container restarted and ready",
        timeout=90,
        interval=0.5,
        ignore=TRANSIENT_ERRORS,
    )
    assert restarted["metadata"]["uid"] == pod["metadata"]["uid"]
    url = _router(stack)
    seen = _settle_on(stack, url, expected, "the restored sessions counted once")
    assert max(seen) <= 6, seen
    assert acquire(url, ids) == {sid: (replica, False) for sid, (replica, _) in placed.items()}
    chat_turn(url, ids)

    # the router pod is deleted: the Deployment's new pod starts empty; sessions come back on their next turn
    stack.cluster.kubectl("delete", "pod", pod["metadata"]["name"], "--wait=false")
    seen = []

    def new_router() -> str | None:
        seen.append(_status_live(stack))
        fresh = [p for p in router_pod(stack, POOL) if p["metadata"]["uid"] != pod["metadata"]["uid"]]
        return stack.router_url(POOL) if fresh and all(is_ready(p) for p in fresh) else None

    url = wait_until(new_router, what="a new router pod", timeout=120, interval=0.5, ignore=TRANSIENT_ERRORS)
    again = acquire(url, ids)
    assert all(created for _, created in again.values())  # a fresh table: nothing left over to add to
    moved: dict[str, int] = {}
    for replica, _ in again.values():
        moved[replica] = moved.get(replica, 0) + 1
    seen += _settle_on(stack, url, moved, "the re-placed sessions counted once")
    assert max(seen) <= 6, seen
    assert len(router_pod(stack, POOL)) == 1
    for sid in ids:
        assert http_json("DELETE", f"{url}/v1/sessions/{sid}")["released"] is True
    _quiet(stack)


def test_a_client_that_gives_up_in_the_queue_leaves_no_session_behind(
    stack: LocalStack, manifest: dict[str, Any]
) -> None:
    _quiet(stack)
    url = _router(stack)
    # hold the targets still: with autoscaling on, the law raises a target while a session queues; off, the operator
    # publishes none and the router keeps its own (the room it leaves moves only with the sessions it measures)
    _autoscaling(stack, enabled=False)

    def no_operator_target() -> bool:
        pool = stack.pool(POOL)
        disabled = condition(pool, "MetricsAvailable").get("reason") == "AutoscalingDisabled"
        return disabled and all(r.get("target") is None for r in pool["status"]["replicaStatus"])

    wait_until(
        no_operator_target, what="no operator target in the status", timeout=60, interval=0.5, ignore=TRANSIENT_ERRORS
    )

    def free_slots() -> int:
        metrics = router_metrics(url)
        caps = {dict(k)["replica"]: v for (n, k), v in metrics.items() if n == f"{ROUTER}session_cap"}
        live = live_by_replica(metrics)
        # the working set's room for new sessions under maxSessionsPerReplica: sessions made without a turn
        # (POST /v1/sessions) stand outside the working set, so the ceiling fills last
        assert all(math.isfinite(c) for c in caps.values()), caps
        return sum(max(0, int(c) - int(live.get(r, 0))) for r, c in caps.items())

    held: list[str] = []
    try:
        while free := free_slots():  # every slot taken (a cap may move by a rounding step as sessions bind)
            batch = [f"full-{len(held) + i}" for i in range(free)]
            held += batch
            assert all(created for _, created in acquire(url, batch).values())
        _give_up_waiting(url, "gave-up", after=2.0)
        # the client is gone; the router should forget its place in the queue
        http_json("DELETE", f"{url}/v1/sessions/{held.pop()}")  # a slot frees
        gone = wait_until(
            lambda: router_metrics(url).get((f"{ROUTER}queue_depth", ())) == 0,
            what="the abandoned request out of the queue",
            timeout=10,
            interval=0.5,
            ignore=TRANSIENT_ERRORS,
        )
        assert gone
        with pytest.raises(urllib.error.HTTPError) as missing:
            http_json("GET", f"{url}/v1/sessions/gave-up")
        assert missing.value.code == 404, "the abandoned session was placed and holds a slot"
    finally:
        for sid in [*held, "gave-up"]:
            with contextlib.suppress(urllib.error.HTTPError):
                http_json("DELETE", f"{url}/v1/sessions/{sid}")
        _autoscaling(stack, enabled=True)


def _give_up_waiting(url: str, session_id: str, *, after: float) -> None:
    """Ask for a new session, then hang up after ``after`` seconds without an answer (socket closed)."""
    host, port = urllib.parse.urlsplit(url).netloc.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=after)
    try:
        body = json.dumps({"session_id": session_id})
        conn.request("POST", "/v1/sessions", body=body, headers={"Content-Type": "application/json"})
        with contextlib.suppress(TimeoutError):
            conn.getresponse().read()
            pytest.fail("the router placed a session over every cap")
    finally:
        conn.close()


def _autoscaling(stack: LocalStack, *, enabled: bool) -> None:
    patch = json.dumps({"spec": {"autoscaling": {"enabled": enabled}}})
    stack.cluster.kubectl("patch", "rolloutpool", POOL, "--type=merge", "-p", patch)


def _children(stack: LocalStack) -> dict[str, str]:
    kinds = "pods,deployments,replicasets,services,serviceaccounts,roles,rolebindings"
    items = stack.get_json(kinds, "-n", "default", "-l", f"rolloutpool.io/pool={POOL}")["items"]
    return {f"{i['kind']}/{i['metadata']['name']}": i["metadata"]["uid"] for i in items}


def test_operator_restart_makes_no_duplicate_children(stack: LocalStack, manifest: dict[str, Any]) -> None:
    _quiet(stack)
    before = _children(stack)
    kinds = sorted(k.split("/")[0] for k in before)
    assert kinds.count("Pod") == 4, before  # three engines, one router
    assert kinds.count("Deployment") == 1, before
    selector = "app.kubernetes.io/component=operator"
    (old,) = stack.get_json("pods", "-n", stack.namespace, "-l", selector)["items"]
    stack.cluster.kubectl("delete", "pod", "-n", stack.namespace, old["metadata"]["name"], "--wait=false")

    def new_operator() -> dict[str, Any] | None:
        pods = stack.get_json("pods", "-n", stack.namespace, "-l", selector)["items"]
        fresh = [p for p in pods if p["metadata"]["uid"] != old["metadata"]["uid"] and is_ready(p)]
        return fresh[0] if len(pods) == 1 and fresh else None

    new = wait_until(new_operator, what="a new operator pod", timeout=120, interval=0.5, ignore=TRANSIENT_ERRORS)
    home = stack.directory / "cluster" / "kubelet" / "pods"
    (directory,) = home.glob(f"{stack.namespace}_{new['metadata']['name']}_*")
    log = directory / "logs" / "operator.log"
    passes = wait_until(
        lambda: [
            line for line in log.read_text().splitlines() if f"Reconciled RolloutPool pool=default/{POOL}" in line
        ],
        what="the new operator reconciles the pool",
        timeout=90,
        interval=0.5,
        ignore=TRANSIENT_ERRORS,
    )
    assert all(" created=0 deleted=0 " in line for line in passes), passes
    assert "Created" not in log.read_text(), log.read_text()[-3000:]
    assert _children(stack) == before
    assert condition(_quiet(stack), "Ready")["status"] == "True"


def test_uninstall_leaves_only_the_crd_and_deleting_it_removes_the_pools(
    stack: LocalStack, manifest: dict[str, Any]
) -> None:
    _quiet(stack)
    (operator,) = stack.get_json("pods", "-n", stack.namespace, "-l", "app.kubernetes.io/component=operator")["items"]
    stack.helm("uninstall", stack.release, "--namespace", stack.namespace, "--wait", "--timeout", "90s")
    assert json.loads(stack.helm("list", "--all-namespaces", "-o", "json").stdout) == []
    release = f"app.kubernetes.io/instance={stack.release}"
    wait_until(
        lambda: not stack.get_json("pods", "-n", stack.namespace)["items"] and not pod_pids(stack, operator),
        what="the operator pod and its process gone",
        timeout=90,
        interval=0.5,
        ignore=TRANSIENT_ERRORS,
    )
    namespaced = "deployments,replicasets,services,configmaps,roles,rolebindings"
    assert stack.get_json(namespaced, "-n", stack.namespace, "-l", release)["items"] == []
    accounts = stack.get_json("serviceaccounts", "-n", stack.namespace)["items"]
    assert [a["metadata"]["name"] for a in accounts] == ["default"]
    for kind in ("clusterroles", "clusterrolebindings"):
        names = [i["metadata"]["name"] for i in stack.get_json(kind)["items"]]
        assert not [n for n in names if "rolloutpool" in n], names
    # what the user made stays: the CRD, the pool, and the pool's own children
    stack.cluster.kubectl("get", "crd", "rolloutpools.rolloutpool.io")
    assert stack.pool(POOL)["metadata"]["name"] == POOL
    children = _children(stack)
    assert children, "the pool's children went with the release"
    pods = [*engine_pods(stack, POOL).values(), *router_pod(stack, POOL)]

    # deleting a pool collects its children (owner references, the controller-manager's GC)
    stack.cluster.kubectl("delete", "rolloutpool", POOL, "--timeout=90s")
    wait_until(
        lambda: not _children(stack),
        what="the pool's children collected",
        timeout=180,
        interval=1.0,
        ignore=TRANSIENT_ERRORS,
    )
    # deleting the CRD removes the pools left (no operator runs now, so this one has no children;
    # Kubernetes' GC cannot resolve owners of a kind that is gone, so delete pools before the CRD)
    leftover = {**manifest, "metadata": {"name": "leftover"}}
    stack.apply(yaml.safe_dump(leftover))
    stack.cluster.kubectl("delete", "crd", "rolloutpools.rolloutpool.io", "--timeout=90s")
    deleted = stack.cluster.kubectl("get", "rolloutpools", "-A", check=False)
    assert deleted.returncode != 0, deleted.stdout  # the resource itself is gone, with its objects
    wait_until(
        lambda: not any(pod_pids(stack, p) for p in pods),
        what="their processes stopped",
        timeout=60,
        interval=0.5,
        ignore=TRANSIENT_ERRORS,
    )
