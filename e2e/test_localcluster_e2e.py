"""The local control plane starts, serves RBAC-authorized requests and leaves no process behind."""

from __future__ import annotations

import os

from rolloutpool.dev.localcluster.cluster import LocalCluster


def _processes_mentioning(marker: str) -> list[int]:
    """PIDs whose command line mentions ``marker`` (our cluster folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_start_serve_and_stop_cleanly(tmp_path) -> None:
    cluster = LocalCluster(tmp_path / "c", log=lambda _m: None)
    with cluster:
        pids = [p.pid for p in cluster._procs.values()]
        assert len(pids) == 3
        assert set(pids) <= set(_processes_mentioning(str(tmp_path)))  # the probe below can see them
        assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
        # the release is stamped into the binaries (charts with kubeVersion constraints rely on it)
        assert '"gitVersion": "v1.35.4"' in cluster.kubectl("get", "--raw", "/version").stdout
        # RBAC is on: an unprivileged identity is refused
        denied = cluster.kubectl(
            "auth", "can-i", "list", "pods", "--as=system:serviceaccount:default:nobody", check=False
        )
        assert denied.stdout.strip() == "no"
        assert cluster.kubectl("auth", "can-i", "list", "pods").stdout.strip() == "yes"
    assert _processes_mentioning(str(tmp_path)) == []


def test_failure_during_start_stops_everything(tmp_path) -> None:
    cluster = LocalCluster(tmp_path / "c", log=lambda _m: None, ready_timeout=0.01)
    try:
        cluster.start()
    except TimeoutError:
        pass
    else:  # pragma: no cover - the API server cannot be ready in 10 ms
        cluster.stop()
        raise AssertionError("start() should have timed out")
    assert cluster._procs == {}
    assert _processes_mentioning(str(tmp_path)) == []
