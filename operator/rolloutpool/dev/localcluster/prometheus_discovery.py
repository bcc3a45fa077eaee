"""Where Prometheus finds what to scrape: pure configuration builders and the pod-discovery bridge.

:func:`static_scrape_config` scrapes fixed addresses with extra labels;
:func:`kubernetes_pods_scrape_config` discovers pods through the API server and keeps the
annotated ones, labelled ``namespace``, ``pod`` and ``rolloutpool_io_pool``. Debian builds
Prometheus without kubernetes_sd, so :class:`PodDiscoveryBridge` serves the API server's pods
over HTTP SD with kubernetes_sd's meta labels, and :func:`http_sd_pods_scrape_config` applies
the same relabelling to them.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import shutil
import ssl
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from rolloutpool.dev.localcluster.cluster import LocalCluster

__all__ = [
    "DEFAULT_BINARY",
    "PodDiscoveryBridge",
    "StaticTarget",
    "find_prometheus",
    "http_sd_pods_scrape_config",
    "kubernetes_pods_scrape_config",
    "kubernetes_sd_available",
    "local_cluster_scrape_config",
    "pod_targets",
    "static_scrape_config",
]

DEFAULT_BINARY = Path("/usr/bin/prometheus")
_POOL_LABEL = "__meta_kubernetes_pod_label_rolloutpool_io_pool"
_ANNOTATION = "__meta_kubernetes_pod_annotation_prometheus_io_"


def find_prometheus() -> Path:
    """``/usr/bin/prometheus``, else ``prometheus`` on PATH; ``FileNotFoundError`` saying how to get it."""
    if DEFAULT_BINARY.exists():
        return DEFAULT_BINARY
    found = shutil.which("prometheus")
    if found:
        return Path(found)
    raise FileNotFoundError("prometheus is not installed: run `bash .ci/dev setup` (Debian package `prometheus`)")


def _duration(seconds: float) -> str:
    millis = max(1, round(seconds * 1000))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def _global(scrape_interval_seconds: float) -> dict[str, Any]:
    interval = _duration(scrape_interval_seconds)
    return {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval}


@dataclass(frozen=True)
class StaticTarget:
    """One ``host:port`` to scrape and the labels its series get (e.g. ``namespace``, ``pod``)."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)


def static_scrape_config(
    targets: Sequence[StaticTarget],
    *,
    scrape_interval_seconds: float = 15.0,
    job: str = "rolloutpool",
    metrics_path: str = "/metrics",
) -> dict[str, Any]:
    """A whole Prometheus configuration scraping fixed targets, each with its own labels (pure)."""
    return {
        "global": _global(scrape_interval_seconds),
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": metrics_path,
                "static_configs": [{"targets": [t.address], "labels": dict(t.labels)} for t in targets],
            }
        ],
    }


def _pod_relabel() -> list[dict[str, Any]]:
    """Relabelling of discovered pods: keep the annotated, address and path from the annotations."""
    return [
        {"source_labels": [f"{_ANNOTATION}scrape"], "action": "keep", "regex": "true"},
        {"source_labels": [f"{_ANNOTATION}path"], "regex": "(.+)", "target_label": "__metrics_path__"},
        {
            "source_labels": ["__meta_kubernetes_pod_ip", f"{_ANNOTATION}port"],
            "regex": r"(.+);(\d+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": [_POOL_LABEL], "target_label": "rolloutpool_io_pool"},
    ]


def _pod_job(job: str, discovery: dict[str, Any], scrape_interval_seconds: float) -> dict[str, Any]:
    scrape = {"job_name": job, "metrics_path": "/metrics", **discovery, "relabel_configs": _pod_relabel()}
    return {"global": _global(scrape_interval_seconds), "scrape_configs": [scrape]}


def kubernetes_pods_scrape_config(
    *,
    api_server: str,
    ca_file: Path,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    bearer_token_file: Path | None = None,
    namespaces: Sequence[str] = (),
    scrape_interval_seconds: float = 15.0,
    job: str = "kubernetes-pods",
) -> dict[str, Any]:
    """A whole Prometheus configuration discovering pods (role ``pod``) through ``api_server`` (pure).

    Keeps pods annotated ``prometheus.io/scrape: "true"``, scrapes ``<pod IP>:<prometheus.io/port>``
    at ``prometheus.io/path`` (default ``/metrics``), and labels every series ``namespace``,
    ``pod`` and ``rolloutpool_io_pool`` (from the pod's ``rolloutpool.io/pool`` label).
    Authenticates with a client certificate or a bearer token file. Needs a Prometheus built
    with kubernetes_sd (Debian's is not: see :class:`PodDiscoveryBridge`).
    """
    if (cert_file is None) != (key_file is None):
        raise ValueError("cert_file and key_file go together")
    if cert_file is None and bearer_token_file is None:
        raise ValueError("give a client certificate and key or a bearer token file")
    tls: dict[str, str] = {"ca_file": str(ca_file)}
    if cert_file is not None and key_file is not None:
        tls |= {"cert_file": str(cert_file), "key_file": str(key_file)}
    sd: dict[str, Any] = {"role": "pod", "api_server": api_server, "tls_config": tls}
    if bearer_token_file is not None:
        sd["authorization"] = {"type": "Bearer", "credentials_file": str(bearer_token_file)}
    if namespaces:
        sd["namespaces"] = {"names": list(namespaces)}
    return _pod_job(job, {"kubernetes_sd_configs": [sd]}, scrape_interval_seconds)


def http_sd_pods_scrape_config(
    *,
    url: str,
    refresh_interval_seconds: float = 5.0,
    scrape_interval_seconds: float = 15.0,
    job: str = "kubernetes-pods",
) -> dict[str, Any]:
    """The same pod scraping and labels as :func:`kubernetes_pods_scrape_config`, from an HTTP SD
    endpoint serving kubernetes_sd's meta labels (a :class:`PodDiscoveryBridge`) (pure)."""
    sd = {"url": url, "refresh_interval": _duration(refresh_interval_seconds)}
    return _pod_job(job, {"http_sd_configs": [sd]}, scrape_interval_seconds)


def _label_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(pods: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """HTTP SD target groups of pods with the meta labels kubernetes_sd's pod role gives (pure).

    One target per declared container port (``<pod IP>:<port>``), or the bare pod IP when no
    port is declared; pods without an IP yet are left out, as kubernetes_sd leaves them.
    """
    groups: list[dict[str, Any]] = []
    for pod in pods:
        meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
        ip = status.get("podIP")
        if not ip:
            continue
        labels = {
            "__meta_kubernetes_namespace": meta.get("namespace", ""),
            "__meta_kubernetes_pod_name": meta.get("name", ""),
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
            "__meta_kubernetes_pod_uid": meta.get("uid", ""),
        }
        for kind, values in (("label", meta.get("labels") or {}), ("annotation", meta.get("annotations") or {})):
            for key, value in values.items():
                labels[f"__meta_kubernetes_pod_{kind}_{_label_name(key)}"] = value
                labels[f"__meta_kubernetes_pod_{kind}present_{_label_name(key)}"] = "true"
        host = f"[{ip}]" if ":" in ip else ip
        ports = [
            (container.get("name", ""), port)
            for container in spec.get("containers") or []
            for port in container.get("ports") or []
            if port.get("containerPort")
        ]
        for container, port in ports:
            groups.append(
                {
                    "targets": [f"{host}:{port['containerPort']}"],
                    "labels": labels
                    | {
                        "__meta_kubernetes_pod_container_name": container,
                        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    },
                }
            )
        if not ports:
            groups.append({"targets": [host], "labels": labels})
    return groups


class PodDiscoveryBridge:
    """Serves the API server's pods as HTTP SD targets with kubernetes_sd's meta labels.

    Debian's ``prometheus`` is built without kubernetes_sd; with this bridge on loopback and
    :func:`http_sd_pods_scrape_config` it still discovers pods from the real API server and
    relabels them exactly as :func:`kubernetes_pods_scrape_config` would. Pods are listed
    (as the cluster's admin) on every Prometheus refresh; a failed listing answers 503 and
    Prometheus keeps its previous targets.
    """

    def __init__(self, cluster: LocalCluster, *, namespaces: Sequence[str] = ()) -> None:
        pki = cluster.pki
        if pki is None:
            raise RuntimeError("the cluster has not been started")
        self._context = ssl.create_default_context(cafile=str(pki.ca_cert))
        self._context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        paths = [f"/api/v1/namespaces/{ns}/pods" for ns in namespaces] or ["/api/v1/pods"]
        self._urls = [f"{cluster.server}{path}" for path in paths]
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The HTTP SD endpoint."""
        if self._server is None:
            raise RuntimeError("the bridge has not been started")
        return f"http://127.0.0.1:{self._server.server_address[1]}/targets"

    def list_targets(self) -> list[dict[str, Any]]:
        """The target groups of every pod, listed now."""
        pods: list[dict[str, Any]] = []
        for url in self._urls:
            with urllib.request.urlopen(url, context=self._context, timeout=10) as resp:  # noqa: S310 - https
                pods.extend(json.load(resp).get("items", []))
        return pod_targets(pods)

    def start(self) -> PodDiscoveryBridge:
        """Serve on a free loopback port in a thread."""
        bridge = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    status, body = 200, json.dumps(bridge.list_targets()).encode()
                except (OSError, ValueError) as err:
                    status, body = 503, json.dumps({"error": str(err)}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = False  # stop() joins the handler threads
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and join the threads; idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> PodDiscoveryBridge:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def kubernetes_sd_available(binary: Path | None = None) -> bool:
    """Whether this Prometheus build accepts ``kubernetes_sd_configs`` (asks its ``promtool``)."""
    prometheus = binary or find_prometheus()
    promtool = prometheus.with_name("promtool")
    if not promtool.exists():
        return False
    config = {"scrape_configs": [{"job_name": "probe", "kubernetes_sd_configs": [{"role": "pod"}]}]}
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "probe.yml"
        path.write_text(yaml.safe_dump(config))
        result = subprocess.run(
            [str(promtool), "check", "config", "--syntax-only", str(path)], capture_output=True, check=False, timeout=30
        )
    return result.returncode == 0


def local_cluster_scrape_config(
    cluster: LocalCluster,
    *,
    namespaces: Sequence[str] = (),
    scrape_interval_seconds: float = 15.0,
    bridge: PodDiscoveryBridge | None = None,
) -> dict[str, Any]:
    """Pod scraping of a running :class:`LocalCluster` as its admin: kubernetes_sd, or through
    ``bridge`` (HTTP SD, refreshed every scrape interval) for a Prometheus without it."""
    if bridge is not None:
        return http_sd_pods_scrape_config(
            url=bridge.url,
            refresh_interval_seconds=scrape_interval_seconds,
            scrape_interval_seconds=scrape_interval_seconds,
        )
    pki = cluster.pki
    if pki is None:
        raise RuntimeError("the cluster has not been started")
    return kubernetes_pods_scrape_config(
        api_server=cluster.server,
        ca_file=pki.ca_cert,
        cert_file=pki.admin_cert,
        key_file=pki.admin_key,
        namespaces=namespaces,
        scrape_interval_seconds=scrape_interval_seconds,
    )
