"""The node side of the process kubelet: the Node object, its Lease heartbeat, and binding pods to it.

:func:`node_manifest` builds the Node (capacity with ``nvidia.com/gpu``, a Ready
condition, addresses); :class:`NodeAgent` registers it, renews its Lease in
``kube-node-lease`` and refreshes the Ready heartbeat, and :meth:`NodeAgent.schedule`
binds pending pods that fit through the Binding subresource (acting as the
scheduler of this one-node cluster). Everything here runs on the kubelet's thread.
"""

from __future__ import annotations

import datetime
import json
import logging
import platform
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rolloutpool.dev.kubelet.decide import schedule_fit
from rolloutpool.dev.kubelet.status import rfc3339

__all__ = ["KUBELET_VERSION", "NodeAgent", "call", "node_manifest"]

_log = logging.getLogger(__name__)
KUBELET_VERSION = "v1.35.4-rolloutpool"
_TERMINAL = {"Succeeded", "Failed"}


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a kubernetes client method and return the JSON body as plain dicts (camelCase keys)."""
    resp = fn(*args, _preload_content=False, **kwargs)
    data = resp.data
    return json.loads(data) if data else None


def _micro(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_manifest(
    *,
    name: str,
    host_ip: str,
    capacity: Mapping[str, str],
    labels: Mapping[str, str],
    taints: Sequence[Mapping[str, str]],
    now: float,
) -> dict[str, Any]:
    """The Node object (status included) this kubelet registers; pure."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    stamp = rfc3339(now)

    def condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": "True" if ok else "False",
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }

    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch,
                "rolloutpool.io/process-kubelet": "true",
                **labels,
            },
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {
            "capacity": dict(capacity),
            "allocatable": dict(capacity),
            "conditions": [
                condition("MemoryPressure", False, "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
                condition("DiskPressure", False, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", False, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", True, "KubeletReady", "process kubelet is posting ready status"),
            ],
            "addresses": [{"type": "InternalIP", "address": host_ip}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
                "kernelVersion": platform.release(),
                "osImage": "rolloutpool process kubelet",
                "containerRuntimeVersion": "process://rolloutpool",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": arch,
            },
        },
    }


class NodeAgent:
    """Registers the Node, keeps its Lease and Ready heartbeat fresh, binds pending pods to it."""

    def __init__(
        self, api: client.ApiClient, *, manifest: Mapping[str, Any], lease_seconds: int = 40, scheduler: str = ""
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.manifest = dict(manifest)
        self.name = str(manifest["metadata"]["name"])
        self.lease_seconds = lease_seconds
        self.scheduler = scheduler or "default-scheduler"
        self.node: dict[str, Any] = dict(manifest)
        self._unschedulable: dict[str, str] = {}

    def register(self, *, now: float) -> None:
        """Create the Node (or take over an existing one of the same name) and post its status."""
        body = {k: v for k, v in self.manifest.items() if k != "status"}
        try:
            call(self.core.create_node, body)
            _log.info("Registered node name=%s", self.name)
        except ApiException as err:
            if err.status != 409:
                raise
        # our taints only: admission adds node.kubernetes.io/not-ready, which no node controller lifts here
        patch = {"metadata": {"labels": body["metadata"]["labels"]}, "spec": {"taints": body["spec"].get("taints", [])}}
        call(self.core.patch_node, self.name, patch)
        self.node = call(self.core.patch_node_status, self.name, {"status": self.manifest["status"]})
        self.renew(now=now)

    def renew(self, *, now: float) -> None:
        """Renew the node Lease (kube-node-lease) and the Ready condition's heartbeat."""
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": self.name, "leaseDurationSeconds": self.lease_seconds, "renewTime": _micro(now)},
        }
        try:
            call(self.coordination.patch_namespaced_lease, self.name, "kube-node-lease", {"spec": lease["spec"]})
        except ApiException as err:
            if err.status != 404:
                raise
            uid = (self.node.get("metadata") or {}).get("uid")
            if uid:
                owner = {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": uid}
                lease["metadata"]["ownerReferences"] = [owner]  # type: ignore[index]
            call(self.coordination.create_namespaced_lease, "kube-node-lease", lease)
        stamp = rfc3339(now)
        conditions = [
            {**c, "lastHeartbeatTime": stamp} for c in (self.node.get("status") or {}).get("conditions") or []
        ]
        self.node = call(self.core.patch_node_status, self.name, {"status": {"conditions": conditions}})

    def not_ready(self, *, now: float) -> None:
        """Report the node NotReady (the kubelet stopped; its pods' processes are gone)."""
        stamp = rfc3339(now)
        conditions = [
            {**c, "status": "False", "reason": "KubeletStopped", "message": "process kubelet stopped"}
            | {"lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
            if c.get("type") == "Ready"
            else c
            for c in (self.node.get("status") or {}).get("conditions") or []
        ]
        self.node = call(self.core.patch_node_status, self.name, {"status": {"conditions": conditions}})

    def schedule(self, pods: Sequence[Mapping[str, Any]]) -> list[str]:
        """Bind every pending, unbound pod that fits; mark the rest PodScheduled=False. Returns bound keys."""
        bound = [
            p
            for p in pods
            if (p.get("spec") or {}).get("nodeName") == self.name
            and (p.get("status") or {}).get("phase") not in _TERMINAL
        ]
        done: list[str] = []
        for pod in pods:
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            if spec.get("nodeName") or meta.get("deletionTimestamp"):
                continue
            if spec.get("schedulerName", "default-scheduler") != self.scheduler:
                continue
            if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
                continue
            key = f"{meta['namespace']}/{meta['name']}"
            reason = schedule_fit(pod=pod, node=self.node, bound=bound)
            if reason is None:
                self._bind(meta)
                bound.append(pod)
                done.append(key)
            else:
                self._mark_unschedulable(pod, f"0/1 nodes are available: 1 {reason}.")
        return done

    def _bind(self, meta: Mapping[str, Any]) -> None:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.name},
        }
        try:
            call(self.core.create_namespaced_binding, meta["namespace"], binding)
            _log.info("Bound pod=%s/%s node=%s", meta["namespace"], meta["name"], self.name)
        except ApiException as err:  # already bound or gone: the next listing tells
            _log.info("Binding failed pod=%s/%s status=%s", meta["namespace"], meta["name"], err.status)

    def _mark_unschedulable(self, pod: Mapping[str, Any], message: str) -> None:
        meta = pod["metadata"]
        current = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}.get("PodScheduled")
        if current and current.get("status") == "False" and current.get("message") == message:
            return
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": rfc3339(datetime.datetime.now(datetime.UTC).timestamp()),
        }
        _log.info("Pod unschedulable pod=%s/%s message=%r", meta["namespace"], meta["name"], message)
        with_status = {"status": {"conditions": [condition]}}
        try:
            call(self.core.patch_namespaced_pod_status, meta["name"], meta["namespace"], with_status)
        except ApiException as err:
            _log.info("Status patch failed pod=%s/%s status=%s", meta["namespace"], meta["name"], err.status)
