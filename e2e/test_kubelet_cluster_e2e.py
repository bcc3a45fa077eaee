"""`LocalCluster(kubelet=True)` runs the process kubelet as a child; stopping the cluster stops every pod."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import yaml

from rolloutpool.dev.localcluster.cluster import LocalCluster

_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "engine", "namespace": "default"},
    "spec": {
        "containers": [
            {
                "name": "engine",
                "image": "ghcr.io/rolloutpool/rolloutpool:0.1.0",
                "command": [
                    "rolloutpool",
                    "engine-sim",
                    "--host=$(POD_IP)",
                    "--kv-capacity-tokens=4096",
                    "--max-model-len=1024",
                ],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1},
            }
        ]
    },
}


def _pids_with_cwd(root: Path) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/cwd").startswith(str(root)):
                    found.append(int(entry))
    return found


def test_cluster_with_kubelet_runs_pods_and_stops_them(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    with LocalCluster(directory, log=lambda _m: None, kubelet=True) as cluster:
        assert "kubelet" in cluster._procs
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(_POD))
        waited = cluster.kubectl("wait", "--for=condition=Ready", "pod/engine", "--timeout=90s", check=False)
        assert waited.returncode == 0, waited.stderr
        pod = json.loads(cluster.kubectl("get", "pod", "engine", "-o", "json").stdout)
        assert pod["status"]["podIP"].startswith("127.0.0.")
        assert len(_pids_with_cwd(directory / "kubelet" / "pods")) == 1
    deadline = time.monotonic() + 10
    while _pids_with_cwd(directory) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _pids_with_cwd(directory) == []
