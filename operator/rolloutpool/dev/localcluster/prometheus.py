"""A real Prometheus (Debian's ``prometheus`` package) on loopback, for tests and the demo.

``PrometheusServer`` runs ``/usr/bin/prometheus`` on a free 127.0.0.1 port with a temporary
data directory and a generated configuration, waits for ``/-/ready``, and stops it (process
group, SIGTERM then SIGKILL; ``PR_SET_PDEATHSIG`` so it dies with the Python process).
``restart`` keeps the port and the data, so fault tests can stop and start it.

What it scrapes (configuration builders, the pod-discovery bridge) is in
``prometheus_discovery``; its names are re-exported here.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.localcluster.prometheus_discovery import (
    DEFAULT_BINARY,
    PodDiscoveryBridge,
    StaticTarget,
    find_prometheus,
    http_sd_pods_scrape_config,
    kubernetes_pods_scrape_config,
    kubernetes_sd_available,
    local_cluster_scrape_config,
    pod_targets,
    static_scrape_config,
)
from rolloutpool.dev.net import free_port
from rolloutpool.dev.processes import start_group, stop_group

__all__ = [
    "DEFAULT_BINARY",
    "PodDiscoveryBridge",
    "PrometheusServer",
    "StaticTarget",
    "find_prometheus",
    "http_sd_pods_scrape_config",
    "kubernetes_pods_scrape_config",
    "kubernetes_sd_available",
    "local_cluster_prometheus",
    "local_cluster_scrape_config",
    "pod_targets",
    "static_scrape_config",
]


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
        self._proc = start_group(
            [
                str(binary),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
            ],
            log=self.directory / "prometheus.log",
            append=True,
            die_with_parent=signal.SIGTERM,
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
            stop_group(self._proc.pid, grace=10.0, popen=self._proc)
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


@contextlib.contextmanager
def local_cluster_prometheus(
    cluster: LocalCluster,
    *,
    namespaces: Sequence[str] = (),
    scrape_interval_seconds: float = 1.0,
    binary: Path | None = None,
) -> Iterator[PrometheusServer]:
    """A running Prometheus scraping the annotated pods of ``cluster``; everything stopped on exit.

    Uses kubernetes_sd when the binary has it, otherwise a :class:`PodDiscoveryBridge`.
    """
    with contextlib.ExitStack() as stack:
        bridge = None
        if not kubernetes_sd_available(binary):
            bridge = stack.enter_context(PodDiscoveryBridge(cluster, namespaces=namespaces))
        config = local_cluster_scrape_config(
            cluster, namespaces=namespaces, scrape_interval_seconds=scrape_interval_seconds, bridge=bridge
        )
        yield stack.enter_context(PrometheusServer(config, binary=binary))
