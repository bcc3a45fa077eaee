"""The process kubelet: a one-node Kubernetes node whose pods of OUR image run as local processes.

``ProcessKubelet`` registers a Node with GPU capacity, binds pending pods to it (it is
also the scheduler of this one-node cluster), runs every container of a pod bound to
it whose image matches (``ghcr.io/rolloutpool/rolloutpool:<any tag>`` by default) as
a local process with the pod's command, args and env (``$(VAR)`` expansion, downward
API, ConfigMap/Secret refs), gives each pod its own loopback address 127.0.0.x (written
to ``status.podIP``), probes readiness/liveness/startup, restarts crashed containers
with exponential back-off, terminates pods gracefully on deletion and then deletes
them, and gives each pod a kubeconfig from a TokenRequest of its ServiceAccount so
RBAC applies as in a cluster. Pods of any other image are set ``Failed`` with reason
``UnsupportedImage``. Images built here (``local_images``, a reference -> a build of
:mod:`rolloutpool.dev.image`) run from their root filesystem instead of this checkout: a chroot
as the pod's user, its volumes mounted, its ``securityContext`` applied (:mod:`.pods`).

All API calls and process handling happen on one background thread (probes on a
small pool). ``stop()`` (or leaving the ``with`` block) stops every process it
started; the processes also die with the kubelet's process (``PR_SET_PDEATHSIG``).

    with LocalCluster(path) as cluster, ProcessKubelet(cluster.kubeconfig, path / "kubelet") as kubelet:
        ...

or as a child of the control plane: ``LocalCluster(path, kubelet=True)``,
``rolloutpool localcluster up --kubelet``, or ``rolloutpool localcluster kubelet --dir D``.
Not done: init containers (ignored, with a warning), ``kubectl logs``/``exec`` (no
kubelet server: read ``<dir>/pods/<ns>_<pod>_<uid8>/logs/<container>.log``), Events,
securityContext of pods run from this checkout (those run from a local image apply it), node
affinity, token refresh (tokens last ``token_seconds``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from rolloutpool.dev.image.build import BuiltImage
from rolloutpool.dev.kubelet.decide import DEFAULT_IMAGE_PATTERN, allocate_ip, image_matches
from rolloutpool.dev.kubelet.node import NodeAgent, call, node_manifest
from rolloutpool.dev.kubelet.pods import PodPreparer, api_target
from rolloutpool.dev.kubelet.runtime import PodRun
from rolloutpool.dev.kubelet.status import pod_status, unsupported_image_status
from rolloutpool.dev.localcluster.vllm_env import VLLM_IMAGE_PATTERN, vllm_executables

__all__ = ["ProcessKubelet", "default_executables"]

_log = logging.getLogger(__name__)
_TERMINAL = {"Succeeded", "Failed"}
_CONFIG_RETRY_SECONDS = 2.0


def default_executables() -> dict[str, str]:
    """argv[0] names the kubelet runs, resolved: ``rolloutpool`` is this virtualenv's command.

    ``vllm`` is the cached CPU build's command when it is installed (``vllm_env``).
    """
    beside = Path(sys.executable).parent / "rolloutpool"
    found = str(beside) if beside.exists() else shutil.which("rolloutpool")
    return ({"rolloutpool": found} if found else {}) | vllm_executables()


class ProcessKubelet:
    """A node of one machine: schedules, runs and reports pods of our image as processes.

    ``kubeconfig`` is an admin kubeconfig of the cluster (the kubelet's own identity;
    pods never see it); ``directory`` holds one directory per pod (its kubeconfig,
    volumes and ``logs/<container>.log``, kept after the pod is gone). The Node
    advertises ``cpu``, ``memory``, ``max_pods`` and ``gpus`` (``nvidia.com/gpu``),
    plus ``node_labels`` and ``taints``. Pods naming ``scheduler_name`` are bound here.
    Pod addresses come from ``pod_subnet`` (a loopback /24, x = 2..254; give a second
    kubelet of the same cluster its own, e.g. 127.0.1.0/24; addresses that pods of other
    nodes hold are skipped anyway).
    ``images`` are regular expressions of the images run as processes; ``executables``
    maps a container's argv[0] to a program (default: ``rolloutpool`` -> this
    virtualenv's command); any other argv[0] fails the container with
    ``CreateContainerConfigError``. ``local_images`` maps an image reference to the folder of a
    build of it (``BuiltImage``): containers of that image run from its root filesystem.
    Crashed containers restart after ``backoff_base``
    seconds, doubling up to ``backoff_cap``. Pods are listed every ``poll_interval``
    seconds; processes and probes are driven every ``tick_interval`` seconds; the
    Lease and Ready heartbeat are renewed every ``renew_interval`` seconds.
    """

    def __init__(
        self,
        kubeconfig: Path,
        directory: Path,
        *,
        node_name: str = "rolloutpool-local",
        gpus: int = 8,
        cpu: str = "64",
        memory: str = "512Gi",
        max_pods: int = 110,
        node_labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
        scheduler_name: str = "default-scheduler",
        images: Sequence[str] = (DEFAULT_IMAGE_PATTERN, VLLM_IMAGE_PATTERN),
        executables: Mapping[str, str] | None = None,
        local_images: Mapping[str, Path] | None = None,
        host_ip: str = "127.0.0.1",
        pod_subnet: str = "127.0.0.0/24",
        backoff_base: float = 10.0,
        backoff_cap: float = 300.0,
        poll_interval: float = 0.5,
        tick_interval: float = 0.1,
        renew_interval: float = 10.0,
        token_seconds: int = 86400,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.directory = directory
        self.node_name = node_name
        self.host_ip = host_ip
        if not (pod_subnet.startswith("127.") and pod_subnet.endswith(".0/24")):
            raise ValueError(f"pod_subnet must be a loopback /24 such as 127.0.1.0/24, not {pod_subnet!r}")
        self.pod_subnet = pod_subnet
        self._ip_prefix = pod_subnet.removesuffix("0/24")
        self.scheduler_name = scheduler_name
        self.local_images = {ref: BuiltImage.load(path) for ref, path in (local_images or {}).items()}
        self.images = (*images, *(re.escape(ref) for ref in self.local_images))
        self.executables = dict(default_executables() if executables is None else executables)
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.poll_interval = poll_interval
        self.tick_interval = tick_interval
        self.renew_interval = renew_interval
        self.token_seconds = token_seconds
        self.log = log
        capacity = {"cpu": cpu, "memory": memory, "pods": str(max_pods), "nvidia.com/gpu": str(gpus)}
        self._manifest = node_manifest(
            name=node_name, host_ip=host_ip, capacity=capacity, labels=dict(node_labels or {}), taints=taints, now=0
        )
        self._manifest["spec"]["podCIDR"] = pod_subnet
        self._manifest["spec"]["podCIDRs"] = [pod_subnet]
        self._runs: dict[str, PodRun] = {}
        self._pods: dict[str, dict[str, Any]] = {}
        self._cluster_ips: set[str] = set()
        self._reported: dict[str, dict[str, Any]] = {}
        self._refused: set[str] = set()
        self._deleted: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._api: client.ApiClient | None = None
        self._executor: ThreadPoolExecutor | None = None

    # -- public -------------------------------------------------------------------------

    def start(self) -> ProcessKubelet:
        """Register the Node and start the loop thread; returns self."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._api = config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]
        target = api_target(self.kubeconfig, self.directory)
        venv_bin = str(Path(sys.executable).parent)
        self._preparer = PodPreparer(
            self._api,
            target=target,
            executables=self.executables,
            token_seconds=self.token_seconds,
            base_path=os.pathsep.join([venv_bin, "/usr/local/bin", "/usr/bin", "/bin"]),
            images=self.local_images,
        )
        self._core = client.CoreV1Api(self._api)
        self._agent = NodeAgent(self._api, manifest=self._manifest, scheduler=self.scheduler_name)
        try:
            self._agent.register(now=time.time())
        except BaseException:
            self._api.close()
            raise
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-probe")
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name=f"kubelet-{self.node_name}", daemon=True)
        self._thread.start()
        self._say(f"Started process kubelet node={self.node_name} dir={self.directory}")
        return self

    def stop(self) -> None:
        """Stop the loop and every process it started (SIGKILL after the loop's SIGTERM); safe twice."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        with self._lock:
            for run in self._runs.values():  # the loop stops them; this covers a loop that died
                run.kill_now()
            self._runs.clear()
        if self._api is not None:
            with contextlib.suppress(Exception):  # best effort: the API server may be gone already
                self._agent.not_ready(now=time.time())
            self._api.close()  # type: ignore[no-untyped-call]
            self._api = None

    def __enter__(self) -> ProcessKubelet:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def pod_directory(self, namespace: str, name: str) -> Path | None:
        """The directory of a running pod (kubeconfig, volumes, logs), or None."""
        with self._lock:
            run = next((r for r in self._runs.values() if r.key == f"{namespace}/{name}"), None)
            return run.directory if run else None

    def log_path(self, namespace: str, name: str, container: str) -> Path | None:
        """The log file (stdout and stderr, all restarts) of a container of a running pod."""
        directory = self.pod_directory(namespace, name)
        return directory / "logs" / f"{container}.log" if directory else None

    def processes(self) -> dict[str, dict[str, int]]:
        """PIDs of the live container processes: ``{"ns/pod": {container: pid}}``."""
        with self._lock:
            return {
                run.key: {c.name: c.proc.pid for c in run.containers if c.proc is not None}
                for run in self._runs.values()
            }

    # -- loop ---------------------------------------------------------------------------

    def _say(self, message: str) -> None:
        _log.info(message)
        if self.log is not None:
            self.log(message)

    def _loop(self) -> None:
        next_poll = next_renew = 0.0
        try:
            while not self._stopping.is_set():
                now = time.time()
                try:
                    if now >= next_renew:
                        self._agent.renew(now=now)
                        next_renew = now + self.renew_interval
                    if now >= next_poll:
                        bound_some = self._poll(now)  # something bound: look again at once
                        next_poll = now if bound_some else now + self.poll_interval
                    self._drive(time.time())
                except Exception:
                    _log.exception("Kubelet pass failed node=%s", self.node_name)
                self._stopping.wait(self.tick_interval)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            runs = list(self._runs.values())
        now = time.time()
        for run in runs:
            run.terminate(now=now, grace_seconds=min(run.grace_seconds, 5.0))
        deadline = now + 6.0
        assert self._executor is not None  # noqa: S101 - set in start()
        while any(r.running() for r in runs) and time.time() < deadline:
            for run in runs:
                run.tick(now=time.time(), executor=self._executor)
            time.sleep(0.05)
        with self._lock:
            for run in runs:
                run.kill_now()
            self._runs.clear()

    def _poll(self, now: float) -> bool:
        pods = call(self._core.list_pod_for_all_namespaces)["items"]
        bound = self._agent.schedule(pods)
        mine = {p["metadata"]["uid"]: p for p in pods if (p.get("spec") or {}).get("nodeName") == self.node_name}
        self._pods = mine
        self._cluster_ips = {
            ip
            for p in pods
            if (ip := (p.get("status") or {}).get("podIP"))
            and (p.get("status") or {}).get("phase") not in _TERMINAL
            and (p.get("spec") or {}).get("nodeName") != self.node_name
        }
        for uid, pod in mine.items():
            self._sync_pod(uid, pod, now)
        with self._lock:
            gone = [uid for uid in self._runs if uid not in mine]
        for uid in gone:  # force-deleted: stop its processes promptly
            self._runs[uid].terminate(now=now, grace_seconds=2.0)
            self._deleted.add(uid)
        self._refused &= set(mine)
        self._deleted &= set(mine) | set(self._runs)
        return bool(bound)

    def _sync_pod(self, uid: str, pod: dict[str, Any], now: float) -> None:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        run = self._runs.get(uid)
        if meta.get("deletionTimestamp"):
            grace = float(meta.get("deletionGracePeriodSeconds") or 0)
            if run is not None:
                run.terminate(now=now, grace_seconds=grace)
            elif uid not in self._deleted:
                self._delete(meta)
            return
        if run is not None:
            self._retry_config(run, pod, now)
            return
        if status.get("phase") in _TERMINAL:
            return
        images = [c.get("image", "") for c in [*(spec.get("initContainers") or []), *spec.get("containers", [])]]
        foreign = [i for i in images if not image_matches(i, patterns=self.images)]
        if foreign:
            if uid not in self._refused:
                self._refused.add(uid)
                body = unsupported_image_status(
                    images=foreign,
                    runnable=self.images,
                    host_ip=self.host_ip,
                    previous_conditions=status.get("conditions") or [],
                    now=now,
                )
                self._patch_status(meta, body)
                self._say(f"Refused pod={key} reason=UnsupportedImage images={','.join(foreign)}")
            return
        if spec.get("initContainers"):
            _log.warning("Ignored init containers pod=%s (not supported by the process kubelet)", key)
        with self._lock:
            used = {r.ip for r in self._runs.values()} | self._cluster_ips  # other nodes' pods too
            ip = allocate_ip(used=used, preferred=status.get("podIP"), prefix=self._ip_prefix)
        directory = self.directory / "pods" / f"{meta['namespace']}_{meta['name']}_{uid[:8]}"
        # the downward API and $(POD_IP) see the address this pod is about to get
        containers = self._preparer.containers(self._as_seen(pod, ip), directory=directory)
        run = PodRun(
            uid=uid,
            key=key,
            ip=ip,
            directory=directory,
            restart_policy=spec.get("restartPolicy", "Always"),
            grace_seconds=float(spec.get("terminationGracePeriodSeconds", 30)),
            containers=containers,
            now=now,
            backoff_base=self.backoff_base,
            backoff_cap=self.backoff_cap,
        )
        with self._lock:
            self._runs[uid] = run
        self._say(f"Admitted pod={key} ip={ip} dir={directory}")

    def _as_seen(self, pod: dict[str, Any], ip: str) -> dict[str, Any]:
        """The pod as the downward API and ``$(POD_IP)`` see it: with the address it is about to get."""
        status = pod.get("status") or {}
        return {**pod, "status": {**status, "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": self.host_ip}}

    def _retry_config(self, run: PodRun, pod: dict[str, Any], now: float) -> None:
        """Build again the containers whose config failed (a Secret or ConfigMap may exist now)."""
        broken = [c for c in run.containers if c.launch is None and c.proc is None]
        if not broken or run.terminating_until is not None or now < run.config_retry_at:
            return
        run.config_retry_at = now + _CONFIG_RETRY_SECONDS
        fresh = {c.name: c for c in self._preparer.containers(self._as_seen(pod, run.ip), directory=run.directory)}
        for container in broken:
            again = fresh.get(container.name)
            if again is not None:
                container.launch, container.config_error = again.launch, again.config_error

    def _drive(self, now: float) -> None:
        assert self._executor is not None  # noqa: S101 - set in start()
        for uid, run in list(self._runs.items()):
            run.tick(now=now, executor=self._executor)
            if run.terminating_until is not None:
                if not run.running():
                    self._finish(uid, run)
                continue
            pod = self._pods.get(uid)
            if pod is None:
                continue
            previous = self._reported.get(uid) or pod.get("status") or {}
            body = pod_status(
                pod_uid=uid,
                containers=run.views(),
                pod_ip=run.ip,
                host_ip=self.host_ip,
                start_time=run.start_time,
                previous_conditions=previous.get("conditions") or [],
                now=now,
            )
            if body != self._reported.get(uid):
                self._patch_status(pod["metadata"], body)
                self._reported[uid] = body

    def _finish(self, uid: str, run: PodRun) -> None:
        with self._lock:
            self._runs.pop(uid, None)
        self._reported.pop(uid, None)
        pod = self._pods.get(uid)
        if pod is not None and uid not in self._deleted:
            self._delete(pod["metadata"])
        self._say(f"Stopped pod={run.key} ip={run.ip}")

    def _delete(self, meta: Mapping[str, Any]) -> None:
        self._deleted.add(meta["uid"])
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        with contextlib.suppress(ApiException):
            call(self._core.delete_namespaced_pod, meta["name"], meta["namespace"], body=body)

    def _patch_status(self, meta: Mapping[str, Any], body: Mapping[str, Any]) -> None:
        try:
            call(self._core.patch_namespaced_pod_status, meta["name"], meta["namespace"], {"status": body})
        except ApiException as err:
            if err.status != 404:
                _log.warning("Status patch failed pod=%s/%s status=%s", meta["namespace"], meta["name"], err.status)
