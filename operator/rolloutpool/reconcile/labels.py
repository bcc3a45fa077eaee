"""Names, labels, selectors and owner references of a RolloutPool's children (pure).

The conventions are agreed in the project's interface notes: every child carries the
``app.kubernetes.io`` labels plus ``rolloutpool.io/pool`` and ``rolloutpool.io/component``;
engine pods also carry ``rolloutpool.io/index`` and are named ``<pool>-engine-<i>``; every
router object is named ``<pool>-router``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from rolloutpool.api.status import API_GROUP, API_VERSION, KIND

__all__ = [
    "ANNOTATION_DRAIN_STARTED",
    "ANNOTATION_SPEC_HASH",
    "DEFAULT_IMAGE",
    "ENGINE_PORT",
    "IMAGE_ENV",
    "LABEL_COMPONENT",
    "LABEL_INDEX",
    "LABEL_INSTANCE",
    "LABEL_MANAGED_BY",
    "LABEL_NAME",
    "LABEL_POOL",
    "MANAGED_BY",
    "MAX_POOL_NAME_LENGTH",
    "ROUTER_PORT",
    "Component",
    "admin_secret_name",
    "draining_from_pods",
    "engine_index",
    "engine_match_labels",
    "engine_pod_name",
    "engine_selector",
    "owner_reference",
    "pool_labels",
    "pool_selector",
    "router_match_labels",
    "router_name",
    "router_selector",
]

Component = Literal["engine", "router"]

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_POOL = "rolloutpool.io/pool"
LABEL_COMPONENT = "rolloutpool.io/component"
LABEL_INDEX = "rolloutpool.io/index"
MANAGED_BY = "rolloutpool-operator"

ANNOTATION_SPEC_HASH = "rolloutpool.io/spec-hash"
"""Hash of the desired child without this annotation; ``needs_update`` compares it."""
ANNOTATION_DRAIN_STARTED = "rolloutpool.io/drain-started"
"""Unix time (decimal string) a drain of an engine pod started; kept on the pod so it survives a restart."""

IMAGE_ENV = "ROLLOUTPOOL_IMAGE"
"""Environment variable of the operator naming the default image of simulated engines and the router."""
DEFAULT_IMAGE = "ghcr.io/rolloutpool/rolloutpool:0.1.0"
"""The operator's default image when ``ROLLOUTPOOL_IMAGE`` is unset."""

ENGINE_PORT = 8000
ROUTER_PORT = 8080
KV_EVENTS_PORT = 5557
"""An engine's KV-event publisher (vLLM ``--kv-events-config`` endpoint, ZMQ PUB)."""
KV_REPLAY_PORT = 5558
"""An engine's KV-event replay socket (ZMQ ROUTER): a router that missed a batch asks for it again."""


KV_EVENTS_CONFIG = (
    '{"enable_kv_cache_events": true, "publisher": "zmq", '
    f'"endpoint": "tcp://*:{KV_EVENTS_PORT}", "replay_endpoint": "tcp://*:{KV_REPLAY_PORT}"}}'
)
"""The ``--kv-events-config`` the operator gives every engine: a vLLM binds the ports on every address of its pod
(a wildcard; vLLM connects to any other endpoint), an engine-sim on the address it serves on (the local stack's pods
share one network namespace); the routers connect to each pod's IP."""


MAX_POOL_NAME_LENGTH = 56
"""``<pool>-router`` names a Service, a DNS-1035 label of at most 63 characters."""

_ENGINE_NAME = re.compile(r"^(?P<pool>.+)-engine-(?P<index>0|[1-9][0-9]*)$")


def engine_pod_name(pool: str, index: int) -> str:
    """Name of the engine pod of replica ``index``: ``<pool>-engine-<index>`` (pure)."""
    if index < 0:
        raise ValueError(f"replica index must be >= 0, got {index}")
    return f"{pool}-engine-{index}"


def router_name(pool: str) -> str:
    """Name of every router object of a pool: ``<pool>-router`` (pure)."""
    return f"{pool}-router"


def admin_secret_name(pool: str) -> str:
    """Name of the Secret holding a pool's router admin token: ``<pool>-router-admin`` (pure)."""
    return f"{pool}-router-admin"


def pool_labels(pool: str, component: Component, index: int | None = None) -> dict[str, str]:
    """Labels of a child object; ``index`` only for engine pods (pure)."""
    labels = {
        LABEL_NAME: "rolloutpool",
        LABEL_INSTANCE: pool,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_POOL: pool,
        LABEL_COMPONENT: component,
    }
    if index is not None:
        labels[LABEL_INDEX] = str(index)
    return labels


def engine_match_labels(pool: str) -> dict[str, str]:
    """Labels selecting the engine pods of a pool (pure)."""
    return {LABEL_POOL: pool, LABEL_COMPONENT: "engine"}


def router_match_labels(pool: str) -> dict[str, str]:
    """Labels selecting the router pods of a pool (a Deployment selector, immutable once created) (pure)."""
    return {LABEL_POOL: pool, LABEL_COMPONENT: "router"}


def _selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in labels.items())


def engine_selector(pool: str) -> str:
    """Label selector string of the engine pods (``status.selector``, the router's discovery) (pure)."""
    return _selector(engine_match_labels(pool))


def router_selector(pool: str) -> str:
    """Label selector string of the router pods (pure)."""
    return _selector(router_match_labels(pool))


def pool_selector(pool: str) -> str:
    """Label selector string of every child of the pool (pure)."""
    return _selector({LABEL_POOL: pool, LABEL_MANAGED_BY: MANAGED_BY})


def owner_reference(pool_obj: Mapping[str, Any]) -> dict[str, Any]:
    """Controller owner reference to the RolloutPool object (pure).

    ``blockOwnerDeletion`` keeps a foreground deletion of the pool waiting for its children.
    Raises ``ValueError`` when the object has no name or uid (not read from the API server).
    """
    meta = pool_obj.get("metadata") or {}
    name, uid = meta.get("name"), meta.get("uid")
    if not name or not uid:
        raise ValueError("the RolloutPool object needs metadata.name and metadata.uid for an owner reference")
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": str(name),
        "uid": str(uid),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def engine_index(pod: Mapping[str, Any]) -> int | None:
    """Replica index of an engine pod from its label, else its name; None when neither parses (pure)."""
    meta = pod.get("metadata") or {}
    label = (meta.get("labels") or {}).get(LABEL_INDEX)
    if isinstance(label, str) and label.isdigit() and (label == "0" or not label.startswith("0")):
        return int(label)
    match = _ENGINE_NAME.match(str(meta.get("name", "")))
    return int(match["index"]) if match else None


def draining_from_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Drain start times kept in the ``rolloutpool.io/drain-started`` annotation of each pod (pure).

    Pods without the annotation, or with one that does not parse as a number, are not draining.
    """
    draining: dict[str, float] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(ANNOTATION_DRAIN_STARTED)
        try:
            started = float(raw) if raw is not None else None
        except (TypeError, ValueError):
            started = None
        if started is not None and math.isfinite(started) and meta.get("name"):
            draining[str(meta["name"])] = started
    return draining
