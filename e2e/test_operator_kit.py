"""Helpers of the operator's e2e tests (this module holds no tests).

The operator runs as a real process (``rolloutpool operator``) against the session's real
control plane. No kubelet runs yet, so pods stay Pending: :func:`play_kubelet` fakes the
kubelet's part by writing a pod's status (phase, IP, Ready condition) through the status
subresource, as a kubelet would. That is a stand-in until the process kubelet lands.
A router is faked the same way: :class:`FakeRouter` serves the router's ``/metrics``
(live sessions per replica) on a loopback address that a router pod is given as its IP.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.net import free_port
from rolloutpool.dev.wait import wait_until
from rolloutpool.kube.pods import api_client

__all__ = [
    "EXAMPLES",
    "FakeRouter",
    "OperatorProcess",
    "api",
    "apply_pool",
    "child_pods",
    "condition",
    "dumps",
    "namespace",
    "play_kubelet",
    "pool_status",
]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@contextmanager
def namespace(cluster: LocalCluster, name: str) -> Iterator[str]:
    """A fresh namespace, deleted afterwards (without waiting for its contents to go)."""
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


class OperatorProcess:
    """``rolloutpool operator`` as a child process; :meth:`stop` always ends it."""

    def __init__(self, cluster: LocalCluster, namespace: str, log_path: Path, kubeconfig: Path | None = None) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.log_path = log_path
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        """Start the operator and wait until its liveness endpoint answers."""
        exe = Path(sys.executable).with_name("rolloutpool")
        argv = [str(exe), "operator", "--kubeconfig", str(self.kubeconfig), "--namespace", self.namespace]
        argv += ["--liveness-host", "127.0.0.1", "--liveness-port", str(self.port), "--status-interval", "1"]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        wait_until(self._live, what="operator liveness", timeout=60, interval=0.1)
        return self

    def _live(self) -> bool:
        import urllib.request  # noqa: PLC0415

        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(f"operator exited with {self._proc.returncode}:\n{self.logs()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 20 s; returns the exit code."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        code = self._proc.returncode
        self._proc = None
        return code

    def logs(self) -> str:
        """Everything the operator printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        code = self.stop()
        if exc[0] is not None:
            print(f"--- operator log (exit {code}) ---\n{self.logs()}")


class FakeRouter:
    """The router's ``/metrics`` with settable live sessions, on ``ip``:8080 (a loopback address)."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.live: dict[str, int] = {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                lines = ["# TYPE rolloutpool_router_live_sessions gauge"]
                lines += [f'rolloutpool_router_live_sessions{{replica="{r}"}} {n}' for r, n in owner.live.items()]
                lines += ["# TYPE rolloutpool_router_queue_depth gauge", "rolloutpool_router_queue_depth 0", ""]
                body = "\n".join(lines).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((ip, 8080), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-router", daemon=True)

    def __enter__(self) -> FakeRouter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def api(cluster: LocalCluster) -> client.ApiClient:
    """A kubernetes client of the cluster (the caller closes it)."""
    return api_client(str(cluster.kubeconfig))


def apply_pool(cluster: LocalCluster, ns: str, manifest: dict[str, Any] | Path) -> dict[str, Any]:
    """Apply a RolloutPool manifest (a dict or an example file) into ``ns``; returns the manifest."""
    body = yaml.safe_load(manifest.read_text()) if isinstance(manifest, Path) else manifest
    cluster.kubectl("apply", "-n", ns, "-f", "-", input_text=yaml.safe_dump(body))
    return body


def child_pods(core: client.CoreV1Api, ns: str, pool: str, component: str = "engine") -> dict[str, dict[str, Any]]:
    """The pool's pods of one component by name, not counting those being deleted."""
    selector = f"rolloutpool.io/pool={pool},rolloutpool.io/component={component}"
    listing = core.api_client.sanitize_for_serialization(core.list_namespaced_pod(ns, label_selector=selector))
    pods = listing.get("items") or []
    return {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}


def play_kubelet(core: client.CoreV1Api, ns: str, name: str, *, ip: str, ready: bool = True) -> None:
    """Write a pod's status as a kubelet would: Running, an IP, the Ready condition (faked kubelet)."""
    status = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    core.patch_namespaced_pod_status(name, ns, {"status": status}, _content_type="application/merge-patch+json")


def pool_status(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    """The pool's status (empty until the operator writes one)."""
    pool: Any = custom.get_namespaced_custom_object("rolloutpool.io", "v1alpha1", ns, "rolloutpools", name)
    status: dict[str, Any] = pool.get("status") or {}
    return status


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    """One condition of a status, or an empty dict."""
    found: dict[str, Any] = next((c for c in status.get("conditions") or [] if c["type"] == type_), {})
    return found


def dumps(obj: Any) -> str:
    """Compact JSON for assertion messages."""
    return json.dumps(obj, sort_keys=True, default=str)[:2000]
