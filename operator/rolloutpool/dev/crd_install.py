"""Installing the RolloutPool CRD into a local cluster (the demo and the e2e fixtures)."""

from __future__ import annotations

from rolloutpool.api.crd import CRD_NAME, render_crd
from rolloutpool.dev.localcluster.cluster import LocalCluster
from rolloutpool.dev.wait import wait_until

__all__ = ["install_crd"]


def install_crd(cluster: LocalCluster) -> None:
    """Apply the generated CRD and wait until the API server serves it.

    ``kubectl wait`` fails at once, rather than waiting, when it reads the CRD before the API server has written any
    condition (``.status.conditions accessor error: <nil>``), so the wait is retried until it answers.
    """
    cluster.kubectl("apply", "-f", "-", input_text=render_crd())

    def established() -> bool:
        waited = cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s", check=False)
        return waited.returncode == 0

    wait_until(established, what=f"crd/{CRD_NAME} Established", timeout=90.0, interval=0.5)
