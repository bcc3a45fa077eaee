"""``rolloutpool demo``: the local control plane with the CRD and the example pools applied.

Later issues grow this into the full stack (operator, router, load, quarantine). For
now it proves the foundation end to end: a real API server accepts the generated CRD
and the example manifests, and ``kubectl get rp`` shows the printer columns.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from rich.console import Console

from rolloutpool.api.crd import CRD_NAME, render_crd
from rolloutpool.localcluster.cluster import LocalCluster

__all__ = ["examples_dir", "install_crd", "run_demo"]


def examples_dir() -> Path:
    """The checkout's ``examples/`` folder (the demo runs from a checkout)."""
    path = Path(__file__).resolve().parents[2] / "examples"
    if not path.is_dir():
        raise FileNotFoundError(f"examples folder not found at {path}; run the demo from a RolloutPool checkout")
    return path


def install_crd(cluster: LocalCluster) -> None:
    """Apply the generated CRD and wait until the API server serves it."""
    cluster.kubectl("apply", "-f", "-", input_text=render_crd())
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")


def run_demo(*, directory: Path, once: bool, console: Console) -> None:
    """Start the cluster, apply CRD and examples, show them; wait for Ctrl-C unless ``once``."""
    stop = threading.Event()
    # explicit handlers: a demo started in the background of a script inherits an
    # ignored SIGINT, and Ctrl-C or `kill` must still stop it cleanly
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with LocalCluster(directory, log=console.log) as cluster:
        install_crd(cluster)
        console.log(f"Installed CRD {CRD_NAME}")
        for manifest in sorted(examples_dir().glob("*-pool.yaml")):
            out = cluster.kubectl("apply", "-f", str(manifest))
            console.log(out.stdout.strip())
        console.print(cluster.kubectl("get", "rp", "-o", "wide").stdout)
        console.print(f"logs: {directory / 'logs'}")
        if once:
            return
        console.print(f"KUBECONFIG={cluster.kubeconfig}  PATH={cluster.binaries.kubectl.parent}:$PATH")
        console.print("The control plane keeps running; press Ctrl-C to stop it and clean up.")
        while not stop.wait(0.5):
            pass
    console.log("Stopped the control plane; no processes left behind.")
