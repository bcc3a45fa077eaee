"""A real Prometheus (Debian's ``prometheus`` package) on loopback, for tests and the demo.

``PrometheusServer`` runs ``/usr/bin/prometheus`` on a free 127.0.0.1 port with a temporary
data directory and a generated configuration, waits for ``/-/ready``, and stops it (process
group, SIGTERM then SIGKILL; ``PR_SET_PDEATHSIG`` so it dies with the Python process).
``restart`` keeps the port and the data, so fault tests can stop and start it.

The configuration builders are pure: :func:`static_scrape_config` scrapes fixed addresses
with extra labels, :func:`kubernetes_pods_scrape_config` discovers pods through the API
server and keeps the annotated ones, labelled ``namespace``, ``pod`` and
``rolloutpool_io_pool`` as ``docs/interfaces`` agree.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from rolloutpool.localcluster.cluster import LocalCluster, _die_with_parent, _stop_group, free_port

__all__ = [
    "DEFAULT_BINARY",
    "PrometheusServer",
    "StaticTarget",
    "find_prometheus",
    "kubernetes_pods_scrape_config",
    "local_cluster_scrape_config",
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
    Authenticates with a client certificate or a bearer token file.
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
    relabel = [
        {"source_labels": [f"{_ANNOTATION}scrape"], "action": "keep", "regex": "true"},
        {
            "source_labels": [f"{_ANNOTATION}path"],
            "action": "replace",
            "regex": "(.+)",
            "target_label": "__metrics_path__",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_ip", f"{_ANNOTATION}port"],
            "action": "replace",
            "regex": r"(.+);(\d+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "action": "replace", "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "action": "replace", "target_label": "pod"},
        {"source_labels": [_POOL_LABEL], "action": "replace", "target_label": "rolloutpool_io_pool"},
    ]
    return {
        "global": _global(scrape_interval_seconds),
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": "/metrics",
                "kubernetes_sd_configs": [sd],
                "relabel_configs": relabel,
            }
        ],
    }


def local_cluster_scrape_config(
    cluster: LocalCluster, *, namespaces: Sequence[str] = (), scrape_interval_seconds: float = 15.0
) -> dict[str, Any]:
    """:func:`kubernetes_pods_scrape_config` against a running :class:`LocalCluster`, as its admin."""
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


class PrometheusServer:
    """Prometheus on ``127.0.0.1:<free port>`` with ``config``; a context manager that always stops it.

    Without ``directory`` a temporary one holds the configuration, the TSDB and the log, and
    is removed on :meth:`stop`.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        directory: Path | None = None,
        binary: Path | None = None,
        port: int | None = None,
        ready_timeout: float = 60.0,
    ) -> None:
        self.config = dict(config)
        self.binary = binary
        self.port = port or 0
        self.ready_timeout = ready_timeout
        self._given_directory = directory
        self._directory: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the HTTP API (``http://127.0.0.1:<port>``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def directory(self) -> Path:
        """Configuration, data and log of the running server."""
        if self._directory is None:
            raise RuntimeError("Prometheus has not been started")
        return self._directory

    @property
    def pid(self) -> int | None:
        """Pid (and process-group id) of the running process, if any."""
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> PrometheusServer:
        """Write the configuration, start the process, wait until ``/-/ready`` answers 200."""
        binary = self.binary or find_prometheus()
        if self._directory is None:
            if self._given_directory is not None:
                self._given_directory.mkdir(parents=True, exist_ok=True)
                self._directory = self._given_directory
            else:
                self._directory = Path(tempfile.mkdtemp(prefix="rolloutpool-prometheus-"))
        if not self.port:
            self.port = free_port()
        config_file = self.directory / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(self.config, sort_keys=False))
        with (self.directory / "prometheus.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    str(binary),
                    f"--config.file={config_file}",
                    f"--storage.tsdb.path={self.directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1d",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, no locks
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, *, keep_data: bool = False) -> None:
        """Stop the process group (SIGTERM, then SIGKILL); idempotent.

        Removes a temporary directory unless ``keep_data`` (what :meth:`restart` uses).
        """
        if self._proc is not None:
            _stop_group(self._proc.pid, grace=10.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None
        if not keep_data and self._directory is not None and self._given_directory is None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def restart(self) -> PrometheusServer:
        """Stop and start again on the same port with the same data."""
        self.stop(keep_data=True)
        return self.start()

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def api(self, path: str, *, timeout: float = 5.0) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data`` (e.g. ``targets?state=active``)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=timeout) as resp:  # noqa: S310 - our http URL
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus API {path} failed: {body}")
        return body["data"]

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log."""
        with contextlib.suppress(OSError, RuntimeError):
            return (self.directory / "prometheus.log").read_text(errors="replace")[-chars:]
        return ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise RuntimeError(f"prometheus exited with code {code}; log tail:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:  # noqa: S310 - our http URL
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready after {self.ready_timeout:.0f}s: {last}")
