"""Desired manifests of a RolloutPool's children as plain dicts, and ``needs_update`` (pure).

Engine pods (one per replica, vLLM or the simulator) and the router's Deployment, Service,
ServiceAccount, Role and RoleBinding. Every child carries the pool's labels, a controller
owner reference and the ``rolloutpool.io/spec-hash`` annotation: a stable hash of the
desired manifest without that annotation, which ``needs_update`` compares. Pods are
immutable, so for a pod "needs update" means "drain, delete and recreate".
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from rolloutpool.api.spec import RolloutPoolSpec, SimulatorSpec
from rolloutpool.api.status import API_GROUP, PLURAL
from rolloutpool.reconcile.engine_pod import apply_engine_fields
from rolloutpool.reconcile.labels import (
    ANNOTATION_SPEC_HASH,
    ENGINE_PORT,
    KV_EVENTS_CONFIG,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    ROUTER_PORT,
    admin_secret_name,
    engine_pod_name,
    engine_selector,
    owner_reference,
    pool_labels,
    router_match_labels,
    router_name,
    router_selector,
)

__all__ = [
    "ADMIN_TOKEN_KEY",
    "ADMIN_TOKEN_PATH",
    "STATE_PATH",
    "TRACE_PATH",
    "VLLM_STARTUP_SECONDS",
    "desired_engine_pods",
    "engine_pod",
    "needs_update",
    "router_objects",
    "spec_hash",
    "with_spec_hash",
]

VLLM_STARTUP_SECONDS = 1800
"""How long a vLLM pod may take to download and load its model before kubelet restarts it."""
STATE_PATH = "/var/lib/rolloutpool/state.json"
"""The router's session-table snapshot (on an emptyDir: survives a container restart, not a pod move)."""
TRACE_PATH = "/var/lib/rolloutpool/trace.jsonl"
"""The router's turn trace (``spec.router.trace``), in the same emptyDir as its state."""
ADMIN_TOKEN_KEY = "token"  # noqa: S105 -- the key's name in the Secret, not a token
"""The key of the router's admin token in its Secret (``<pool>-router-admin``)."""
ADMIN_TOKEN_PATH = f"/var/run/rolloutpool/admin/{ADMIN_TOKEN_KEY}"
"""Where the router reads its admin token (the Secret, mounted read-only)."""
_NON_ROOT_UID = 65532


def _number(value: float) -> str:
    """A command-line number: ``10`` for 10.0, the shortest exact form otherwise (never rounded)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def spec_hash(manifest: Mapping[str, Any]) -> str:
    """Stable hash of a manifest without its own ``rolloutpool.io/spec-hash`` annotation (pure)."""
    body = copy.deepcopy(dict(manifest))
    annotations = (body.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict):
        annotations.pop(ANNOTATION_SPEC_HASH, None)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def with_spec_hash(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with its ``rolloutpool.io/spec-hash`` annotation set (pure; returns a new dict)."""
    out = copy.deepcopy(manifest)
    out.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = spec_hash(manifest)
    return out


def _metadata(pool: Mapping[str, Any], name: str, labels: dict[str, str]) -> dict[str, Any]:
    meta = pool.get("metadata") or {}
    return {
        "name": name,
        "namespace": meta.get("namespace", "default"),
        "labels": dict(labels),
        "annotations": {},
        "ownerReferences": [owner_reference(pool)],
    }


def _downward_env() -> list[dict[str, Any]]:
    return [
        {"name": env, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
        for env, path in (
            ("POD_IP", "status.podIP"),
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
        )
    ]


def _scrape_annotations(port: int) -> dict[str, str]:
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}


def _http_probe(path: str, *, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _ours_security() -> tuple[dict[str, Any], dict[str, Any]]:
    pod = {
        "runAsNonRoot": True,
        "runAsUser": _NON_ROOT_UID,
        "runAsGroup": _NON_ROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    return pod, container


def _kv_events(spec: RolloutPoolSpec) -> bool:
    """Whether the operator turns the engines' KV events on: ``router.kvEvents``, unless the user configured them."""
    own = any(a.startswith("--kv-events-config") for a in spec.engine.extra_args)
    return spec.router.kv_events and not own


def _kv_events_args(spec: RolloutPoolSpec) -> list[str]:
    return [f"--kv-events-config={KV_EVENTS_CONFIG}"] if _kv_events(spec) else []


def _engine_ports(spec: RolloutPoolSpec) -> list[dict[str, Any]]:
    ports = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    if _kv_events(spec):
        ports += [
            {"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"},
            {"name": "kv-replay", "containerPort": KV_REPLAY_PORT, "protocol": "TCP"},
        ]
    return ports


def _vllm_container(spec: RolloutPoolSpec) -> dict[str, Any]:
    engine = spec.engine
    tp = max(1, engine.gpus_per_replica)
    args = [
        engine.model,
        "--host=$(POD_IP)",
        f"--port={ENGINE_PORT}",
        f"--max-model-len={engine.max_model_len}",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        f"--gpu-memory-utilization={_number(engine.gpu_memory_utilization)}",
        f"--tensor-parallel-size={tp}",
        *_kv_events_args(spec),
        *engine.extra_args,
    ]
    cache_env = [
        {"name": "HOME", "value": "/cache"},
        {"name": "HF_HOME", "value": "/cache/huggingface"},
        {"name": "VLLM_CACHE_ROOT", "value": "/cache/vllm"},
        {"name": "XDG_CACHE_HOME", "value": "/cache"},
        {"name": "TRITON_CACHE_DIR", "value": "/cache/triton"},
    ]
    return {
        "name": "engine",
        "image": engine.image,
        "command": ["vllm", "serve"],
        "args": args,
        "env": [*_downward_env(), *cache_env],
        "ports": _engine_ports(spec),
        "resources": {"limits": {"nvidia.com/gpu": str(tp)}},
        "startupProbe": _http_probe("/health", period=10, failures=VLLM_STARTUP_SECONDS // 10),
        "readinessProbe": _http_probe("/health", period=5, failures=3),
        "livenessProbe": _http_probe("/health", period=10, failures=6),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},  # noqa: S108 -- shared memory for NCCL, an emptyDir
            {"name": "cache", "mountPath": "/cache"},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 -- an emptyDir of the pod, not the host's /tmp
        ],
        # The vLLM image runs as root and writes caches beyond the mounted ones (torch, NCCL):
        # no privilege escalation and no capabilities, but a writable root filesystem.
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }


def _simulated_container(spec: RolloutPoolSpec, index: int, image: str) -> dict[str, Any]:
    engine = spec.engine
    simulator = engine.simulator
    args = [
        "--host=$(POD_IP)",
        f"--port={ENGINE_PORT}",
        f"--model={engine.model}",
        f"--max-model-len={engine.max_model_len}",
    ]
    if engine.kv_capacity_tokens is not None:
        args.append(f"--kv-capacity-tokens={engine.kv_capacity_tokens}")
    args += [
        f"--hardware={(simulator or SimulatorSpec()).hardware}",
        f"--time-scale={_number(simulator.time_scale if simulator else 1.0)}",
        f"--seed={index}",
        *_kv_events_args(spec),
        *engine.extra_args,
    ]
    _, security = _ours_security()
    return {
        "name": "engine",
        "image": image,
        "command": ["rolloutpool", "engine-sim"],
        "args": args,
        "env": _downward_env(),
        "ports": _engine_ports(spec),
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "readinessProbe": _http_probe("/health", period=2, failures=3),
        "livenessProbe": _http_probe("/health", period=10, failures=6),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],  # noqa: S108 -- the pod's emptyDir
        "securityContext": security,
    }


def engine_pod(*, pool: Mapping[str, Any], spec: RolloutPoolSpec, index: int, default_image: str) -> dict[str, Any]:
    """The engine pod of replica ``index`` with its spec-hash annotation (pure).

    ``pool`` is the whole RolloutPool object (name, namespace, uid for the owner reference);
    ``default_image`` runs a simulated engine without ``engine.image``.
    """
    name = str((pool.get("metadata") or {}).get("name", ""))
    engine = spec.engine
    meta = _metadata(pool, engine_pod_name(name, index), pool_labels(name, "engine", index))
    meta["annotations"] = _scrape_annotations(ENGINE_PORT)
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "enableServiceLinks": False,  # a Service named vllm would inject VLLM_PORT, which vLLM misreads
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
    }
    if engine.kind == "vllm":
        container = _vllm_container(spec)
        volumes += [
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "cache", "emptyDir": {}},
        ]
    else:
        container = _simulated_container(spec, index, engine.image or default_image)
        pod_spec["securityContext"], _ = _ours_security()
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = volumes
    if engine.node_selector:
        pod_spec["nodeSelector"] = dict(engine.node_selector)
    if engine.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(engine.tolerations)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}
    return with_spec_hash(apply_engine_fields(pod, engine))  # GPU-cluster fields and podTemplate (engine_pod.py)


def desired_engine_pods(
    *, pool: Mapping[str, Any], spec: RolloutPoolSpec, default_image: str
) -> dict[str, dict[str, Any]]:
    """Every engine pod the spec asks for, by name (pure)."""
    pods = (engine_pod(pool=pool, spec=spec, index=i, default_image=default_image) for i in range(spec.replicas))
    return {pod["metadata"]["name"]: pod for pod in pods}


def _router_args(pool_name: str, spec: RolloutPoolSpec) -> list[str]:
    router, concurrency = spec.router, spec.concurrency
    args = [
        "--host=$(POD_IP)",
        f"--port={ROUTER_PORT}",
        "--discover-namespace=$(POD_NAMESPACE)",
        f"--discover-selector={engine_selector(pool_name)}",
        f"--pool={pool_name}",
        f"--idle-timeout={router.idle_timeout_seconds}",
        f"--queue-timeout={_number(max(router.queue_timeout_seconds, 0.01))}",  # the router waits at least 10 ms
        f"--queue-max={router.max_queue_length}",
        f"--state-path={STATE_PATH}",
        f"--admin-token-file={ADMIN_TOKEN_PATH}",
        f"--target={_number(concurrency.working_set_target)}",
        f"--keep-quantile={_number(concurrency.keep_quantile)}",
        f"--prefill-rate={_number(concurrency.prefill_tokens_per_second)}",
    ]
    simulator = spec.engine.simulator
    args.append(f"--hold-limit={_number(concurrency.hold_limit_seconds)}")
    if simulator is not None and simulator.time_scale != 1.0:  # engine-sims run time-scaled: the router follows
        args.append(f"--time-scale={_number(simulator.time_scale)}")
    if concurrency.max_sessions_per_replica is not None:
        args.append(f"--cap-ceiling={concurrency.max_sessions_per_replica}")
    if _kv_events(spec):
        args.append(f"--kv-events-port={KV_EVENTS_PORT},{KV_REPLAY_PORT}")
    if router.prefix_renewal_seconds is not None:
        args.append(f"--renew-every={_number(router.prefix_renewal_seconds)}")
    if router.trace.enabled:  # read it with kubectl cp <router pod>:/var/lib/rolloutpool/trace.jsonl
        args += [f"--trace-file={TRACE_PATH}", f"--trace-max-bytes={router.trace.max_bytes}"]
        args.append(f"--trace-session-ids={router.trace.session_ids}")
    if router.replicas > 1:  # one fleet: each pod owns the engines the operator assigns it (router/fleet.py)
        args += ["--self-name=$(POD_NAME)", f"--peer-selector={router_selector(pool_name)}"]
    return args


def router_objects(*, pool: Mapping[str, Any], spec: RolloutPoolSpec, default_image: str) -> list[dict[str, Any]]:
    """Admin-token Secret, ServiceAccount, Role, RoleBinding, Service and Deployment of the pool's router (pure).

    The Role lets the router read pods and this one RolloutPool (``resourceNames``; the router
    lists it with a ``metadata.name`` field selector), nothing more. The Secret
    (``<pool>-router-admin``) holds the router's admin token: the manifest carries no data, the
    operator fills a random token when it creates it and never reads or changes it afterwards (a
    token the user put there first is kept). The routers mount it: the admin API and engine control
    fan-out need it, and a fleet's routers authenticate their forwarding with it.
    """
    name = str((pool.get("metadata") or {}).get("name", ""))
    namespace = (pool.get("metadata") or {}).get("namespace", "default")
    child = router_name(name)
    labels = pool_labels(name, "router")
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(pool, admin_secret_name(name), labels),
        "type": "Opaque",
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(pool, child, labels)}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(pool, child, labels),
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {
                "apiGroups": [API_GROUP],
                "resources": [PLURAL],
                "resourceNames": [name],
                "verbs": ["get", "list", "watch"],
            },
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(pool, child, labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": child},
        "subjects": [{"kind": "ServiceAccount", "name": child, "namespace": namespace}],
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pool, child, labels),
        "spec": {
            "type": "ClusterIP",
            "selector": router_match_labels(name),
            "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    pod_security, container_security = _ours_security()
    container = {
        "name": "router",
        "image": spec.router.image or default_image,
        "command": ["rolloutpool", "router"],
        "args": _router_args(name, spec),
        "env": _downward_env(),
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "readinessProbe": _http_probe("/readyz", period=2, failures=3),
        "livenessProbe": _http_probe("/healthz", period=10, failures=6),
        "volumeMounts": [
            {"name": "state", "mountPath": STATE_PATH.rsplit("/", 1)[0]},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 -- the pod's emptyDir
            {"name": "admin-token", "mountPath": ADMIN_TOKEN_PATH.rsplit("/", 1)[0], "readOnly": True},
        ],
        "securityContext": container_security,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(pool, child, labels),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": router_match_labels(name)},
            "template": {
                "metadata": {"labels": dict(labels), "annotations": _scrape_annotations(ROUTER_PORT)},
                "spec": {
                    "serviceAccountName": child,
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    "securityContext": pod_security,
                    "containers": [container],
                    "volumes": [
                        {"name": "state", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {}},
                        {
                            "name": "admin-token",
                            "secret": {
                                "secretName": admin_secret_name(name),
                                "items": [{"key": ADMIN_TOKEN_KEY, "path": ADMIN_TOKEN_KEY, "mode": 0o400}],
                            },
                        },
                    ],
                },
            },
        },
    }
    return [secret] + [with_spec_hash(obj) for obj in (account, role, binding, service, deployment)]


def needs_update(*, observed: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether an observed child differs from its desired manifest (pure).

    True when the spec-hash annotations differ, a desired label is missing or different, or the
    desired controller owner reference (by uid) is absent. Fields the API server defaults are
    ignored by construction. For a pod, True means it must be replaced.
    """
    observed_meta = observed.get("metadata") or {}
    desired_meta = desired.get("metadata") or {}
    observed_hash = (observed_meta.get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
    if observed_hash != (desired_meta.get("annotations") or {}).get(ANNOTATION_SPEC_HASH):
        return True
    observed_labels = observed_meta.get("labels") or {}
    if any(observed_labels.get(key) != value for key, value in (desired_meta.get("labels") or {}).items()):
        return True
    observed_owners = {ref.get("uid") for ref in observed_meta.get("ownerReferences") or [] if ref.get("controller")}
    return any(ref.get("uid") not in observed_owners for ref in desired_meta.get("ownerReferences") or [])
