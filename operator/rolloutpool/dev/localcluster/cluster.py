"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager.

Flags follow controller-runtime's envtest (serving certs, a service-account signing
key, RBAC authorization), with the default admission plugins left on so that
ServiceAccount admission and RBAC behave as in a real cluster.

``LocalCluster`` is a context manager: leaving the ``with`` block, an exception, or
the death of the Python process (``PR_SET_PDEATHSIG`` on Linux) stops every process
it started. ``detach=True`` (``rolloutpool localcluster up``) leaves them running and
records their process groups in ``<dir>/pids.json`` so ``down`` can stop them later.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

import yaml

from rolloutpool.dev.localcluster.build import Binaries, ensure_binaries
from rolloutpool.dev.localcluster.certs import PkiPaths, write_pki
from rolloutpool.dev.net import free_port
from rolloutpool.dev.processes import start_group, stop_group

__all__ = ["LocalCluster", "stop_recorded"]

Log = Callable[[str], None]


def stop_recorded(directory: Path) -> list[str]:
    """Stop the processes a detached cluster recorded in ``pids.json``; returns their names."""
    record = directory / "pids.json"
    if not record.exists():
        return []
    pids: dict[str, int] = json.loads(record.read_text())
    for pid in reversed(list(pids.values())):
        stop_group(pid)
    record.unlink()
    return list(pids)


class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager on 127.0.0.1 with generated PKI."""

    def __init__(
        self,
        directory: Path,
        *,
        binaries: Binaries | None = None,
        detach: bool = False,
        log: Log = print,
        ready_timeout: float = 120.0,
        kubelet: bool = False,
        pod_subnet: str | None = None,
        kubelet_images: Mapping[str, Path] | None = None,
    ) -> None:
        self.directory = directory
        self.with_kubelet = kubelet  # run `rolloutpool localcluster kubelet` (the process kubelet) as a child
        self.pod_subnet = pod_subnet  # the kubelet's loopback /24 for pod IPs (default 127.0.0.0/24)
        self.kubelet_images = dict(kubelet_images or {})  # image reference -> build folder the kubelet runs it from
        self.detach = detach
        self.log = log
        self.ready_timeout = ready_timeout
        self._binaries = binaries
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.api_port = 0
        self.etcd_port = 0
        self.pki: PkiPaths | None = None

    # -- public -------------------------------------------------------------------

    @property
    def binaries(self) -> Binaries:
        """The binaries this cluster runs (built on first use)."""
        if self._binaries is None:
            self._binaries = ensure_binaries(log=self.log)
        return self._binaries

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (client cert in ``system:masters``)."""
        return self.directory / "kubeconfig"

    @property
    def server(self) -> str:
        """HTTPS URL of the API server."""
        return f"https://127.0.0.1:{self.api_port}"

    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm subprocesses: KUBECONFIG and PATH with the binaries."""
        bin_dir = str(self.binaries.kubectl.parent)
        return dict(
            os.environ,
            KUBECONFIG=str(self.kubeconfig),
            PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        )

    def kubectl(
        self, *args: str, check: bool = True, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; with ``check`` a failure raises with kubectl's stderr."""
        result = subprocess.run(
            [str(self.binaries.kubectl), *args],
            env=self.env(),
            input=input_text,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def start(self) -> LocalCluster:
        """Start every component and wait until the API server is ready."""
        bins = self.binaries
        if self.directory.exists() and (self.directory / "pids.json").exists():
            stop_recorded(self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
        (self.directory / "logs").mkdir()
        self.pki = write_pki(self.directory / "pki")
        self.etcd_port, peer_port, self.api_port, cm_port = (free_port() for _ in range(4))
        try:
            self._start_etcd(bins, peer_port)
            self._start_apiserver(bins)
            self._write_kubeconfig()
            self._wait_ready()
            self._start_controller_manager(bins, cm_port)
            self._wait_default_serviceaccount()
            if self.with_kubelet:
                self._start_kubelet()
        except BaseException:
            self.stop()
            raise
        if self.detach:
            pids = {name: proc.pid for name, proc in self._procs.items()}
            (self.directory / "pids.json").write_text(json.dumps(pids))
        self.log(f"Started local control plane server={self.server} kubeconfig={self.kubeconfig}")
        return self

    def stop(self) -> None:
        """Stop every component, newest first; safe to call twice."""
        for name in reversed(list(self._procs)):
            stop_group(self._procs[name].pid, popen=self._procs[name])
        self._procs.clear()
        with contextlib.suppress(FileNotFoundError):
            (self.directory / "pids.json").unlink()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- components ---------------------------------------------------------------

    def _require_pki(self) -> PkiPaths:
        if self.pki is None:
            raise RuntimeError("the cluster has not been started")
        return self.pki

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.directory / "logs" / f"{name}.log"
        self._procs[name] = start_group(argv, log=log, die_with_parent=None if self.detach else signal.SIGTERM)

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                tail = (self.directory / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with code {proc.returncode}; log tail:\n{tail}")

    def _start_etcd(self, bins: Binaries, peer_port: int) -> None:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                str(bins.etcd),
                "--name=default",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self, bins: Binaries) -> None:
        pki = self._require_pki()
        self._spawn(
            "kube-apiserver",
            [
                str(bins.kube_apiserver),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--advertise-address=127.0.0.1",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-account-issuer=https://127.0.0.1:{self.api_port}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--v=1",
            ],
        )

    def _start_controller_manager(self, bins: Binaries, port: int) -> None:
        pki = self._require_pki()
        self._spawn(
            "kube-controller-manager",
            [
                str(bins.kube_controller_manager),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                f"--root-ca-file={pki.ca_cert}",
                f"--service-account-private-key-file={pki.sa_key}",
                "--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-route,-service",
                "--concurrent-gc-syncs=5",
                "--v=1",
            ],
        )

    def _start_kubelet(self) -> None:
        """The process kubelet as a child (pods in ``<dir>/kubelet``); waits until its Node is Ready."""
        from rolloutpool.dev.kubelet.kubelet import default_executables  # noqa: PLC0415 - only with kubelet=True

        command = default_executables().get("rolloutpool", "rolloutpool")
        subnet = [f"--pod-subnet={self.pod_subnet}"] if self.pod_subnet else []
        images = [f"--image={ref}={path}" for ref, path in self.kubelet_images.items()]
        self._spawn("kubelet", [command, "localcluster", "kubelet", f"--dir={self.directory}", *subnet, *images])
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            self._check_alive()
            ready = self.kubectl("get", "nodes", "-o", "name", check=False).stdout.strip()
            if ready:
                return
            time.sleep(0.3)
        raise TimeoutError("the process kubelet did not register its Node in time")

    def _write_kubeconfig(self) -> None:
        pki = self._require_pki()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.server, "certificate-authority": str(pki.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate": str(pki.admin_cert),
                        "client-key": str(pki.admin_key),
                    },
                }
            ],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
            "current-context": "local",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)

    def _wait_ready(self) -> None:
        pki = self._require_pki()
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        deadline = time.monotonic() + self.ready_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=5) as resp:  # noqa: S310
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(0.5)
        raise TimeoutError(f"kube-apiserver not ready after {self.ready_timeout:.0f}s: {last}")

    def _wait_default_serviceaccount(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0:
                return
            time.sleep(0.5)
        raise TimeoutError("the controller-manager did not create the default ServiceAccount in time")
