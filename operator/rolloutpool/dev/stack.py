"""The whole product on one machine: control plane, process kubelet, Prometheus and the Helm chart.

``LocalStack`` is what the demo and the full-stack e2e tests run: a real kube-apiserver
(``LocalCluster``), our process kubelet (pods of our image run as local processes, each on
its own 127.0.0.x, with their ServiceAccount's token), Debian's Prometheus discovering the
pods through ``kubernetes_sd_configs``, and ``helm install`` of ``charts/rolloutpool`` so the
operator runs as a pod under the chart's RBAC. Everything started is stopped on exit, in
reverse order, even when a step fails.

By default the pods of our image run from this checkout (fast, no build). With ``image=`` (a
build of :mod:`rolloutpool.dev.image`) the chart is installed as on a cluster with
``--set image.repository=... --set image.tag=...`` naming that build, and the kubelet runs
every pod of it from the image's root filesystem, as its non-root user on a read-only root.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from rolloutpool.api.pods import is_ready
from rolloutpool.dev.image.build import BuiltImage
from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.localcluster.prometheus import PrometheusServer, local_cluster_prometheus

__all__ = ["TRANSIENT_ERRORS", "LocalStack", "chart_dir"]

Log = Callable[[str], None]


def chart_dir() -> Path:
    """The checkout's ``charts/rolloutpool`` (the stack runs from a checkout)."""
    path = Path(__file__).resolve().parents[3] / "charts" / "rolloutpool"
    if not (path / "Chart.yaml").is_file():
        raise FileNotFoundError(f"Helm chart not found at {path}; run from a RolloutPool checkout")
    return path


TRANSIENT_ERRORS: tuple[type[Exception], ...] = (RuntimeError, subprocess.SubprocessError, ValueError, KeyError)
"""What a check against the stack may raise while it comes up (kubectl failing, an object half written);
``wait_until(..., ignore=TRANSIENT_ERRORS)`` counts them as \"not yet\"."""


class LocalStack:
    """Control plane + process kubelet + Prometheus + the chart; a context manager that always cleans up."""

    def __init__(
        self,
        directory: Path,
        *,
        log: Log = print,
        release: str = "rolloutpool",
        namespace: str = "rolloutpool-system",
        scrape_interval_seconds: float = 2.0,
        pod_subnet: str | None = None,
        helm_timeout: str = "180s",
        image: BuiltImage | None = None,
    ) -> None:
        self.directory = directory
        self.log = log
        self.release = release
        self.namespace = namespace
        self.scrape_interval_seconds = scrape_interval_seconds
        self.helm_timeout = helm_timeout
        self.image = image
        # every pod of ours binds fixed ports on its own 127.x.y.z: a random /24 per stack lets two
        # stacks (a test run and the demo, say) share the machine
        subnet = pod_subnet or f"127.{secrets.randbelow(150) + 100}.{secrets.randbelow(256)}.0/24"
        images = {image.reference: image.directory} if image is not None else {}
        self.cluster = LocalCluster(
            directory / "cluster", log=log, kubelet=True, pod_subnet=subnet, kubelet_images=images
        )
        self.prometheus: PrometheusServer | None = None
        self._stack = contextlib.ExitStack()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> LocalStack:
        """Start every part and install the chart; on any failure stop what already runs."""
        try:
            self._stack.enter_context(self.cluster)
            self.prometheus = self._stack.enter_context(
                local_cluster_prometheus(self.cluster, scrape_interval_seconds=self.scrape_interval_seconds)
            )
            self.log(f"Started Prometheus url={self.prometheus.url}")
            self._stack.callback(self._uninstall_quietly)
            self.install_chart()
        except BaseException:
            self._stack.close()
            raise
        return self

    def stop(self) -> None:
        """Stop everything started, newest first; safe twice."""
        self._stack.close()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- helpers ------------------------------------------------------------------------

    @property
    def prometheus_url(self) -> str:
        """URL of the running Prometheus."""
        if self.prometheus is None:
            raise RuntimeError("the stack has not been started")
        return self.prometheus.url

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run helm against the cluster; with ``check`` a failure raises with helm's stderr."""
        result = subprocess.run(
            [str(self.cluster.binaries.helm), *args],
            env=dict(
                self.cluster.env(),
                HELM_CACHE_HOME=str(self.directory / "helm-cache"),
                HELM_CONFIG_HOME=str(self.directory / "helm-config"),
                HELM_DATA_HOME=str(self.directory / "helm-data"),
            ),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def install_chart(self) -> None:
        """``helm install`` the chart and wait until the operator pod is ready."""
        image = [] if self.image is None else ["--set", f"image.repository={self.image.repository}"]
        image += [] if self.image is None else ["--set", f"image.tag={self.image.tag}"]
        self.log(f"Installing chart release={self.release} namespace={self.namespace} {' '.join(image[1::2])}")
        self.helm(
            "install",
            self.release,
            str(chart_dir()),
            "--namespace",
            self.namespace,
            "--create-namespace",
            *image,
            "--wait",
            "--timeout",
            self.helm_timeout,
        )
        self.log("Installed chart; operator pod ready")

    def _uninstall_quietly(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
            self.helm(
                "uninstall",
                self.release,
                "--namespace",
                self.namespace,
                "--wait",
                "--timeout",
                "60s",
                check=False,
                timeout=90,
            )

    def get_json(self, *args: str) -> Any:
        """``kubectl get ... -o json`` parsed."""
        return json.loads(self.cluster.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, manifest: str, *, namespace: str = "default") -> str:
        """``kubectl apply`` a manifest given as text."""
        return self.cluster.kubectl("apply", "-n", namespace, "-f", "-", input_text=manifest).stdout.strip()

    def router_url(self, pool: str, *, namespace: str = "default") -> str | None:
        """``http://<ip>:<port>`` of a ready pod behind the pool's router Service, or None.

        Resolved the way kube-proxy would route: the Service's selector and target port,
        over its ready pods. (The EndpointSlice controller cannot help here: the API server
        refuses loopback addresses in EndpointSlices, and our pods live on 127.0.0.x.)
        """
        service = self.get_json("service", f"{pool}-router", "-n", namespace)
        selector = ",".join(f"{k}={v}" for k, v in (service["spec"].get("selector") or {}).items())
        target = (service["spec"].get("ports") or [{}])[0].get("targetPort")
        for pod in self.get_json("pods", "-n", namespace, "-l", selector).get("items", []):
            status = pod.get("status") or {}
            if not is_ready(pod) or not status.get("podIP"):
                continue
            ports = [p for c in pod["spec"]["containers"] for p in c.get("ports") or []]
            port = (
                target
                if isinstance(target, int)
                else next((p["containerPort"] for p in ports if p.get("name") == target), None)
            )
            if port:
                return f"http://{status['podIP']}:{port}"
        return None

    def pool(self, name: str, *, namespace: str = "default") -> dict[str, Any]:
        """The RolloutPool object."""
        result: dict[str, Any] = self.get_json("rolloutpool", name, "-n", namespace)
        return result

    def condition(self, name: str, kind: str, *, namespace: str = "default") -> dict[str, Any] | None:
        """One condition of a pool's status, or None."""
        conditions = (self.pool(name, namespace=namespace).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == kind), None)

    def logs(self) -> Iterator[Path]:
        """Every log file of the stack: control plane, Prometheus, pods."""
        for pattern in ("cluster/logs/*.log", "cluster/kubelet/**/logs/*.log"):
            yield from sorted(self.directory.glob(pattern))
