"""The process kubelet's pure decisions: expansion, env, paths, quantities, fit, back-off, status, probes."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from rolloutpool.dev.kubelet.decide import (
    DEFAULT_IMAGE_PATTERN,
    EnvError,
    allocate_ip,
    backoff_seconds,
    container_requests,
    env_sources,
    expand,
    image_matches,
    parse_quantity,
    resolve_env,
    schedule_fit,
    substitute_paths,
)
from rolloutpool.dev.kubelet.pods import ApiTarget, api_target
from rolloutpool.dev.kubelet.status import (
    ContainerView,
    ProbeState,
    Terminated,
    pod_phase,
    pod_status,
    probe_due,
    probe_step,
    rfc3339,
    unsupported_image_status,
    will_restart,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--host=$(POD_IP)", "--host=127.0.0.7"),
        ("$(POD_IP):$(PORT)", "127.0.0.7:8000"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(POD_IP)", "$(POD_IP)"),
        ("$$", "$"),
        ("a$b", "a$b"),
        ("trailing$", "trailing$"),
        ("$(UNCLOSED", "$(UNCLOSED"),
        ("$(EMPTY)x", "x"),
        ("plain", "plain"),
    ],
)
def test_expand_follows_kubernetes(text: str, expected: str) -> None:
    assert expand(text, env={"POD_IP": "127.0.0.7", "PORT": "8000", "EMPTY": ""}) == expected


POD: dict[str, Any] = {
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"app": "x"},
        "annotations": {"a/b": "c"},
    },
    "spec": {"nodeName": "n", "serviceAccountName": "sa"},
    "status": {"podIP": "127.0.0.3", "hostIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.3"}]},
}


def test_resolve_env_downward_api_refs_and_order() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "ANN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a/b']"}}},
            {"name": "URL", "value": "http://$(POD_IP):8000/$(LATER)"},
            {"name": "LATER", "value": "x"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}},
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "level"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}},
            {"name": "GPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
        ],
        "resources": {"limits": {"memory": "1536Ki"}},
    }
    env = resolve_env(
        pod=POD,
        container=container,
        config_maps={"cm": {"level": "debug"}},
        secrets={"s": {"t": "sekret"}},
        base={"HOME": "/h"},
    )
    assert env == {
        "HOME": "/h",
        "CM_level": "debug",
        "POD_IP": "127.0.0.3",
        "POD_NAME": "p",
        "NS": "ns",
        "UID": "u-1",
        "NODE": "n",
        "SA": "sa",
        "APP": "x",
        "ANN": "c",
        "URL": "http://127.0.0.3:8000/$(LATER)",  # only variables defined before are expanded
        "LATER": "x",
        "TOKEN": "sekret",
        "LEVEL": "debug",
        "GPUS": "2",  # 1.5 MiB in MiB, rounded up
    }
    assert env_sources(container) == ({"cm"}, {"s", "nope"})


@pytest.mark.parametrize(
    ("env", "configs", "secrets", "message"),
    [
        ([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}], {}, {}, "Secret 's' not found"),
        ([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}], {"c": {}}, {}, "key 'k'"),
        ([{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.hostname"}}}], {}, {}, "spec.hostname"),
    ],
)
def test_resolve_env_names_what_is_missing(env: list[Any], configs: Any, secrets: Any, message: str) -> None:
    with pytest.raises(EnvError, match=message):
        resolve_env(pod=POD, container={"env": env}, config_maps=configs, secrets=secrets)


def test_substitute_paths_maps_mounts_at_path_boundaries() -> None:
    mounts = {"/state": "/k/pods/p/volumes/state", "/state/deep": "/k/deep", "/etc/tok/": "/k/tok"}
    assert (
        substitute_paths("--state-path=/state/router.json", mounts=mounts)
        == "--state-path=/k/pods/p/volumes/state/router.json"
    )
    assert substitute_paths("/state/deep/x", mounts=mounts) == "/k/deep/x"  # the longest mount wins
    assert substitute_paths("/state", mounts=mounts) == "/k/pods/p/volumes/state"
    assert substitute_paths("/etc/tok/token", mounts=mounts) == "/k/tok/token"
    assert substitute_paths("/statefile /x/state/y", mounts=mounts) == "/statefile /x/state/y"  # not a mount
    # one pass: a host path that itself starts with a mount path is not mapped again
    nested = {"/state": "/scratch/pod/volumes/state", "/scratch": "/scratch/pod/volumes/scratch"}
    mapped = substitute_paths("/state/x /scratch/y", mounts=nested)
    assert mapped == "/scratch/pod/volumes/state/x /scratch/pod/volumes/scratch/y"
    assert (
        substitute_paths("a=/state,b=/state/q", mounts=mounts)
        == "a=/k/pods/p/volumes/state,b=/k/pods/p/volumes/state/q"
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("2Gi", Fraction(2 * 2**30)),
        ("1.5k", Fraction(1500)),
        ("1e3", Fraction(1000)),
        ("100Mi", Fraction(100 * 2**20)),
        ("0.25", Fraction(1, 4)),
    ],
)
def test_parse_quantity(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


def test_parse_quantity_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity("lots")


def _pod(name: str, *, gpu: int = 0, cpu: str = "", **spec: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": str(gpu)}} if gpu else {}
    if cpu:
        resources["requests"] = {"cpu": cpu}
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "resources": resources}], **spec}}


NODE: dict[str, Any] = {
    "metadata": {"labels": {"kubernetes.io/hostname": "n", "gpu": "h200"}},
    "spec": {"taints": [{"key": "dedicated", "value": "rl", "effect": "NoSchedule"}]},
    "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "3", "nvidia.com/gpu": "2"}},
}
TOLERATE = [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}]


def test_schedule_fit_counts_gpus_cpu_and_pods() -> None:
    assert container_requests(_pod("a", gpu=1, cpu="500m")) == {"nvidia.com/gpu": 1, "cpu": Fraction(1, 2)}
    one = _pod("a", gpu=1, tolerations=TOLERATE)
    assert schedule_fit(pod=one, node=NODE, bound=[]) is None
    assert schedule_fit(pod=one, node=NODE, bound=[_pod("b", gpu=1)]) is None
    assert schedule_fit(pod=one, node=NODE, bound=[_pod("b", gpu=2)]) == "Insufficient nvidia.com/gpu"
    assert schedule_fit(pod=_pod("c", cpu="5", tolerations=TOLERATE), node=NODE, bound=[]) == "Insufficient cpu"
    three = [_pod(str(i)) for i in range(3)]
    assert schedule_fit(pod=_pod("d", tolerations=TOLERATE), node=NODE, bound=three) == "Too many pods"


def test_schedule_fit_node_selector_and_taints() -> None:
    assert "untolerated taint {dedicated: rl}" in str(schedule_fit(pod=_pod("a"), node=NODE, bound=[]))
    exists = [{"operator": "Exists"}]
    assert schedule_fit(pod=_pod("a", tolerations=exists), node=NODE, bound=[]) is None
    wrong = [{"key": "dedicated", "value": "other", "effect": "NoSchedule"}]
    assert schedule_fit(pod=_pod("a", tolerations=wrong), node=NODE, bound=[]) is not None
    picky = _pod("a", tolerations=TOLERATE, nodeSelector={"gpu": "h100"})
    assert schedule_fit(pod=picky, node=NODE, bound=[]) == "node(s) didn't match Pod's node selector (gpu=h100)"
    ok = _pod("a", tolerations=TOLERATE, nodeSelector={"gpu": "h200"})
    assert schedule_fit(pod=ok, node=NODE, bound=[]) is None


def test_backoff_doubles_to_the_cap() -> None:
    delays = [backoff_seconds(crashes=n, base=10.0, cap=300.0) for n in range(8)]
    assert delays == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
    assert backoff_seconds(crashes=10_000, base=0.1, cap=1.0) == 1.0


def test_allocate_ip_reuses_freed_addresses_and_keeps_dot_one() -> None:
    assert allocate_ip(used=[]) == "127.0.0.2"
    assert allocate_ip(used=["127.0.0.2", "127.0.0.4"]) == "127.0.0.3"
    assert allocate_ip(used=["127.0.0.2"], preferred="127.0.0.9") == "127.0.0.9"
    assert allocate_ip(used=["127.0.0.9"], preferred="127.0.0.9") == "127.0.0.2"
    assert allocate_ip(used=[], preferred="127.0.0.1") == "127.0.0.2"
    assert allocate_ip(used=[], preferred="10.1.2.3") == "127.0.0.2"
    assert allocate_ip(used=["127.0.1.2"], prefix="127.0.1.") == "127.0.1.3"
    assert allocate_ip(used=[], preferred="127.0.0.5", prefix="127.0.1.") == "127.0.1.2"  # not in this subnet
    with pytest.raises(RuntimeError, match="no free pod address"):
        allocate_ip(used=[f"127.0.0.{x}" for x in range(2, 255)])


@pytest.mark.parametrize(
    ("image", "ok"),
    [
        ("ghcr.io/rolloutpool/rolloutpool:0.1.0", True),
        ("ghcr.io/rolloutpool/rolloutpool", True),
        ("ghcr.io/rolloutpool/rolloutpool:dev-1_x", True),
        ("ghcr.io/rolloutpool/rolloutpool@sha256:" + "a" * 64, True),
        ("nginx:1.27", False),
        ("ghcr.io/rolloutpool/rolloutpool-evil:1", False),
        ("evil.io/ghcr.io/rolloutpool/rolloutpool:1", False),
    ],
)
def test_image_matcher(image: str, ok: bool) -> None:
    assert image_matches(image, patterns=[DEFAULT_IMAGE_PATTERN]) is ok


def test_image_matcher_is_configurable() -> None:
    assert image_matches("python:3.12", patterns=[DEFAULT_IMAGE_PATTERN, r"python:.*"])


def _ended(code: int) -> Terminated:
    return Terminated(exit_code=code, reason="Completed" if code == 0 else "Error", started_at=10.0, finished_at=20.0)


def test_will_restart_per_policy() -> None:
    assert will_restart(exit_code=0, restart_policy="Always")
    assert not will_restart(exit_code=0, restart_policy="OnFailure")
    assert will_restart(exit_code=3, restart_policy="OnFailure")
    assert not will_restart(exit_code=3, restart_policy="Never")


def test_pod_phase() -> None:
    waiting = ContainerView(name="a", image="i")
    running = ContainerView(name="a", image="i", state="running", started_at=1.0)
    backing_off = ContainerView(name="a", image="i", reason="CrashLoopBackOff", last_terminated=_ended(1))
    done_ok = ContainerView(name="b", image="i", state="terminated", terminated=_ended(0))
    done_bad = ContainerView(name="b", image="i", state="terminated", terminated=_ended(2))
    assert pod_phase(containers=[waiting]) == "Pending"
    assert pod_phase(containers=[running, waiting]) == "Running"
    assert pod_phase(containers=[backing_off]) == "Running"
    assert pod_phase(containers=[done_ok, done_ok]) == "Succeeded"
    assert pod_phase(containers=[done_ok, done_bad]) == "Failed"
    assert pod_phase(containers=[done_ok, running]) == "Running"


def test_pod_status_conditions_and_container_states() -> None:
    view = ContainerView(
        name="engine", image="img", state="running", started_at=100.0, started=True, ready=False, restart_count=2,
        last_terminated=_ended(1),
    )  # fmt: skip
    status = pod_status(
        pod_uid="u",
        containers=[view],
        pod_ip="127.0.0.5",
        host_ip="127.0.0.1",
        start_time=50.0,
        previous_conditions=[],
        now=200.0,
    )
    assert status["phase"] == "Running"
    assert status["podIP"] == "127.0.0.5"
    assert status["podIPs"] == [{"ip": "127.0.0.5"}]
    assert status["startTime"] == rfc3339(50.0)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["message"] == "containers with unready status: [engine]"
    assert conditions["PodScheduled"]["status"] == conditions["Initialized"]["status"] == "True"
    (cs,) = status["containerStatuses"]
    assert cs["restartCount"] == 2
    assert cs["state"] == {"running": {"startedAt": rfc3339(100.0)}}
    assert cs["lastState"]["terminated"]["exitCode"] == 1
    # becoming ready moves lastTransitionTime of Ready only; staying ready keeps it
    ready = pod_status(
        pod_uid="u", containers=[ContainerView(**{**view.__dict__, "ready": True})], pod_ip="127.0.0.5",
        host_ip="127.0.0.1", start_time=50.0, previous_conditions=status["conditions"], now=300.0,
    )  # fmt: skip
    after = {c["type"]: c for c in ready["conditions"]}
    assert after["Ready"]["status"] == "True"
    assert after["Ready"]["lastTransitionTime"] == rfc3339(300.0)
    assert after["PodScheduled"]["lastTransitionTime"] == rfc3339(200.0)
    again = pod_status(
        pod_uid="u", containers=[ContainerView(**{**view.__dict__, "ready": True})], pod_ip="127.0.0.5",
        host_ip="127.0.0.1", start_time=50.0, previous_conditions=ready["conditions"], now=400.0,
    )  # fmt: skip
    assert again == ready  # nothing changed, nothing to patch


def test_waiting_and_terminated_states_render() -> None:
    back_off = ContainerView(
        name="a", image="i", reason="CrashLoopBackOff", message="back-off 10s", last_terminated=_ended(1)
    )
    assert back_off.as_status(pod_uid="u")["state"] == {
        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}
    }
    done = ContainerView(name="a", image="i", state="terminated", terminated=_ended(0))
    assert done.as_status(pod_uid="u")["state"]["terminated"]["reason"] == "Completed"


def test_unsupported_image_status_names_the_images() -> None:
    status = unsupported_image_status(
        images=["nginx:1.27"], runnable=[DEFAULT_IMAGE_PATTERN], host_ip="127.0.0.1", previous_conditions=[], now=5.0
    )
    assert status["phase"] == "Failed"
    assert status["reason"] == "UnsupportedImage"
    assert "nginx:1.27" in status["message"]
    assert "rolloutpool" in status["message"]


def test_probe_timing_and_thresholds() -> None:
    probe = {"initialDelaySeconds": 5, "periodSeconds": 2, "failureThreshold": 2, "successThreshold": 2}
    state = ProbeState()
    assert not probe_due(probe=probe, started_at=100.0, state=state, now=104.9)
    assert probe_due(probe=probe, started_at=100.0, state=state, now=105.0)
    state = probe_step(state=state, ok=True, probe=probe, now=105.0)
    assert state.passing is None  # one success is not two
    assert not probe_due(probe=probe, started_at=100.0, state=state, now=106.0)
    assert probe_due(probe=probe, started_at=100.0, state=state, now=107.0)
    state = probe_step(state=state, ok=True, probe=probe, now=107.0)
    assert state.passing is True
    state = probe_step(state=state, ok=False, probe=probe, now=109.0)
    assert state.passing is True  # one failure is below the threshold
    state = probe_step(state=state, ok=False, probe=probe, now=111.0)
    assert state.passing is False
    assert (state.successes, state.failures) == (0, 2)


def test_api_target_reads_the_current_cluster(tmp_path: Path) -> None:
    config = {
        "clusters": [
            {"name": "other", "cluster": {"server": "https://10.0.0.1:6443", "certificate-authority": "/x/ca.crt"}},
            {"name": "local", "cluster": {"server": "https://127.0.0.1:4443", "certificate-authority": "pki/ca.crt"}},
            {
                "name": "inline",
                "cluster": {"server": "https://127.0.0.1:5443", "certificate-authority-data": "Y2EtZGF0YQ=="},
            },
        ],
        "contexts": [{"name": "a", "context": {"cluster": "local"}}, {"name": "b", "context": {"cluster": "inline"}}],
        "current-context": "a",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    assert api_target(path, tmp_path) == ApiTarget(server="https://127.0.0.1:4443", ca_file=tmp_path / "pki" / "ca.crt")
    path.write_text(yaml.safe_dump({**config, "current-context": "b"}))
    inline = api_target(path, tmp_path)
    assert inline.server == "https://127.0.0.1:5443"
    assert inline.ca_file.read_text() == "ca-data"
