"""Names, labels and the desired manifests of a pool's children; needs_update."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from poolcases import load_example
from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.cli.router import _turns, router_command
from rolloutpool.reconcile.children import (
    ADMIN_TOKEN_PATH,
    STATE_PATH,
    desired_engine_pods,
    engine_pod,
    needs_update,
    router_objects,
    spec_hash,
)
from rolloutpool.reconcile.labels import (
    ANNOTATION_DRAIN_STARTED,
    ANNOTATION_SPEC_HASH,
    draining_from_pods,
    engine_index,
    engine_pod_name,
    engine_selector,
    owner_reference,
    pool_labels,
    router_name,
)

IMAGE = "ghcr.io/rolloutpool/rolloutpool:0.1.0"


def pool_object(example: str, **spec_changes: Any) -> dict[str, Any]:
    pool = load_example(example)
    pool["metadata"].update(namespace="team-a", uid="0b7c-uid", generation=1)
    pool["spec"].update(spec_changes)
    return pool


def spec_of(pool: dict[str, Any]) -> RolloutPoolSpec:
    return RolloutPoolSpec.model_validate(pool["spec"])


def container(pod: dict[str, Any]) -> dict[str, Any]:
    containers = pod["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


# ---------------------------------------------------------------- labels


def test_names_and_labels_follow_the_interface_notes() -> None:
    assert engine_pod_name("p", 3) == "p-engine-3"
    assert router_name("p") == "p-router"
    assert pool_labels("p", "engine", 2) == {
        "app.kubernetes.io/name": "rolloutpool",
        "app.kubernetes.io/instance": "p",
        "app.kubernetes.io/managed-by": "rolloutpool-operator",
        "rolloutpool.io/pool": "p",
        "rolloutpool.io/component": "engine",
        "rolloutpool.io/index": "2",
    }
    assert "rolloutpool.io/index" not in pool_labels("p", "router")
    assert engine_selector("p") == "rolloutpool.io/pool=p,rolloutpool.io/component=engine"
    with pytest.raises(ValueError, match="index"):
        engine_pod_name("p", -1)


def test_owner_reference_is_a_blocking_controller_reference() -> None:
    ref = owner_reference({"metadata": {"name": "p", "uid": "u"}})
    assert ref == {
        "apiVersion": "rolloutpool.io/v1alpha1",
        "kind": "RolloutPool",
        "name": "p",
        "uid": "u",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    with pytest.raises(ValueError, match="uid"):
        owner_reference({"metadata": {"name": "p"}})


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"name": "p-engine-4", "labels": {"rolloutpool.io/index": "4"}}, 4),
        ({"name": "p-engine-12"}, 12),
        ({"name": "p-engine-x", "labels": {"rolloutpool.io/index": "07"}}, None),
        ({"name": "my-engine-pool-engine-0"}, 0),
        ({"name": "stranger"}, None),
        ({}, None),
    ],
)
def test_engine_index(metadata: dict[str, Any], expected: int | None) -> None:
    assert engine_index({"metadata": metadata}) == expected


def test_draining_from_pods_reads_only_parseable_annotations() -> None:
    pods: list[dict[str, Any]] = [
        {"metadata": {"name": "a", "annotations": {ANNOTATION_DRAIN_STARTED: "1700000000.5"}}},
        {"metadata": {"name": "b", "annotations": {ANNOTATION_DRAIN_STARTED: "soon"}}},
        {"metadata": {"name": "c", "annotations": {ANNOTATION_DRAIN_STARTED: "nan"}}},
        {"metadata": {"name": "d"}},
    ]
    assert draining_from_pods(pods) == {"a": 1700000000.5}


# ---------------------------------------------------------------- engine pods


def test_simulated_engine_pod() -> None:
    pool = pool_object("simulated-pool.yaml")
    pod = engine_pod(pool=pool, spec=spec_of(pool), index=2, default_image=IMAGE)
    meta = pod["metadata"]
    assert meta["name"] == "sim-grpo-engine-2"
    assert meta["namespace"] == "team-a"
    assert meta["labels"] == pool_labels("sim-grpo", "engine", 2)
    assert meta["ownerReferences"] == [owner_reference(pool)]
    assert meta["annotations"]["prometheus.io/scrape"] == "true"
    assert meta["annotations"]["prometheus.io/port"] == "8000"
    assert meta["annotations"][ANNOTATION_SPEC_HASH] == spec_hash(pod)
    c = container(pod)
    assert c["image"] == IMAGE
    assert c["command"] == ["rolloutpool", "engine-sim"]
    assert c["args"] == [
        "--host=$(POD_IP)",
        "--port=8000",
        "--model=Qwen/Qwen3-8B",
        "--max-model-len=32768",
        "--kv-capacity-tokens=400000",
        "--hardware=h100-80gb",
        "--time-scale=10",
        "--seed=2",
        '--kv-events-config={"enable_kv_cache_events": true, "publisher": "zmq", '
        '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}',
    ]  # an engine-sim binds the wildcard on its own address (the local stack's pods share one namespace)
    assert [p["containerPort"] for p in c["ports"]] == [8000, 5557, 5558]
    assert "nvidia.com/gpu" not in str(c["resources"])
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]} == {
        "POD_IP": "status.podIP",
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
    }
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["restartPolicy"] == "Always"
    assert "nodeSelector" not in pod["spec"]
    assert "tolerations" not in pod["spec"]


def test_simulated_engine_without_capacity_uses_the_preset_and_its_own_image() -> None:
    pool = pool_object("simulated-pool.yaml")
    del pool["spec"]["engine"]["kvCapacityTokens"]
    pool["spec"]["engine"]["image"] = "registry.local/rp:dev"
    pool["spec"]["engine"]["simulator"] = {"hardware": "h200-141gb"}
    pool["spec"]["engine"]["extraArgs"] = ["--max-num-seqs=64"]
    c = container(engine_pod(pool=pool, spec=spec_of(pool), index=0, default_image=IMAGE))
    assert c["image"] == "registry.local/rp:dev"
    assert not any(a.startswith("--kv-capacity-tokens") for a in c["args"])
    assert "--hardware=h200-141gb" in c["args"]
    assert "--time-scale=1" in c["args"]
    assert c["args"][-1] == "--max-num-seqs=64"


def test_vllm_engine_pod() -> None:
    pool = pool_object("vllm-pool.yaml")
    pool["spec"]["engine"]["gpusPerReplica"] = 2
    pool["spec"]["engine"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    pod = engine_pod(pool=pool, spec=spec_of(pool), index=5, default_image=IMAGE)
    c = container(pod)
    assert c["image"] == "vllm/vllm-openai:v0.11.0"
    assert c["command"] == ["vllm", "serve"]
    assert c["args"] == [
        "Qwen/Qwen3-8B",
        "--host=$(POD_IP)",
        "--port=8000",
        "--max-model-len=32768",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--gpu-memory-utilization=0.9",
        "--tensor-parallel-size=2",
        '--kv-events-config={"enable_kv_cache_events": true, "publisher": "zmq", '
        '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}',
        "--max-num-seqs",
        "256",
    ]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 1800
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/dev/shm"] == "dshm"  # noqa: S108 -- a mount path in a manifest
    assert mounts["/cache"] == "cache"
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["spec"]["enableServiceLinks"] is False


def test_desired_engine_pods_one_per_replica() -> None:
    pool = pool_object("simulated-pool.yaml", replicas=3)
    pods = desired_engine_pods(pool=pool, spec=spec_of(pool), default_image=IMAGE)
    assert list(pods) == ["sim-grpo-engine-0", "sim-grpo-engine-1", "sim-grpo-engine-2"]
    seeds = [a for p in pods.values() for a in container(p)["args"] if a.startswith("--seed")]
    assert seeds == ["--seed=0", "--seed=1", "--seed=2"]


def test_kv_events_are_on_for_vllm_unless_the_pool_turns_them_off_or_configures_its_own() -> None:
    def children(pool: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        spec = spec_of(pool)
        router = container(router_objects(pool=pool, spec=spec, default_image=IMAGE)[-1]["spec"]["template"])
        return router, container(engine_pod(pool=pool, spec=spec, index=0, default_image=IMAGE))

    pool = pool_object("vllm-pool.yaml")
    router, engine = children(pool)
    assert "--kv-events-port=5557,5558" in router["args"]
    assert [p["containerPort"] for p in engine["ports"]] == [8000, 5557, 5558]
    pool["spec"]["router"]["kvEvents"] = False
    router, engine = children(pool)
    assert not any(a.startswith("--kv-events") for a in [*router["args"], *engine["args"]])
    assert [p["name"] for p in engine["ports"]] == ["http"]
    own = pool_object("vllm-pool.yaml")
    own["spec"]["engine"]["extraArgs"] = [
        '--kv-events-config={"enable_kv_cache_events": true, "endpoint": "tcp://*:6000"}'
    ]
    router, engine = children(own)
    assert [a for a in engine["args"] if a.startswith("--kv-events")] == own["spec"]["engine"]["extraArgs"]
    assert not any(a.startswith("--kv-events") for a in router["args"])  # its ports are the user's to wire
    simulated = pool_object("simulated-pool.yaml")
    router, engine = children(simulated)
    assert "--kv-events-port=5557,5558" in router["args"]
    assert [p["containerPort"] for p in engine["ports"]] == [8000, 5557, 5558]


def test_spec_hash_is_stable_and_sensitive() -> None:
    pool = pool_object("simulated-pool.yaml")
    one = engine_pod(pool=pool, spec=spec_of(pool), index=0, default_image=IMAGE)
    again = engine_pod(pool=copy.deepcopy(pool), spec=spec_of(pool), index=0, default_image=IMAGE)
    assert one == again
    changed = pool_object("simulated-pool.yaml")
    changed["spec"]["engine"]["maxModelLen"] = 16384
    other = engine_pod(pool=changed, spec=spec_of(changed), index=0, default_image=IMAGE)
    assert (
        other["metadata"]["annotations"][ANNOTATION_SPEC_HASH] != one["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    )
    scaled = pool_object("simulated-pool.yaml", replicas=9)
    same = engine_pod(pool=scaled, spec=spec_of(scaled), index=0, default_image=IMAGE)
    assert same == one  # the replica count is not part of a pod


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=5))
def test_spec_hash_ignores_key_order_and_its_own_annotation(labels: dict[str, str]) -> None:
    manifest = {"metadata": {"name": "x", "labels": labels, "annotations": {"a": "b"}}}
    annotations = {ANNOTATION_SPEC_HASH: "stale", "a": "b"}
    reordered = {"metadata": {"annotations": annotations, "labels": dict(reversed(list(labels.items()))), "name": "x"}}
    assert spec_hash(manifest) == spec_hash(reordered)


# ---------------------------------------------------------------- router


def test_router_objects() -> None:
    pool = pool_object("vllm-pool.yaml")
    objects = router_objects(pool=pool, spec=spec_of(pool), default_image=IMAGE)
    by_kind = {o["kind"]: o for o in objects}
    assert list(by_kind) == ["Secret", "ServiceAccount", "Role", "RoleBinding", "Service", "Deployment"]
    secret = by_kind.pop("Secret")  # the admin token: the operator fills it once, so no data and no hash here
    assert secret["metadata"]["name"] == "qwen3-8b-grpo-router-admin"
    assert set(secret) == {"apiVersion", "kind", "metadata", "type"}
    assert secret["metadata"]["ownerReferences"] == [owner_reference(pool)]
    for obj in by_kind.values():
        assert obj["metadata"]["name"] == "qwen3-8b-grpo-router"
        assert obj["metadata"]["namespace"] == "team-a"
        assert obj["metadata"]["labels"] == pool_labels("qwen3-8b-grpo", "router")
        assert obj["metadata"]["ownerReferences"] == [owner_reference(pool)]
        assert obj["metadata"]["annotations"][ANNOTATION_SPEC_HASH] == spec_hash(obj)
    rules = by_kind["Role"]["rules"]
    assert rules == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["rolloutpool.io"],
            "resources": ["rolloutpools"],
            "resourceNames": ["qwen3-8b-grpo"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    assert by_kind["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "qwen3-8b-grpo-router", "namespace": "team-a"}
    ]
    service = by_kind["Service"]["spec"]
    assert service["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    deployment = by_kind["Deployment"]["spec"]
    assert deployment["selector"]["matchLabels"] == service["selector"]
    template = deployment["template"]
    assert template["metadata"]["labels"]["rolloutpool.io/component"] == "router"
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "8080"
    pod_spec = template["spec"]
    assert pod_spec["serviceAccountName"] == "qwen3-8b-grpo-router"
    assert pod_spec["automountServiceAccountToken"] is True
    c = pod_spec["containers"][0]
    assert c["command"] == ["rolloutpool", "router"]
    assert c["args"] == [
        "--host=$(POD_IP)",
        "--port=8080",
        "--discover-namespace=$(POD_NAMESPACE)",
        "--discover-selector=rolloutpool.io/pool=qwen3-8b-grpo,rolloutpool.io/component=engine",
        "--pool=qwen3-8b-grpo",
        "--idle-timeout=1800",
        "--queue-timeout=600",
        "--queue-max=10000",
        f"--state-path={STATE_PATH}",
        f"--admin-token-file={ADMIN_TOKEN_PATH}",
        "--target=0.9",
        "--keep-quantile=0.99",
        "--prefill-rate=40000",
        "--hold-limit=300",
        "--cap-ceiling=256",
        "--kv-events-port=5557,5558",
    ]  # vLLM engines publish KV events on 5557 (replay 5558)
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/var/lib/rolloutpool", "/var/run/rolloutpool/admin"}
    token = next(v for v in pod_spec["volumes"] if v["name"] == "admin-token")
    assert token["secret"]["secretName"] == secret["metadata"]["name"]


def test_router_settings_come_from_the_spec() -> None:
    pool = pool_object("simulated-pool.yaml")
    pool["spec"]["router"] = {"replicas": 3, "image": "r:1", "queueTimeoutSeconds": 0, "maxQueueLength": 7}
    deployment = router_objects(pool=pool, spec=spec_of(pool), default_image=IMAGE)[-1]
    assert deployment["spec"]["replicas"] == 3
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "r:1"
    assert "--queue-timeout=0.01" in c["args"]
    assert "--queue-max=7" in c["args"]
    assert not any(a.startswith("--cap-ceiling") for a in c["args"])
    assert {"--hold-limit=300", "--time-scale=10"} <= set(c["args"])  # engine-sims ten times faster than real time


@pytest.mark.parametrize(("seconds", "arg"), [(4, "--renew-every=4"), (0.25, "--renew-every=0.25"), (None, None)])
def test_router_prefix_renewal_reaches_the_command_line(seconds: float | None, arg: str | None) -> None:
    pool = pool_object("simulated-pool.yaml")
    if seconds is not None:
        pool["spec"]["router"] = {"prefixRenewalSeconds": seconds}
    args = container(router_objects(pool=pool, spec=spec_of(pool), default_image=IMAGE)[-1]["spec"]["template"])["args"]
    renew = [a for a in args if a.startswith("--renew-every")]
    assert renew == ([arg] if arg else [])
    # the router command accepts exactly these arguments
    params = router_command.make_context("router", list(args)).params
    assert params["renew_every"] == (None if seconds is None else float(seconds))


@pytest.mark.parametrize("bad", [0, -1, 0.0, 90_000])
def test_prefix_renewal_must_be_positive_and_bounded(bad: float) -> None:
    pool = pool_object("simulated-pool.yaml")
    pool["spec"]["router"] = {"prefixRenewalSeconds": bad}
    with pytest.raises(ValidationError, match="prefixRenewalSeconds"):
        spec_of(pool)


# ---------------------------------------------------------------- needs_update


def _observed(desired: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns: the desired object plus defaults and server fields."""
    obj = copy.deepcopy(desired)
    obj["metadata"].update(uid="child-uid", resourceVersion="42", creationTimestamp="2026-01-01T00:00:00Z")
    obj["metadata"]["labels"]["extra"] = "set-by-someone"
    obj["spec"]["dnsPolicy"] = "ClusterFirst"
    obj["status"] = {"phase": "Running"}
    return obj


def _set_hash(obj: dict[str, Any]) -> None:
    obj["metadata"]["annotations"][ANNOTATION_SPEC_HASH] = "0000"


def _drop_hash(obj: dict[str, Any]) -> None:
    del obj["metadata"]["annotations"][ANNOTATION_SPEC_HASH]


def _drop_pool_label(obj: dict[str, Any]) -> None:
    del obj["metadata"]["labels"]["rolloutpool.io/pool"]


def _change_index_label(obj: dict[str, Any]) -> None:
    obj["metadata"]["labels"]["rolloutpool.io/index"] = "9"


def _drop_owner(obj: dict[str, Any]) -> None:
    obj["metadata"]["ownerReferences"] = []


def _other_owner(obj: dict[str, Any]) -> None:
    obj["metadata"]["ownerReferences"][0]["uid"] = "another-pool"


def _not_controller(obj: dict[str, Any]) -> None:
    obj["metadata"]["ownerReferences"][0]["controller"] = False


def _edit_image(obj: dict[str, Any]) -> None:
    obj["spec"]["containers"][0]["image"] = "edited-by-hand"


def _drop_scrape_annotation(obj: dict[str, Any]) -> None:
    del obj["metadata"]["annotations"]["prometheus.io/scrape"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (None, False),
        (_set_hash, True),
        (_drop_hash, True),
        (_drop_pool_label, True),
        (_change_index_label, True),
        (_drop_owner, True),
        (_other_owner, True),
        (_not_controller, True),
        (_edit_image, False),  # the spec-hash annotation is the contract, not the live fields
        (_drop_scrape_annotation, False),
    ],
)
def test_needs_update(change: Any, expected: bool) -> None:
    pool = pool_object("simulated-pool.yaml")
    desired = engine_pod(pool=pool, spec=spec_of(pool), index=0, default_image=IMAGE)
    observed = _observed(desired)
    if change is not None:
        change(observed)
    assert needs_update(observed=observed, desired=desired) is expected


def test_needs_update_for_every_router_object() -> None:
    pool = pool_object("simulated-pool.yaml")
    before = router_objects(pool=pool, spec=spec_of(pool), default_image=IMAGE)
    pool["spec"]["router"] = {"idleTimeoutSeconds": 60}
    after = router_objects(pool=pool, spec=spec_of(pool), default_image=IMAGE)
    changed = [
        b["kind"] for b, a in zip(before, after, strict=True) if needs_update(observed=copy.deepcopy(b), desired=a)
    ]
    assert changed == ["Deployment"]


@given(
    target=st.floats(0.1, 1.0),
    quantile=st.floats(0.5, 0.999),
    rate=st.floats(0.0, 1e9),
    time_scale=st.floats(0.001, 10000),
)
def test_numbers_reach_the_command_line_unrounded(
    target: float, quantile: float, rate: float, time_scale: float
) -> None:
    pool = pool_object("simulated-pool.yaml")
    pool["spec"]["concurrency"] = {"workingSetTarget": target, "keepQuantile": quantile, "prefillTokensPerSecond": rate}
    pool["spec"]["engine"]["simulator"]["timeScale"] = time_scale
    spec = spec_of(pool)
    args = container(router_objects(pool=pool, spec=spec, default_image=IMAGE)[-1]["spec"]["template"])["args"]
    values = dict(a.removeprefix("--").split("=", 1) for a in args)
    assert float(values["target"]) == target
    assert float(values["keep-quantile"]) == quantile
    assert float(values["prefill-rate"]) == rate
    assert router_command.make_context("router", list(args)).params["prefill_rate"] == rate
    engine_args = container(engine_pod(pool=pool, spec=spec, index=0, default_image=IMAGE))["args"]
    assert float(dict(a.removeprefix("--").split("=", 1) for a in engine_args if "=" in a)["time-scale"]) == time_scale


def test_the_routers_turn_settings_follow_the_engines_time_scale() -> None:
    # time-scaled engine-sims: their seconds pass 4x faster, so they prefill 4x the tokens per wall second
    turns = _turns(target=0.9, keep_quantile=0.9, prefill_rate=40_000.0, hold_limit=300.0, scale=4.0)
    assert (turns.prefill_tokens_per_s, turns.hold_limit_s, turns.keep_s) == (160_000.0, 75.0, 5.0)
    off = _turns(target=0.9, keep_quantile=0.9, prefill_rate=0.0, hold_limit=300.0, scale=4.0)
    assert off.prefill_tokens_per_s is None  # 0: the lease alone
