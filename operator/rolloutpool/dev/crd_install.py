"""Installing the RolloutPool CRD into a local cluster (the demo and the e2e fixtures)."""

from __future__ import annotations

from rolloutpool.api.crd import CRD_NAME, render_crd
from rolloutpool.dev.localcluster.cluster import LocalCluster

__all__ = ["install_crd"]


def install_crd(cluster: LocalCluster) -> None:
    """Apply the generated CRD and wait until the API server serves it."""
    cluster.kubectl("apply", "-f", "-", input_text=render_crd())
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
