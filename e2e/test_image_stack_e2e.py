"""The whole product on one machine running the built image, as a cluster would pull it.

``LocalStack(image=...)``: the real control plane, ``helm install`` of the chart with
``--set image.repository=... --set image.tag=...`` naming the build (the README's cluster
install), and the process kubelet running every pod of that image from the image's root
filesystem (a chroot into an overlay of it as the pod's user, volumes at their mount paths,
the in-cluster service-account configuration). The operator pod, the router and the simulated
engines it creates all run the image: uid 65532, read-only root, nothing of this checkout.
Skipped, saying why, only where buildah cannot run; under CI that is a failure.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fullstack_kit import chat_turn, diagnosis, engine_pods, http_json, pod_dirs, processes_under, replica_of, restarts
from image_kit import built_image, container_pids, credentials, read_only_root
from rolloutpool.api.pods import is_ready
from rolloutpool.dev.demo import POOL, demo_pool
from rolloutpool.dev.stack import TRANSIENT_ERRORS, LocalStack
from rolloutpool.dev.wait import wait_until

NON_ROOT = 65532


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    image = built_image()
    directory = tmp_path_factory.mktemp("imagestack")
    with LocalStack(directory, log=lambda _msg: None, image=image) as running:
        yield running
    assert container_pids(directory) == [], "container processes of the stack left running"
    assert processes_under(str(directory)) == [], "processes of the stack left running"


def _image_process(stack: LocalStack, pod: dict[str, Any]) -> int:
    """The one process of a pod's container, which must run from the image (not this checkout)."""
    pids = container_pids(pod_dirs(stack, pod))
    assert len(pids) == 1, f"{pod['metadata']['name']}: {pids}\n{diagnosis(stack)}"
    (pid,) = pids
    assert credentials(pid)[:2] == (NON_ROOT, NON_ROOT), pod["metadata"]["name"]
    assert read_only_root(pid), pod["metadata"]["name"]
    exe = os.readlink(f"/proc/{pid}/exe")
    assert Path(exe).is_relative_to(pod_dirs(stack, pod) / "containers"), f"{exe}: not the image's python"
    return pid


def _router(stack: LocalStack) -> str:
    url: str = wait_until(
        lambda: stack.router_url(POOL), what="a ready router pod", timeout=120, interval=0.5, ignore=TRANSIENT_ERRORS
    )
    return url


def test_the_chart_installed_with_the_built_image_runs_operator_router_and_engines_from_it(stack: LocalStack) -> None:
    assert stack.image is not None
    reference = stack.image.reference
    (operator,) = stack.get_json("pods", "-n", stack.namespace, "-l", "app.kubernetes.io/component=operator")["items"]
    assert operator["spec"]["containers"][0]["image"] == reference
    _image_process(stack, operator)
    log = pod_dirs(stack, operator) / "logs" / "operator.log"
    # the service-account token at its in-cluster path, as on a cluster (no kubeconfig from this machine)
    started = f"Started operator kubeconfig=<in-cluster> image={reference}"
    wait_until(lambda: started in log.read_text(), what="the operator's start in its log", timeout=90, interval=0.5)

    pool = demo_pool(prometheus_url=stack.prometheus_url, replicas=2)
    assert stack.apply(yaml.safe_dump(pool)) == f"rolloutpool.rolloutpool.io/{POOL} created"
    waited = stack.cluster.kubectl("wait", "--for=condition=Ready", f"rp/{POOL}", "--timeout=150s", check=False)
    assert "condition met" in waited.stdout, f"{waited.stderr}\n{diagnosis(stack)}"
    engines = engine_pods(stack, POOL)
    routers = stack.get_json("pods", "-l", f"rolloutpool.io/pool={POOL},rolloutpool.io/component=router")["items"]
    assert len(engines) == 2
    assert len(routers) == 1
    for pod in [*engines.values(), *routers]:
        assert pod["spec"]["containers"][0]["image"] == reference, pod["metadata"]["name"]
        assert is_ready(pod), pod["metadata"]["name"]
        _image_process(stack, pod)

    # rollouts through the image's router to the image's engines: each session stays on its replica
    url = _router(stack)
    sessions = [f"rollout-{i}" for i in range(6)]
    chat_turn(url, sessions)
    placed = {sid: replica_of(url, sid) for sid in sessions}
    assert set(placed.values()) == set(engines), placed
    chat_turn(url, sessions)
    assert {sid: replica_of(url, sid) for sid in sessions} == placed
    for sid in sessions:
        http_json("POST", f"{url}/finish_session?session_id={sid}")
    assert all(replica_of(url, sid) is None for sid in sessions)

    # an engine container killed: the kubelet starts it again from the image (a fresh writable layer)
    name = sorted(engines)[0]
    pid = _image_process(stack, engines[name])
    os.kill(pid, signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        pod = engine_pods(stack, POOL)[name]
        return pod if restarts(pod) >= 1 and is_ready(pod) else None

    pod = wait_until(restarted, what=f"{name} restarted and ready", timeout=120, interval=1.0, ignore=TRANSIENT_ERRORS)
    assert _image_process(stack, pod) != pid
    chat_turn(url, ["after-restart"])
